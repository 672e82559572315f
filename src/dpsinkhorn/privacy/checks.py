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
