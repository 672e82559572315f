"""Shared pytest fixtures: real data and weights from ``../shared`` (a test that needs a
missing one is skipped, naming the file; under ``CI=true`` it fails instead), and the
command line run in-process."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import require_shared, shared_path

from dpsinkhorn import cli


def _shared_path(env_var: str) -> Path:
    return require_shared(shared_path(env_var), f"set {env_var}")


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    """Folder holding MNIST/raw/*.gz and FashionMNIST/raw/*.gz."""
    return _shared_path("DPSINKHORN_DATA_MIRROR")


@pytest.fixture(scope="session")
def fid_weights() -> Path:
    """pytorch-fid's Inception weights file."""
    return _shared_path("DPSINKHORN_FID_WEIGHTS")


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


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    """``dpsinkhorn ARGV`` in-process through ``cli.main``; returns the exit code.

    Command modules that do not exist (yet) are left out of the parser, so one command's
    tests run while another's module is being moved; with all of them present this is
    exactly the real CLI.
    """
    present = [m for m in cli.COMMAND_MODULES if importlib.util.find_spec(f"dpsinkhorn.{m}")]
    monkeypatch.setattr(cli, "COMMAND_MODULES", present)
    return cli.main


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: live SLURM cluster test (make test-slurm; skipped without it)"
    )


#: Unit tests that took a minute or more on the 2-core machine (s, measured): marked ``slow``,
#: so ``make test-fast`` skips them (every parametrisation); ``make test`` runs them.
SLOW_TESTS: dict[str, int] = {}

#: Per-test limits (s) above pyproject.toml's ``timeout`` (900 s) for the test that runs a
#: whole workflow in its setup: the first selected test of each of these modules (its
#: module-scoped fixture runs the workflow; the module's later tests read that run and keep
#: the 900 s), and single tests that are a whole run each. About three times the time each
#: took on the 2-core machine (docs/TESTING.md), so that only a hang trips them.
TIMEOUTS_FIRST_OF_MODULE = {
    "test_workflow.py": 2700,
    "test_owndata_workflow.py": 1500,
    "test_slurm.py": 1800,  # its fixture stops the workflow itself after 1,500 s
}
TIMEOUTS_OF_TEST = {
    "test_gpu_window.py::test_window_split_over_interrupted_calls_equals_one_call": 1800,
}


def _name(item: pytest.Item) -> str:
    """``<file>::<test function>`` of a collected test (all parametrisations alike)."""
    return f"{item.path.name}::{getattr(item, 'originalname', item.name)}"


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items):
    """Marks the tests of SLOW_TESTS ``slow``."""
    for item in items:
        if _name(item) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """Gives the tests named in TIMEOUTS_* their limit (an explicit ``timeout`` mark wins);
    after -m/-k: the first test of a module is the first that will run."""
    seen = set()
    for item in session.items:
        module = item.path.name
        limit = TIMEOUTS_OF_TEST.get(_name(item))
        if module in TIMEOUTS_FIRST_OF_MODULE and module not in seen:
            seen.add(module)
            limit = TIMEOUTS_FIRST_OF_MODULE[module]
        if limit and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))
