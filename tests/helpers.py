"""Helpers shared by several test files: where the shared data and weights are (a missing
one skips a test, or fails it under ``CI=true``), the workflow config overrides that point
at them, and reading CSV outputs."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared next to the project root (read-only: copy before modifying anything from it)
SHARED = REPO.parent / "shared"
#: environment variable -> (workflow config key, default path under SHARED)
SHARED_PATHS = {
    "DPSINKHORN_DATA_MIRROR": ("data_mirror", SHARED / "data"),
    "DPSINKHORN_FID_WEIGHTS": (
        "fid_weights",
        SHARED / "weights" / "pt_inception-2015-12-05-6726825d.pth",
    ),
}


def shared_path(env_var: str) -> Path:
    """The path ``env_var`` names, else its default under ``../shared`` (may not exist)."""
    return Path(os.environ.get(env_var, SHARED_PATHS[env_var][1]))


def in_ci() -> bool:
    """True when the environment says this is CI (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").lower() == "true"


def require_shared(path: Path, how: str) -> Path:
    """``path`` if it exists; else fail under CI (``CI=true``: a shared file must be there)
    and skip elsewhere, naming the missing file and ``how`` to provide it."""
    if path.exists():
        return path
    message = f"{path} not found ({how})"
    if in_ci():
        pytest.fail(f"CI=true and a shared file is missing: {message}", pytrace=False)
    pytest.skip(message)


def shared_config_overrides() -> list[str]:
    """``key=path`` workflow config overrides (``--config``) for the variables that are set."""
    return [
        f"{key}={os.environ[var]}" for var, (key, _) in SHARED_PATHS.items() if os.environ.get(var)
    ]


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as {column: text}."""
    return read_csv_columns(path)[1]


def read_csv_columns(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(column names in file order, rows as {column: text}) of a CSV file with a header."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


# --------------------------------------------------------------------------- own datasets


def digits_arrays() -> tuple:
    """scikit-learn's ``load_digits`` (1,797 8x8 images, 10 classes) as uint8 [N,8,8] in
    0..255 (the 0..16 values scaled by 255/16, rounded) and int64 labels [N]."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def write_digits_imagefolder(root: Path, split: bool = False) -> Path:
    """The digits as an ImageFolder of grayscale PNGs: ``root/<digit>/<index>.png``; with
    ``split``, every fifth image (index % 5 == 0) under ``root/test/`` and the rest under
    ``root/train/``. Returns ``root``."""
    from PIL import Image

    images, labels = digits_arrays()
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        base = root / ("test" if i % 5 == 0 else "train") if split else root
        folder = base / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")
    return root


def write_digits_npz(path: Path) -> Path:
    """The digits as an ``.npz`` with ``images`` uint8 [1797,8,8] and ``labels`` int64."""
    import numpy as np

    images, labels = digits_arrays()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=images, labels=labels)
    return path


def without_log_hash(record: dict) -> dict:
    """A privacy record less ``train_log_sha256``: the train log it hashes holds wall-clock
    columns (steps/s, elapsed seconds), so two runs of identical steps differ there only."""
    return {k: v for k, v in record.items() if k != "train_log_sha256"}


def listed_outputs(line: str) -> list[str]:
    """The output files of a dry run's ``output:`` line (what follows ``output: ``), less the
    flag Snakemake shows after a flagged one: ``generator.pt (update)`` -> ``generator.pt``."""
    return [re.sub(r" \(\w+\)$", "", f) for f in line.split(", ")]
