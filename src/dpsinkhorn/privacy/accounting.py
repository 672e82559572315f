"""Privacy accounting: ε of DP-Sinkhorn training, budget solving, the ``dpsinkhorn privacy`` CLI.

Every training step is one Poisson-subsampled Gaussian mechanism with rate q and
noise multiplier z (the mechanism, its adjacency, sensitivity and noise multiplier
are stated in ``privacy.mechanism``); T steps compose adaptively.

Accounting (``PrivacyAccountant``): dp-accounting's RDP accountant (default) or
PLD accountant on ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` composed once
per step. ``paper_convention_epsilon`` reproduces the numbers the paper reports
(classic TF-Privacy ``compute_rdp(q, σ, T·n)``) for comparison only: it is not a
valid guarantee for this mechanism.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
from collections.abc import Callable, Mapping

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpsinkhorn.privacy.checks import check_count, check_delta, check_positive, check_rate
from dpsinkhorn.privacy.mechanism import (
    CLIPPING_MODES,
    noise_multiplier,
    sigma_from_noise_multiplier,
)

ACCOUNTANTS = ("rdp", "pld")


def _step_event(z: float, q: float) -> dp_accounting.DpEvent:
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))


def _new_accountant(name: str) -> dp_accounting.PrivacyAccountant:
    if name == "rdp":
        return rdp_lib.RdpAccountant()
    if name == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")


#: Smallest noise multiplier the PLD accountant is asked about. Its discretised privacy
#: loss grows as z falls: measured at q = 1/1200, 160,000 steps, z = 0.1 takes 6.7 GB and
#: 67 s; z = 1e-3 (where the σ search used to start) asks for tens of GiB.
PLD_MIN_NOISE_MULTIPLIER = 0.2
#: Smallest noise multiplier a σ search tries (any accountant).
MIN_NOISE_MULTIPLIER = 1e-2


def check_noise_multiplier(z: float, accountant: str) -> None:
    check_positive("noise multiplier", z)
    if accountant == "pld" and z < PLD_MIN_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise multiplier {z:.4g} is below {PLD_MIN_NOISE_MULTIPLIER}, the smallest the "
            "PLD accountant handles in bounded memory; use accountant rdp"
        )


def compute_epsilon(z: float, q: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (rate q, noise multiplier z)."""
    check_noise_multiplier(z, accountant)
    check_rate(q)
    check_delta(delta)
    check_count("steps", steps)
    if steps == 0:
        return 0.0
    acc = _new_accountant(accountant)
    acc.compose(_step_event(z, q), int(steps))
    return float(acc.get_epsilon(delta))


def max_steps(
    target_epsilon: float, z: float, q: float, delta: float, accountant: str = "rdp"
) -> int:
    """Largest T with ε(T) ≤ target_epsilon. Raises ValueError if even T = 1 exceeds it."""
    check_positive("target epsilon", target_epsilon)

    def eps(t: int) -> float:
        return compute_epsilon(z, q, t, delta, accountant)

    if eps(1) > target_epsilon:
        raise ValueError(
            f"target epsilon {target_epsilon} is unreachable: a single step already costs "
            f"ε = {eps(1):.4g} (noise multiplier {z}, q = {q}, δ = {delta})"
        )
    lo, hi = 1, 2
    while eps(hi) <= target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 10**12:
            raise ValueError("target epsilon allows more than 1e12 steps; check the inputs")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) <= target_epsilon else (lo, mid)
    return lo


def solve_noise_multiplier(
    target_epsilon: float, q: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """Smallest noise multiplier z (to 1e-4 relative) with ε(z, T) ≤ target_epsilon."""
    check_positive("target epsilon", target_epsilon)
    check_count("steps", steps, minimum=1)
    floor = PLD_MIN_NOISE_MULTIPLIER if accountant == "pld" else MIN_NOISE_MULTIPLIER
    return _bisect_noise(
        lambda z: compute_epsilon(z, q, steps, delta, accountant), target_epsilon, floor
    )


def _bisect_noise(
    eps_of: Callable[[float], float], target: float, floor: float = MIN_NOISE_MULTIPLIER
) -> float:
    """Smallest z in [floor, 1e4] with eps_of(z) ≤ target (to 1e-4 relative).

    The bracket is found from z = 1 outwards (up by doubling, down by halving to
    ``floor``), so the accountant is never asked about a needlessly small z."""
    lo, hi = 1.0, 1.0
    if eps_of(hi) > target:
        while eps_of(hi) > target:
            lo, hi = hi, hi * 2
            if hi > 1e4:
                raise ValueError(
                    f"target epsilon {target} is unreachable with noise multiplier ≤ 1e4"
                )
    else:
        while eps_of(lo) <= target:
            if lo <= floor:
                return floor  # already within the target at the smallest z searched
            lo, hi = max(lo / 2, floor), lo
    while (hi - lo) / hi > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_of(mid) <= target else (mid, hi)
    return hi


# Orders of the classic TF-Privacy examples (paper convention).
PAPER_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def paper_convention_epsilon(q: float, sigma: float, steps: int, n: int, delta: float) -> float:
    """What the paper's numbers correspond to. NOT a valid guarantee for this mechanism.

    compute_rdp(q, σ, steps·n) over PAPER_ORDERS (σ used as the noise multiplier,
    composed steps·n times), then ε = min over orders of rdp − log(δ)/(order − 1).
    """
    check_rate(q)
    check_positive("sigma", sigma)
    check_delta(delta)
    check_count("steps", steps)
    check_count("batch size", n, minimum=1)
    rdp = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, PAPER_ORDERS) * steps * n
    return float(np.min(rdp - math.log(delta) / (PAPER_ORDERS - 1)))


