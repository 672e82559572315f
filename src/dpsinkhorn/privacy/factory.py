"""``make_private``: the one place where an experiment's settings become its privacy mechanism.

As Opacus' ``make_private``, :func:`make_private` builds from a validated experiment dict
(:data:`SPEC_KEYS`) and the public record count N: the run's keyed generator
(``privacy.noise``), the Poisson sampler at q = batch_size / N, the sanitiser
(``privacy.mechanism``: add/remove-one adjacency, sensitivity 2Δ or 2Δ√n, noise std 2Δσ) and
the accountant for q and its noise multiplier (σ, or σ/√n per-sample) at the experiment's δ.
Training, sweeps and the audit all build here: what the ledger charges is what the step runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dpsinkhorn.ot.loss import debias_size
from dpsinkhorn.privacy.accounting import PrivacyAccountant
from dpsinkhorn.privacy.budget import budget_of
from dpsinkhorn.privacy.checks import check_delta_of_records
from dpsinkhorn.privacy.mechanism import (
    PERTURBATIONS,
    ImageGradientSanitizer,
    ParameterGradientSanitizer,
)
from dpsinkhorn.privacy.noise import keyed_generator, public_noise_key, secret_noise_key
from dpsinkhorn.privacy.sampler import PoissonSampler

#: The experiment keys the factory reads (a validated experiment dict has them all).
SPEC_KEYS = tuple(
    "name method batch_size p steps sigma clip clipping perturbation target_epsilon "
    "epsilon_convention delta accountant seed reproducible".split()
)

Sanitizer = ImageGradientSanitizer | ParameterGradientSanitizer


@dataclass
class PrivateRun:
    """What one run's privacy consists of (``sanitizer`` and ``accountant`` are None for
    a non-private run). ``rng``: the run's keyed generator (every draw of the step);
    ``n`` generated cross rows, ``n_prime`` debiasing rows, ``q`` = n / N the Poisson
    rate, ``total_steps`` the steps the run takes."""

    rng: torch.Generator
    sampler: PoissonSampler
    sanitizer: Sanitizer | None
    accountant: PrivacyAccountant | None
    n: int
    n_prime: int
    q: float
    total_steps: int


def make_private(
    spec: Mapping,
    num_records: int,
    device: torch.device,
    image_sanitizer: type[ImageGradientSanitizer] = ImageGradientSanitizer,
    parameter_sanitizer: type[ParameterGradientSanitizer] = ParameterGradientSanitizer,
) -> PrivateRun:
    """Generator, sampler, sanitiser and accountant of the experiment ``spec`` on
    ``num_records`` records (public N), on ``device``.

    ``image_sanitizer`` / ``parameter_sanitizer``: the mechanisms' classes (only the audit
    passes broken ones). A ValueError names the experiment and the bad or missing setting.
    """
    name = spec.get("name", "?")
    missing = [key for key in SPEC_KEYS if key not in spec]
    if missing:
        raise ValueError(f"experiment {name}: setting {missing[0]!r} missing")
    n = int(spec["batch_size"])
    if not 0 < n <= num_records:
        raise ValueError(
            f"experiment {name}: batch_size {n} must be in [1, {num_records}] "
            f"(the sampling rate q = batch_size / N must be at most 1)"
        )
    n_prime, q = debias_size(n, float(spec["p"])), n / num_records
    key = public_noise_key(int(spec["seed"]), name) if spec["reproducible"] else secret_noise_key()
    generator = keyed_generator(key, device)
    del key
    sampler = PoissonSampler(num_records, q, device)
    if spec["method"] != "dp_sinkhorn":
        if spec["steps"] is None:
            raise ValueError(f"experiment {name}: non-private training needs steps")
        return PrivateRun(generator, sampler, None, None, n, n_prime, q, int(spec["steps"]))

    check_delta_of_records(spec["delta"], num_records, name)
    perturbation, clipping = spec["perturbation"], spec["clipping"]
    if perturbation not in PERTURBATIONS:
        raise ValueError(
            f"experiment {name}: perturbation must be image or parameter, got {perturbation!r}"
        )
    if perturbation == "parameter" and clipping != "batch":
        raise ValueError(
            f"experiment {name}: perturbation parameter clips the whole parameter gradient "
            f"as one vector; clipping must be batch, not {clipping}"
        )
    sigma, total_steps = budget_of(spec, num_records)
    sanitizer: Sanitizer = (
        image_sanitizer(n, n_prime, spec["clip"], sigma, clipping, generator)
        if perturbation == "image"
        else parameter_sanitizer(spec["clip"], sigma, generator)
    )
    accountant = PrivacyAccountant(q, sanitizer.noise_multiplier, spec["delta"], spec["accountant"])
    return PrivateRun(generator, sampler, sanitizer, accountant, n, n_prime, q, total_steps)


def make_private_stack(
    specs: Sequence[Mapping],
    num_records: int,
    device: torch.device,
    image_sanitizer: type[ImageGradientSanitizer] = ImageGradientSanitizer,
    parameter_sanitizer: type[ParameterGradientSanitizer] = ParameterGradientSanitizer,
) -> list[PrivateRun]:
    """:func:`make_private` for K runs stepped together (a sweep). Each run keeps its own
    generator (its own key: members never share noise or Poisson draws), sanitiser (its
    Δ, σ, clipping, n') and accountant. The runs must draw real batches of one shape
    (same n, hence the same q and Poisson capacity): one batched selection serves all.
    ``image_sanitizer`` as in :func:`make_private` (only the audit passes another)."""
    runs = [
        make_private(spec, num_records, device, image_sanitizer, parameter_sanitizer)
        for spec in specs
    ]
    shapes = {(run.n, run.sampler.capacity) for run in runs}
    if len(shapes) > 1:
        raise ValueError(
            f"experiments {[spec['name'] for spec in specs]} cannot be stepped together: "
            f"their (batch_size, Poisson capacity) differ: {sorted(shapes)}"
        )
    return runs
