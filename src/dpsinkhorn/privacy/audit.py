"""Statistics and deliberately broken mechanisms of the empirical privacy audit.

The attack drives the production step and lives in ``train.audit``. Here: the certified
lower bound on ε (:func:`epsilon_lower_bound`), the accountant's claim for one step
(:func:`one_step_claim`) and the broken sanitisers the audit must catch
(:data:`IMAGE_MECHANISMS`). The method: docs/AUDIT.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import beta, chi2, norm

from dpsinkhorn.privacy.accounting import PrivacyAccountant
from dpsinkhorn.privacy.mechanism import (
    ImageGradientSanitizer,
    ParameterGradientSanitizer,
    standard_normal,
)

#: Joint confidence of every certified bound.
CONFIDENCE = 0.95
#: Candidate thresholds of the bound: quantiles of the first halves' scores.
THRESHOLDS = 4001


#: How much noise each broken variant really adds, as a fraction of the sound noise std
#: 2Δσ (used only to compute the audit's power against it, ``train.audit``).
TRUE_NOISE_FRACTION = {
    "sound": 1.0,
    "noise_off": 0.0,
    "noise_over_sqrt_2": 1 / math.sqrt(2.0),
    "sqrt_2_in_call": 1 / math.sqrt(2.0),
    "noise_over_sqrt_n": None,  # 1/√n: n is the run's batch size
}


class _NoiseOff:
    """BROKEN on purpose: clips, adds no noise (declares it)."""

    noise_std = 0.0


class _OverRootN:
    """BROKEN on purpose: noise std 2Δσ/√n, as if the sensitivity of per-sample clipping
    were 2Δ instead of 2Δ√n (declares it). Needs ``n``, the batch size."""

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_scale / math.sqrt(self.n)


class _OverRoot2:
    """BROKEN on purpose: noise std 2Δσ/√2, as if add/remove-one moved the clipped block by
    Δ√2 (declares it): the true noise multiplier is σ/√2 while the accountant is told σ."""

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_scale / math.sqrt(2.0)


class _Root2InCall:
    """BROKEN on purpose: ``noise_std`` stays 2Δσ, but ``__call__`` adds 2Δσ/√2."""

    def _noised(self, block: torch.Tensor) -> torch.Tensor:
        return block + self.noise_std / math.sqrt(2.0) * standard_normal(block, self.generator)


_MIXINS = {
    "noise_off": _NoiseOff,
    "noise_over_sqrt_n": _OverRootN,
    "noise_over_sqrt_2": _OverRoot2,
    "sqrt_2_in_call": _Root2InCall,
}


def _variants(base: type, prefix: str) -> dict[str, type]:
    """``base`` ("sound") and its broken variants (each mixin first in the MRO), by name."""
    broken = {
        k: type(f"{prefix}{m.__name__[1:]}", (m, base), {"__doc__": m.__doc__})
        for k, m in _MIXINS.items()
    }
    return {"sound": base, **broken}


#: Image sanitiser classes by audit name; "sound" is the one training uses.
IMAGE_MECHANISMS: dict[str, type[ImageGradientSanitizer]] = _variants(
    ImageGradientSanitizer, "Image"
)
#: Parameter sanitiser classes by audit name. ``noise_over_sqrt_n`` needs ``n`` set
#: (``train.audit`` subclasses it).
PARAMETER_MECHANISMS: dict[str, type[ParameterGradientSanitizer]] = _variants(
    ParameterGradientSanitizer, "Parameter"
)


def clopper_pearson_upper(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided (1 − alpha) Clopper–Pearson upper bounds on binomial proportions."""
    successes = np.asarray(successes)
    upper = beta.ppf(1.0 - alpha, successes + 1, np.maximum(trials - successes, 1))
    return np.where(successes >= trials, 1.0, upper)


