"""Empirical privacy audit of one sanitised DP-Sinkhorn step (issue 14).

An adversary who knows everything but whether a canary record is in the data:

* Mechanism audited: the real step's query and sanitiser. The real batch Y is drawn by
  ``privacy.sampler.PoissonSampler`` at rate q = 1 (every record in; the strongest setting for an
  audit), G = ∇_X S(X, Y) comes from ``loss.semi_debiased_sinkhorn_with_grad`` (L2 cost),
  and the release is the noised block G[0:n] of the sanitiser that
  ``privacy.factory.make_private`` builds from an experiment's settings (as training
  does), with the claim read from the accountant it builds.
* Adjacency: add/remove one record. D = {y0}, D' = D ∪ {canary}.
* Worst-case canary: every generated row sits at the origin and y0 = 4·e1, so each row's
  gradient points along −e1; the canary −12·e1 moves the batch's centre to −4·e1 and
  flips every row's gradient (each row's norm exceeds Δ, so all are clipped). After
  clipping, the two blocks are opposite: their distance is the sensitivity (2Δ for
  ``batch``, 2Δ√n for ``per_sample`` clipping) up to rounding.
* Test: the released block's projection on b − a (a, b: the two clipped blocks, which
  the adversary can compute). For Gaussian noise of any scale this is the likelihood
  ratio test, so no test of the same level and power does better (Neyman–Pearson).
* Bound: thresholds are chosen on the first half of the releases and evaluated on the
  second half. With FPR and FNR bounded above by Clopper–Pearson at 97.5% each (95%
  jointly), ε ≥ max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR)) holds for any
  (ε, δ)-DP mechanism with probability ≥ 95%.

``python -m dpsinkhorn.privacy.audit`` prints the bounds for the real mechanism (both clipping
modes) and for two deliberately broken ones: noise off, and per-sample noise divided
by √n (the sensitivity of per-sample clipping forgotten). ``tests/test_audit.py`` checks
that the real ones stay at or below the accountant's ε and the broken ones exceed it.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch
from scipy.stats import beta

from dpsinkhorn.ot.loss import debias_size, semi_debiased_sinkhorn_with_grad
from dpsinkhorn.privacy.factory import make_private
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, clip_block
from dpsinkhorn.privacy.noise import keyed_generator
from dpsinkhorn.privacy.sampler import PoissonSampler

#: The audit's set-up: n generated rows of DIM features, Δ, δ, Sinkhorn λ, p.
N_ROWS, DIM, CLIP, DELTA, ENTROPY_REG, P = 16, 8, 0.5, 1e-5, 0.05, 0.25
#: σ per clipping mode: both give noise multiplier 1 (per_sample: σ/√n = 4/4).
SIGMAS = {"batch": 1.0, "per_sample": 4.0}


class NoiselessSanitizer(ImageGradientSanitizer):
    """BROKEN on purpose (audit only): clips, adds no noise."""

    @property
    def noise_std(self) -> float:
        return 0.0


class NoiseOverRootNSanitizer(ImageGradientSanitizer):
    """BROKEN on purpose (audit only): per-sample noise std 2Δσ/√n, as if the sensitivity
    of per-sample clipping were 2Δ instead of 2Δ√n."""

    @property
    def noise_std(self) -> float:
        return 2.0 * self.clip * self.noise_scale / math.sqrt(self.n)


MECHANISMS = {
    "real": ImageGradientSanitizer,
    "noise_off": NoiselessSanitizer,
    "noise_over_sqrt_n": NoiseOverRootNSanitizer,
}


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 − alpha) Clopper–Pearson upper bound on a binomial proportion."""
    if successes >= trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    scores_out: np.ndarray, scores_in: np.ndarray, delta: float, confidence: float = 0.95
) -> float:
    """ε lower bound (at ``confidence``) from test scores of releases without / with the
    canary (higher = "canary in"). Thresholds from the first halves, bound from the second."""
    half_out, half_in = len(scores_out) // 2, len(scores_in) // 2
    alpha = (1.0 - confidence) / 2  # FPR and FNR bounds share the error probability

    def bound(out: np.ndarray, inn: np.ndarray, threshold: float, exact: bool) -> float:
        false_pos, false_neg = int((out >= threshold).sum()), int((inn < threshold).sum())
        if exact:
            fpr = clopper_pearson_upper(false_pos, len(out), alpha)
            fnr = clopper_pearson_upper(false_neg, len(inn), alpha)
        else:  # point estimate, smoothed, to choose thresholds
            fpr, fnr = (false_pos + 1) / (len(out) + 2), (false_neg + 1) / (len(inn) + 2)
        values = [0.0]
        if fpr > 0 and 1 - delta - fnr > 0:
            values.append(math.log((1 - delta - fnr) / fpr))
        if fnr > 0 and 1 - delta - fpr > 0:
            values.append(math.log((1 - delta - fpr) / fnr))
        return max(values)

    choose_out, choose_in = scores_out[:half_out], scores_in[:half_in]
    candidates = np.unique(np.concatenate([choose_out, choose_in]))
    candidates = np.quantile(candidates, np.linspace(0, 1, 401))
    candidates = np.append(candidates, 0.5 * (choose_out.max() + choose_in.min()))
    best = max(candidates, key=lambda t: bound(choose_out, choose_in, t, exact=False))
    return bound(scores_out[half_out:], scores_in[half_in:], best, exact=True)


