"""Publishing: the one door every published byte goes through (``dpsinkhorn release``,
``release-manifest``, ``api.release``); docs/PRIVACY.md says what is proven how."""

from dpsinkhorn.publish.decision import (
    LEDGER,
    MANIFEST,
    MANIFEST_VERSION,
    WORKSPACE,
    Folder,
    Published,
    check_out,
    decide,
    experiment_folder,
    manifest,
    release,
    run_folders,
    write_manifest,
)
from dpsinkhorn.publish.proofs import (
    ACCEPT_FLAG,
    NO_GUARANTEE,
    SAMPLE_TOLERANCE,
    SCORE_KEYS,
    check_ledger,
)

__all__ = [
    "ACCEPT_FLAG",
    "LEDGER",
    "MANIFEST",
    "MANIFEST_VERSION",
    "NO_GUARANTEE",
    "SAMPLE_TOLERANCE",
    "SCORE_KEYS",
    "WORKSPACE",
    "Folder",
    "Published",
    "check_ledger",
    "check_out",
    "decide",
    "experiment_folder",
    "manifest",
    "release",
    "run_folders",
    "write_manifest",
]
