"""Shared pytest fixtures: real data and weights from ``../shared`` (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# ../shared next to the project root (read-only: copy before modifying anything from it)
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _shared_path(env_var: str, default: Path) -> Path:
    path = Path(os.environ.get(env_var, default))
    if not path.exists():
        pytest.skip(f"{path} not found (set {env_var})")
    return path


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    """Folder holding MNIST/raw/*.gz and FashionMNIST/raw/*.gz."""
    return _shared_path("DPSINKHORN_DATA_MIRROR", SHARED / "data")


@pytest.fixture(scope="session")
def fid_weights() -> Path:
    """pytorch-fid's Inception weights file."""
    return _shared_path(
        "DPSINKHORN_FID_WEIGHTS", SHARED / "weights" / "pt_inception-2015-12-05-6726825d.pth"
    )


@pytest.fixture(scope="session")
def prepared_mnist(tmp_path_factory: pytest.TempPathFactory, data_mirror: Path) -> Path:
    """Data root with mnist prepared once per session (``<root>/mnist/*.npz``); needs only
    MNIST in the mirror (the GPU tests carry no more)."""
    from dpsinkhorn.data import datasets as data

    root = tmp_path_factory.mktemp("data")
    data.prepare("mnist", root, mirror=data_mirror)
    return root


@pytest.fixture(scope="session")
def prepared_data(prepared_mnist: Path, data_mirror: Path) -> Path:
    """Data root with mnist and fmnist prepared once per session (``<root>/<name>/*.npz``)."""
    from dpsinkhorn.data import datasets as data

    data.prepare("fmnist", prepared_mnist, mirror=data_mirror)
    return prepared_mnist


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: live SLURM cluster test (make test-slurm; skipped without it)"
    )
