"""Input checks shared by the mechanism and the accountant (ValueError naming the input)."""

from __future__ import annotations

import math

import numpy as np


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def check_count(name: str, value: int, minimum: int = 0) -> None:
    """``value`` must be an integer >= ``minimum`` (steps, batch size)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_rate(q: float) -> None:
    if not (isinstance(q, int | float) and math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"sampling rate q must be in (0, 1], got {q!r}")


def check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def check_delta_of_records(delta: float, num_records: int, name: str) -> None:
    """``delta`` must be below 1/N (N = ``num_records``, public): an (ε, δ) guarantee with
    δ ≥ 1/N also holds for a release that carries each record in the clear with
    probability δ (on average δ·N ≥ 1 records), so it protects no one. ValueError naming
    the experiment ``name``."""
    if delta * num_records >= 1:
        raise ValueError(
            f"experiment {name}: delta {delta:g} is not below 1/N = 1/{num_records} "
            f"({1 / num_records:.3g}): an (epsilon, delta) guarantee then allows publishing "
            "each record in the clear with probability delta; set delta below 1/N"
        )
