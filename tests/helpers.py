"""Helpers shared by several test files: where the shared data and weights are (a missing
one skips a test, or fails it under ``CI=true``), the workflow config overrides that point
at them, and reading CSV outputs."""

from __future__ import annotations

import csv
import os
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