def _bounds(fp: np.ndarray, fn: np.ndarray, n_out: int, n_in: int, alpha: float, delta: float):
    """Certified ε [T] of threshold tests with ``fp`` / ``fn`` errors [T] (vectorised)."""
    fpr, fnr = clopper_pearson_upper(fp, n_out, alpha), clopper_pearson_upper(fn, n_in, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.maximum(np.log((1 - delta - fnr) / fpr), np.log((1 - delta - fpr) / fnr))
    return np.nan_to_num(np.maximum(eps, 0.0), nan=0.0)


def _errors(out_sorted: np.ndarray, in_sorted: np.ndarray, thresholds: np.ndarray):
    """False positives / negatives [T] of the rule "canary in iff score ≥ t"."""
    fp = len(out_sorted) - np.searchsorted(out_sorted, thresholds, side="left")
    fn = np.searchsorted(in_sorted, thresholds, side="left")
    return fp, fn


def epsilon_lower_bound(scores_out: np.ndarray, scores_in: np.ndarray, delta: float) -> float:
    """ε lower bound (at :data:`CONFIDENCE`) of any (ε, δ)-DP mechanism that produced the
    test scores [R] of releases without / with the canary (higher = "canary in"): the
    threshold (of :data:`THRESHOLDS` quantiles) with the largest Clopper–Pearson bound on the
    first halves, bounded on the second halves, which the choice never saw (docs/AUDIT.md)."""
    if len(scores_out) < 4 or len(scores_in) < 4:
        raise ValueError("the audit needs at least 4 releases per dataset")
    half_out, half_in = len(scores_out) // 2, len(scores_in) // 2
    alpha = (1.0 - CONFIDENCE) / 2  # FPR and FNR bounds share the error probability
    choose_out = np.sort(scores_out[:half_out])
    choose_in = np.sort(scores_in[:half_in])
    grid = np.quantile(np.concatenate([choose_out, choose_in]), np.linspace(0, 1, THRESHOLDS))
    grid = np.append(grid, 0.5 * (choose_out[-1] + choose_in[0]))  # separable case
    fp, fn = _errors(choose_out, choose_in, grid)
    best = grid[int(np.argmax(_bounds(fp, fn, half_out, half_in, alpha, delta)))]
    test_out, test_in = np.sort(scores_out[half_out:]), np.sort(scores_in[half_in:])
    fp, fn = _errors(test_out, test_in, np.array([best]))
    return float(_bounds(fp, fn, len(test_out), len(test_in), alpha, delta)[0])


def one_step_claim(noise_multiplier: float, delta: float, accountant: str = "rdp") -> float:
    """ε the accountant claims for one Gaussian mechanism without subsampling (q = 1)
    with noise multiplier z = noise std / L2 sensitivity, at ``delta``."""
    ledger = PrivacyAccountant(1.0, noise_multiplier, delta, accountant)
    ledger.step()
    return ledger.epsilon()


def noise_check(values: torch.Tensor, distances: torch.Tensor, noise_std: float, level: float):
    """Does the real sanitiser's noise have mean 0 and variance noise_std² per coordinate?
    ``values`` [V]: release − noise-free part, every coordinate of every check release;
    two-sided χ² on the variance and z on the mean, at ``level`` (noise_std 0: all ≈ 0)."""
    df = values.numel()
    measured = float(values.pow(2).mean().sqrt())
    if noise_std == 0:
        ok = measured <= 1e-6 * float(distances.max())
    else:
        ratio = float(values.pow(2).sum()) / noise_std**2
        lo, hi = chi2.ppf(level / 2, df), chi2.isf(level / 2, df)
        z_mean = float(values.mean()) / (noise_std / math.sqrt(df))
        ok = lo <= ratio <= hi and abs(z_mean) < 5.0
    return {"noise_std_measured": measured, "noise_check_passed": bool(ok), "noise_check_df": df}


def audit_power(
    true_std: float,
    declared_std: float,
    claim: float,
    distance: float,
    df: int,
    check_level: float,
    releases: int,
    delta: float,
    sims: int = 4000,
) -> dict:
    """The audit's power against a mechanism whose noise std is really ``true_std`` while it
    declares ``declared_std`` and claims ε = ``claim`` for one step:

    * of the noise check: a two-sided χ² test at ``check_level`` on ``df`` noise values
      (exact: sum of squares / declared² is (true/declared)² · χ²_df);
    * of the bound: releases ∓d/2 + N(0, true_std²) (d = ``distance``) at the threshold
      maximising the bound; P(certified ε > claim) from ``sims`` seeded binomial draws of
      the errors on R/2 tested releases per dataset;
    * of either (independent draws).
    """
    check = 0.0
    if declared_std > 0:
        r = (true_std / declared_std) ** 2
        lo, hi = chi2.ppf(check_level / 2, df), chi2.isf(check_level / 2, df)
        check = float(chi2.cdf(lo / r, df) + chi2.sf(hi / r, df)) if r > 0 else 1.0
    half = releases - releases // 2
    alpha = (1.0 - CONFIDENCE) / 2
    if true_std == 0:
        fpr = fnr = 0.0
    else:
        mu = distance / true_std
        grid = np.linspace(-mu / 2 - 8, mu / 2 + 8, 4001)
        rates = norm.sf(grid + mu / 2), norm.cdf(grid - mu / 2)
        expected = _bounds(
            np.round(rates[0] * half), np.round(rates[1] * half), half, half, alpha, delta
        )
        best = int(np.argmax(expected))
        fpr, fnr = float(rates[0][best]), float(rates[1][best])
    rng = np.random.default_rng(0)
    fp, fn = rng.binomial(half, fpr, sims), rng.binomial(half, fnr, sims)
    bound = float(np.mean(_bounds(fp, fn, half, half, alpha, delta) > claim))
    return {
        "power_noise_check": check,
        "power_bound": bound,
        "power": 1 - (1 - check) * (1 - bound),
    }
