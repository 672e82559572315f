"""Privacy budget: σ or steps for a target ε, and the numbers ``dpsinkhorn privacy`` prints.

``resolve_budget`` turns any two of σ, steps and a target ε into (σ, steps) (sound or
paper-convention ε); ``budget_of`` does it for a validated experiment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dpsinkhorn.privacy.accounting import (
    PLD_MIN_NOISE_MULTIPLIER,
    PrivacyAccountant,
    compute_epsilon,
    paper_convention_epsilon,
)
from dpsinkhorn.privacy.checks import check_count, check_delta, check_positive, check_rate
from dpsinkhorn.privacy.mechanism import noise_multiplier, sigma_from_noise_multiplier

#: Smallest noise multiplier a σ search tries (any accountant).
MIN_NOISE_MULTIPLIER = 1e-2


def _largest_steps(eps_of: Callable[[int], float], target: float, setting: str) -> int:
    """Largest T with eps_of(T) ≤ target (eps_of increasing in T); ``setting`` names the
    mechanism in the error raised when even T = 1 exceeds the target."""
    if eps_of(1) > target:
        raise ValueError(
            f"target epsilon {target} is unreachable: a single step already costs "
            f"ε = {eps_of(1):.4g} ({setting})"
        )
    lo, hi = 1, 2
    while eps_of(hi) <= target:
        lo, hi = hi, hi * 2
        if hi > 10**12:
            raise ValueError("target epsilon allows more than 1e12 steps; check the inputs")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_of(mid) <= target else (lo, mid)
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

    σ and target ε: the most steps within it; steps and target ε: the smallest σ reaching
    it (all three: the target must hold). ``convention``: ``sound`` (this mechanism's
    accountant, noise multiplier from σ and ``clipping``) or ``paper``
    (:func:`paper_convention_epsilon`, not a valid guarantee). Training always records
    the sound ε.
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

    if sigma is None:
        if steps is None or target_epsilon is None:
            raise ValueError("sigma is null: give both steps and target_epsilon to solve for it")
        if convention == "paper":
            return _bisect_noise(lambda s: eps_of(s, steps), target_epsilon), int(steps)
        z = solve_noise_multiplier(target_epsilon, q, steps, delta, accountant)
        return sigma_from_noise_multiplier(z, batch_size, clipping), int(steps)
    if steps is None:
        if target_epsilon is None:
            raise ValueError("give steps or target_epsilon together with sigma")
        setting = (
            f"paper convention, sigma {sigma}"
            if convention == "paper"
            else f"noise multiplier {noise_multiplier(sigma, batch_size, clipping)}, "
            f"q = {q}, δ = {delta}"
        )
        steps = _largest_steps(lambda t: eps_of(sigma, t), target_epsilon, setting)
    elif target_epsilon is not None and (eps := eps_of(sigma, steps)) > target_epsilon * (1 + 1e-9):
        raise ValueError(
            f"target epsilon {target_epsilon} ({convention} convention) is "
            f"unreachable: sigma={sigma} for {steps} steps gives ε={eps:.4g}"
        )
    return float(sigma), int(steps)


def budget_of(spec: Mapping, num_records: int) -> tuple[float, int]:
    """(σ, steps) of a private experiment ``spec`` (a validated experiment dict) trained on
    ``num_records`` records: :func:`resolve_budget` with the experiment's own settings
    and sampling rate q = batch_size / num_records. DP-Sinkhorn only (DP-MERF's one
    release: ``privacy.merf.merf_noise_multiplier``)."""
    if spec["method"] != "dp_sinkhorn":
        raise ValueError(
            f"experiment {spec['name']}: method {spec['method']} has no DP-Sinkhorn budget "
            "(Poisson-subsampled Gaussian steps)"
        )
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
    if sigma is None and (steps is None or epsilon is None):
        raise ValueError("without --sigma give both --steps and --epsilon")
    sigma, steps = resolve_budget(
        sigma=sigma,
        steps=steps,
        target_epsilon=epsilon,
        q=q,
        batch_size=batch_size,
        delta=delta,
        clipping=clipping,
        accountant=accountant,
        convention=convention,
    )
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