class PrivacyAccountant:
    """Ledger of the privacy spent by training; ``state_dict`` travels in checkpoints.

    Every call to ``step()`` records one Poisson-subsampled Gaussian mechanism
    with this accountant's rate q and noise multiplier z. Segments with other
    (q, z) (e.g. a resume with another σ) are kept separately and composed.
    """

    def __init__(
        self, sample_rate: float, noise_multiplier: float, delta: float, kind: str = "rdp"
    ):
        check_rate(sample_rate)
        check_positive("noise multiplier", noise_multiplier)
        check_delta(delta)
        if kind not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")
        self.sample_rate, self.noise_multiplier = float(sample_rate), float(noise_multiplier)
        self.delta, self.kind = float(delta), kind
        self.segments: list[list[float]] = []  # [q, z, steps]

    def step(self, num_steps: int = 1) -> None:
        """Record ``num_steps`` more steps of the current mechanism."""
        seg = self.segments[-1] if self.segments else None
        if seg and seg[0] == self.sample_rate and seg[1] == self.noise_multiplier:
            seg[2] += num_steps
        else:
            self.segments.append([self.sample_rate, self.noise_multiplier, num_steps])

    @property
    def steps(self) -> int:
        return int(sum(s[2] for s in self.segments))

    def epsilon(self, delta: float | None = None) -> float:
        """ε of everything recorded so far at ``delta`` (default: the accountant's δ)."""
        if self.steps == 0:
            return 0.0
        acc = _new_accountant(self.kind)
        for q, z, t in self.segments:
            acc.compose(_step_event(z, q), int(t))
        return float(acc.get_epsilon(self.delta if delta is None else delta))

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "delta": self.delta,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "segments": [list(s) for s in self.segments],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind or state["delta"] != self.delta:
            raise ValueError(
                f"checkpoint ledger uses accountant {state['kind']} at δ={state['delta']}, "
                f"this run uses {self.kind} at δ={self.delta}"
            )
        self.segments = [list(s) for s in state["segments"]]

    @staticmethod
    def describe() -> str:
        return f"dp-accounting {importlib.metadata.version('dp-accounting')}"


# ---------------------------------------------------------------------------
# Resolving a training configuration: σ and steps from a target ε
# ---------------------------------------------------------------------------


CONVENTIONS = ("sound", "paper")


