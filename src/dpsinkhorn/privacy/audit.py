"""Statistics and deliberately broken mechanisms of the empirical privacy audit.

The attack itself drives the production path (the Trainer's / the sweep's step, the
config's sampler, solver and sanitiser) and lives in ``train.audit`` (``python -m
dpsinkhorn.train.audit``), since ``privacy`` may not import ``train``. What is here:

* :func:`epsilon_lower_bound`: from the scores of releases made without / with the
  canary, a 95% lower bound on the ε of ANY (ε, δ)-DP mechanism that produced them.
  Thresholds are chosen on the first half of the releases (smoothed point estimates),
  the bound is computed on the second half: with FPR and FNR bounded above by
  Clopper–Pearson at 97.5% each (95% jointly, union bound),
  ε ≥ max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR))
  (the hypothesis-testing characterisation of (ε, δ)-DP; Kairouz et al. 2015,
  Jagielski et al. 2020, Nasr et al. 2021). The bound holds for any statistic.
* :func:`one_step_claim`: the ε the accountant (``privacy.accounting.PrivacyAccountant``)
  claims for ONE un-subsampled (q = 1) Gaussian mechanism with noise multiplier z
  (noise std / L2 sensitivity), at δ. This is the claim of a training step when the
  canary's inclusion in that step's Poisson sample is known to the adversary.
* Broken image sanitisers (subclasses of ``privacy.mechanism.ImageGradientSanitizer``
  that the audit must catch): noise off; per-sample noise ÷ √n (sensitivity of
  per-sample clipping taken as 2Δ); noise ÷ √2 (sensitivity taken as Δ instead of 2Δ:
  the replace-one vs add/remove-one slip).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from dpsinkhorn.privacy.accounting import PrivacyAccountant
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer

#: Joint confidence of every certified bound.
CONFIDENCE = 0.95


class NoiselessSanitizer(ImageGradientSanitizer):
    """BROKEN on purpose (audit only): clips, adds no noise."""

    @property
    def noise_std(self) -> float:
        return 0.0


class NoiseOverRootNSanitizer(ImageGradientSanitizer):
    """BROKEN on purpose (audit only): noise std 2Δσ/√n, as if the sensitivity of
    per-sample clipping were 2Δ instead of 2Δ√n."""

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_scale / math.sqrt(self.n)


class NoiseOverRoot2Sanitizer(ImageGradientSanitizer):
    """BROKEN on purpose (audit only): noise std 2Δσ/√2 = √2·Δσ, as if add/remove-one
    moved the clipped block by Δ√2 (or replace-one's 2Δ were halved): the true noise
    multiplier is σ/√2 while the accountant is told σ."""

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_scale / math.sqrt(2.0)


#: Image sanitiser classes by audit name; "sound" is the one training uses.
IMAGE_MECHANISMS: dict[str, type[ImageGradientSanitizer]] = {
    "sound": ImageGradientSanitizer,
    "noise_off": NoiselessSanitizer,
    "noise_over_sqrt_n": NoiseOverRootNSanitizer,
    "noise_over_sqrt_2": NoiseOverRoot2Sanitizer,
}


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 − alpha) Clopper–Pearson upper bound on a binomial proportion."""
    if trials < 1:
        raise ValueError(f"Clopper–Pearson needs at least one trial, got {trials}")
    if successes >= trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def _bounds(fp: np.ndarray, fn: np.ndarray, n_out: int, n_in: int, alpha: float, delta: float):
    """Certified ε [T] of threshold tests with ``fp`` / ``fn`` errors [T] (vectorised)."""
    fpr = np.where(fp >= n_out, 1.0, beta.ppf(1 - alpha, fp + 1, np.maximum(n_out - fp, 1)))
    fnr = np.where(fn >= n_in, 1.0, beta.ppf(1 - alpha, fn + 1, np.maximum(n_in - fn, 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.maximum(np.log((1 - delta - fnr) / fpr), np.log((1 - delta - fpr) / fnr))
    return np.nan_to_num(np.maximum(eps, 0.0), nan=0.0)


def _errors(out_sorted: np.ndarray, in_sorted: np.ndarray, thresholds: np.ndarray):
    """False positives / negatives [T] of the rule "canary in iff score ≥ t"."""
    fp = len(out_sorted) - np.searchsorted(out_sorted, thresholds, side="left")
    fn = np.searchsorted(in_sorted, thresholds, side="left")
    return fp, fn


def epsilon_lower_bound(
    scores_out: np.ndarray,
    scores_in: np.ndarray,
    delta: float,
    confidence: float = CONFIDENCE,
    candidates: int = 4001,
) -> float:
    """ε lower bound (at ``confidence``) from test scores [R] of releases without / with
    the canary (higher = "canary in"). Threshold selection: among ``candidates``
    quantiles of the first halves' scores, the one whose Clopper–Pearson bound on the
    first halves is largest (a conservative criterion: smoothed point estimates overfit
    the far tail). Bound: Clopper–Pearson on the second halves, which the choice never
    saw, so the 95% holds for the chosen threshold."""
    if len(scores_out) < 4 or len(scores_in) < 4:
        raise ValueError("the audit needs at least 4 releases per dataset")
    half_out, half_in = len(scores_out) // 2, len(scores_in) // 2
    alpha = (1.0 - confidence) / 2  # FPR and FNR bounds share the error probability
    choose_out = np.sort(scores_out[:half_out])
    choose_in = np.sort(scores_in[:half_in])
    grid = np.quantile(np.concatenate([choose_out, choose_in]), np.linspace(0, 1, candidates))
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
