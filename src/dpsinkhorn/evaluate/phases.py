"""Which code computed an evaluation phase (``fid`` or a classifier's name; torch-free):
``dpsinkhorn evaluate`` resumes a saved phase only when its code (:data:`PHASE_MODULES`)
is this code."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn import fileio

#: The modules of :mod:`dpsinkhorn.evaluate` whose code computes each phase's records (FID;
#: every classifier): a phase saved by other code is computed again, not resumed.
PHASE_MODULES = {
    "fid": ("sample", "inception", "fid"),
    "classifier": ("sample", "classifiers", "classify"),
}
#: The commit a job runs at, when its caller knows it (a copied tree may have no .git).
COMMIT_ENV = "DPSINKHORN_COMMIT"


def phase_code_sha256(phase: str) -> str:
    """SHA-256 of the source files that compute ``phase`` (``fid``, or a classifier's name):
    :data:`PHASE_MODULES`, each as its name, a NUL and its bytes."""
    here = Path(__file__).parent
    modules = PHASE_MODULES["fid" if phase == "fid" else "classifier"]
    return fileio.sha256_of_bytes(
        b"".join(m.encode() + b"\0" + (here / f"{m}.py").read_bytes() for m in modules)
    )


def resumable(saved: Mapping) -> dict[str, dict]:
    """The phases of a progress file's ``done`` that this code may reuse: each
    ``{"records", "code_sha256", "commit"}`` whose code is :func:`phase_code_sha256`'s (an
    older format's bare list of records has no code, so it is not reusable)."""
    return {
        phase: dict(entry)
        for phase, entry in saved.items()
        if isinstance(entry, Mapping) and entry.get("code_sha256") == phase_code_sha256(phase)
    }