def _gradients() -> tuple[torch.Tensor, torch.Tensor]:
    """∇_X S [n + n', DIM] without and with the canary (float64), through the real sampler."""
    n_prime = debias_size(N_ROWS, P)
    x = torch.zeros(N_ROWS + n_prime, DIM, dtype=torch.float64)  # generated rows: origin
    y0 = torch.zeros(1, DIM, dtype=torch.float64)
    y0[0, 0] = 4.0  # far enough that every row's gradient exceeds Δ: all rows clipped
    canary = -3.0 * y0
    grads = []
    for y in (y0, torch.cat([y0, canary])):
        sampler = PoissonSampler(len(y), 1.0, torch.device("cpu"))  # q = 1
        indices, weights = sampler.sample(keyed_generator(b"audit poisson draw" * 2))
        _, grad = semi_debiased_sinkhorn_with_grad(
            x, y[indices], weights.double(), N_ROWS, P, ENTROPY_REG, 0.0,
            scaling=0.9, diameter=32.0, cost="l2",
        )  # fmt: skip
        grads.append(grad)
    return grads[0], grads[1]


def audit(
    mechanism: str = "real", clipping: str = "batch", releases: int = 40000, seed: int = 0
) -> dict:
    """Run the attack: ``releases`` one-step releases from each of D and D'; returns the
    ε lower bound, the accountant's ε for one step (q = 1) and the set-up."""
    sigma = SIGMAS[clipping]
    # The mechanism as training builds it (privacy.factory), at q = n / N = 1, with the
    # noise of a public key (an audit needs no secret) and the class under test.
    spec = {
        "name": f"audit {mechanism} {clipping}", "method": "dp_sinkhorn",
        "batch_size": N_ROWS, "p": P, "steps": 1, "sigma": sigma, "clip": CLIP,
        "clipping": clipping, "perturbation": "image", "target_epsilon": None,
        "epsilon_convention": "sound", "delta": DELTA, "accountant": "rdp",
        "seed": seed, "reproducible": True,
    }  # fmt: skip
    private = make_private(spec, N_ROWS, torch.device("cpu"), MECHANISMS[mechanism])
    sanitizer = private.sanitizer
    grad_out, grad_in = _gradients()
    per_row = clipping == "per_sample"
    a = clip_block(grad_out[:N_ROWS].float(), CLIP, per_row)
    b = clip_block(grad_in[:N_ROWS].float(), CLIP, per_row)
    direction = (b - a).flatten()
    direction = direction / direction.norm()
    centre = 0.5 * (a + b).flatten()
    scores = {}
    for name, grad in (("out", grad_out.float()), ("in", grad_in.float())):
        scores[name] = np.array(
            [
                float((sanitizer(grad)[:N_ROWS].flatten() - centre) @ direction)
                for _ in range(releases)
            ]
        )
    private.accountant.step()  # the ledger's claim for the one released step
    claimed = private.accountant.epsilon()
    return {
        "mechanism": mechanism,
        "clipping": clipping,
        "releases_per_dataset": releases,
        "sigma": sigma,
        "noise_multiplier_claimed": sanitizer.noise_multiplier,
        "distance_of_clipped_blocks": float((b - a).norm()),
        "sensitivity_claimed": sanitizer.sensitivity,
        "noise_std_used": sanitizer.noise_std,
        "delta": DELTA,
        "epsilon_claimed_one_step": claimed,
        "epsilon_lower_bound_95": epsilon_lower_bound(scores["out"], scores["in"], DELTA),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=40000, help="per dataset")
    args = parser.parse_args(argv)
    for mechanism, clipping in [
        ("real", "batch"),
        ("real", "per_sample"),
        ("noise_off", "batch"),
        ("noise_over_sqrt_n", "per_sample"),
    ]:
        print(json.dumps(audit(mechanism, clipping, args.releases)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
