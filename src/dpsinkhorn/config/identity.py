"""What identifies an experiment: the settings that define its generator, and those that
decide whether two experiments can train in one sweep. Imports nothing of the package."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """Return ``base`` updated with ``override``; nested mappings are merged, not replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


#: Experiment keys that do not change what training computes (bookkeeping only).
NON_SEMANTIC_KEYS = tuple(
    "checkpoint_every log_every table1_row rows name keep_private_workspace log_private_loss "
    "prepared_folder".split()
)

#: Settings left out of :func:`experiment_spec_of` at these values, so an experiment that
#: keeps them has the spec (Snakemake parameter, checkpoint hash, training record) of one
#: that does not name them.
IMPLICIT_DEFAULTS = {
    "perturbation": "image",
    "cost": "mixed",
    "epsilon_convention": "sound",
    "conditional": True,
    "rff_features": 10000,
    "rff_bandwidth": 105.0,
    "lr_decay": 1.0,
}


def experiment_spec_of(spec: Mapping) -> str:
    """Canonical JSON of a resolved experiment without its bookkeeping keys and without
    :data:`IMPLICIT_DEFAULTS` keys at their default."""
    kept = {
        k: v
        for k, v in spec.items()
        if k not in NON_SEMANTIC_KEYS and not (k in IMPLICIT_DEFAULTS and v == IMPLICIT_DEFAULTS[k])
    }
    return json.dumps(kept, sort_keys=True)


#: Settings every run of one sweep must share: they fix the data, the generator's shapes,
#: the real batch's shape and the Sinkhorn problem (ε, schedule, cost family).
SWEEP_SHARED_KEYS = tuple(
    "dataset generator latent_dim embed_dim channels batch_size alpha_c conditional "
    "entropy_reg sinkhorn_scaling cost".split()
)


def sweep_key(spec: Mapping) -> tuple:
    """What must be equal for two experiments to train in one sweep."""
    return tuple(json.dumps(spec.get(key, IMPLICIT_DEFAULTS.get(key))) for key in SWEEP_SHARED_KEYS)