def resolve_budget(
    *,
    sigma: float | None,
    steps: int | None,
    target_epsilon: float | None,
    q: float,
    batch_size: int,
    delta: float,
    clipping: str = "batch",
    accountant: str = "rdp",
    convention: str = "sound",
) -> tuple[float, int]:
    """Return (σ, steps) from any two of σ, steps, target ε.

    σ and steps given: used as they are (if a target ε is also given, it must hold).
    σ and target ε: the most steps within it. steps and target ε: the smallest σ
    reaching it. ``convention`` says how the target ε is counted: ``sound`` (the
    accountant of this mechanism, noise multiplier from σ and ``clipping``) or
    ``paper`` (:func:`paper_convention_epsilon`, σ as the noise multiplier, steps·n
    compositions; not a valid guarantee, for reproducing the paper's settings).
    Training always records the sound ε, whichever convention solved the budget.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    check_count("batch size", batch_size, minimum=1)
    if steps is not None:
        check_count("steps", steps, minimum=1)
    if target_epsilon is not None:
        check_positive("target epsilon", target_epsilon)  # rejects NaN and inf too
    if sigma is not None:
        noise_multiplier(sigma, batch_size, clipping)  # validates sigma and clipping

    def eps_of(s: float, t: int) -> float:
        if convention == "paper":
            return paper_convention_epsilon(q, s, t, batch_size, delta)
        return compute_epsilon(noise_multiplier(s, batch_size, clipping), q, t, delta, accountant)

    if sigma is not None:
        if steps is None:
            if target_epsilon is None:
                raise ValueError("give steps or target_epsilon together with sigma")
            check_positive("target epsilon", target_epsilon)
            if convention == "paper":
                steps = _max_steps_paper(eps_of, sigma, target_epsilon)
            else:
                z = noise_multiplier(sigma, batch_size, clipping)
                steps = max_steps(target_epsilon, z, q, delta, accountant)
        elif target_epsilon is not None:
            eps = eps_of(sigma, steps)
            if eps > target_epsilon * (1 + 1e-9):
                raise ValueError(
                    f"target epsilon {target_epsilon} ({convention} convention) is "
                    f"unreachable: sigma={sigma} for {steps} steps gives ε={eps:.4g}"
                )
        return float(sigma), int(steps)
    if steps is None or target_epsilon is None:
        raise ValueError("sigma is null: give both steps and target_epsilon to solve for it")
    if convention == "paper":
        check_positive("target epsilon", target_epsilon)
        check_positive("steps", steps)
        return _bisect_noise(lambda s: eps_of(s, steps), target_epsilon), int(steps)
    z = solve_noise_multiplier(target_epsilon, q, steps, delta, accountant)
    return sigma_from_noise_multiplier(z, batch_size, clipping), int(steps)


def budget_of(spec: Mapping, num_records: int) -> tuple[float, int]:
    """(σ, steps) of a private experiment ``spec`` (a validated experiment dict) trained on
    ``num_records`` records: :func:`resolve_budget` with the experiment's own settings
    and sampling rate q = batch_size / num_records."""
    batch_size = int(spec["batch_size"])
    return resolve_budget(
        sigma=spec["sigma"],
        steps=spec["steps"],
        target_epsilon=spec["target_epsilon"],
        q=batch_size / num_records,
        batch_size=batch_size,
        delta=spec["delta"],
        clipping=spec["clipping"],
        accountant=spec["accountant"],
        convention=spec["epsilon_convention"],
    )


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def privacy_report(
    *,
    q: float,
    delta: float,
    batch_size: int,
    sigma: float | None = None,
    steps: int | None = None,
    epsilon: float | None = None,
    convention: str = "sound",
    accountant: str = "rdp",
    clipping: str = "batch",
) -> dict:
    """The numbers printed by ``dpsinkhorn privacy`` (see its --help)."""
    check_rate(q)
    check_delta(delta)
    if sigma is not None:
        check_positive("sigma", sigma)
    if convention == "paper" and sigma is None and (steps is None or epsilon is None):
        raise ValueError("without --sigma give both --steps and --epsilon")
    sigma, steps = resolve_budget(
        sigma=sigma, steps=steps, target_epsilon=epsilon, q=q, batch_size=batch_size,
        delta=delta, clipping=clipping, accountant=accountant, convention=convention,
    )  # fmt: skip
    if convention == "sound":
        z = noise_multiplier(sigma, batch_size, clipping)
        eps = compute_epsilon(z, q, steps, delta, accountant)
        method = (
            f"Poisson-subsampled Gaussian, {accountant.upper()} ({PrivacyAccountant.describe()})"
        )
    else:
        z, eps = sigma, paper_convention_epsilon(q, sigma, steps, batch_size, delta)
        method = "paper convention: compute_rdp(q, sigma, steps*n), classic conversion"
    return {
        "epsilon": eps,
        "delta": delta,
        "steps": int(steps),
        "sigma": float(sigma),
        "noise_multiplier": float(z),
        "q": q,
        "batch_size": batch_size,
        "clipping": clipping,
        "convention": convention,
        "valid_guarantee": convention == "sound",
        "accounting": method,
    }


def _max_steps_paper(eps_of: Callable[[float, int], float], sigma: float, target: float) -> int:
    """Largest T with eps_of(σ, T) ≤ target (eps_of increasing in T)."""
    if eps_of(sigma, 1) > target:
        raise ValueError(
            f"target epsilon {target} is unreachable: a single step already costs "
            f"ε = {eps_of(sigma, 1):.4g} (paper convention, sigma {sigma})"
        )
    lo, hi = 1, 2
    while eps_of(sigma, hi) <= target:
        lo, hi = hi, hi * 2
        if hi > 10**12:
            raise ValueError("target epsilon allows more than 1e12 steps; check the inputs")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_of(sigma, mid) <= target else (lo, mid)
    return lo


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "privacy",
        help="(ε, δ) of DP-Sinkhorn training, or the steps / σ for a target ε",
        description="Prints one JSON object. Give --sigma with --steps (ε), --sigma with "
        "--epsilon (most steps), or --steps with --epsilon (solve σ).",
    )
    p.add_argument("--q", type=float, required=True, help="Poisson sampling rate B/N")
    p.add_argument("--sigma", type=float, help="noise scale σ (noise std 2Δσ)")
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="n = B generated cross rows")
    p.add_argument("--steps", type=int)
    p.add_argument("--epsilon", type=float, help="target ε")
    p.add_argument("--convention", choices=["sound", "paper"], default="sound")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp")
    p.add_argument("--clipping", choices=CLIPPING_MODES, default="batch")
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    if args.steps is None and args.epsilon is None:
        raise ValueError("give --steps, --epsilon, or both")
    report = privacy_report(
        q=args.q, delta=args.delta, batch_size=args.batch_size, sigma=args.sigma,
        steps=args.steps, epsilon=args.epsilon, convention=args.convention,
        accountant=args.accountant, clipping=args.clipping,
    )  # fmt: skip
    print(json.dumps(report))
    return 0
