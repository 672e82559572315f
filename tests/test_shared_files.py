"""A test that needs a missing ``../shared`` file fails under ``CI=true`` and is skipped
elsewhere, naming the file either way (conftest's ``data_mirror`` / ``fid_weights``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def run_needing_the_mirror(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    """pytest on one test that takes ``data_mirror``, which points at a missing folder."""
    (tmp_path / "test_needs_mirror.py").write_text(
        "def test_uses_the_mirror(data_mirror):\n    assert data_mirror.is_dir()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(
        DPSINKHORN_DATA_MIRROR=str(tmp_path / "no-such-shared" / "data"),
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
    )
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        # conftest.py loaded as a plugin: its fixtures, without this folder's other tests
        [sys.executable, "-m", "pytest", "-p", "conftest", "-rs", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_shared_file_fails_in_ci(tmp_path):
    result = run_needing_the_mirror(tmp_path, "true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout
    assert f"CI=true and a shared file is missing: {tmp_path}/no-such-shared/data not found" in (
        result.stdout
    )


@pytest.mark.parametrize("ci", [None, "false"])
def test_missing_shared_file_is_skipped_by_name_outside_ci(tmp_path, ci):
    result = run_needing_the_mirror(tmp_path, ci)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert f"{tmp_path}/no-such-shared/data not found (set DPSINKHORN_DATA_MIRROR)" in (
        result.stdout
    )
