"""Publishing: the one door every published byte goes through (``dpsinkhorn release``,
``release-manifest``, ``api.release``); docs/PRIVACY.md says what is proven how."""

# ruff: noqa: F401
from dpsinkhorn.publish.decision import (
    MANIFEST,
    MANIFEST_VERSION,
    decide,
    experiment_folder,
    manifest,
    release,
    run_folders,
    write_manifest,
)
from dpsinkhorn.publish.proofs import ACCEPT_FLAG, SCORE_KEYS, check_ledger
