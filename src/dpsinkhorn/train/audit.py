"""Empirical privacy audit of the production training step (docs/AUDIT.md).

``python -m dpsinkhorn.train.audit [--sharp] [--releases R] [--steps S]`` builds the runs as
training does and attacks each sanitiser (image gradient, batch clipping: sensitivity 2Δ,
noise multiplier σ; per-sample: 2Δ√n, σ/√n; parameter gradient: 2Δ, σ) under add/remove-one
adjacency (D' = D ∪ {canary}); one JSON line per (configuration, run) with the claimed ε
(one step at q = 1, ``privacy.audit.one_step_claim``) and the certified ε. Exit 1 if a sound
mechanism's certified bound exceeds its claim or its noise or sensitivity departs from what
it declares; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn.config import make_experiment
from dpsinkhorn.data.datasets import load_split, split_path
from dpsinkhorn.privacy.audit import (
    IMAGE_MECHANISMS,
    PARAMETER_MECHANISMS,
    TRUE_NOISE_FRACTION,
    audit_power,
    epsilon_lower_bound,
    noise_check,
    one_step_claim,
)
from dpsinkhorn.privacy.factory import make_private, make_private_stack
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, ParameterGradientSanitizer
from dpsinkhorn.train.step import TrainingStep
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import Trainer

#: Real sanitiser calls per included step that check the bulk draw's noise law.
CHECK_CALLS = 32
#: Two-sided level of that check (χ² on the variance, z on the mean).
CHECK_LEVEL = 1e-6
#: Pixel values (uint8) of the worst-case records and of the canary.
GREY, WHITE = 127, 255
#: Relative slack on "d ≤ sensitivity" (float32 rounding).
SENSITIVITY_SLACK = 1e-4


class AuditError(ValueError):
    """Bad audit input or set-up (exit 2)."""


@dataclass(frozen=True)
class AuditConfig:
    """One audited configuration: data, the settings that differ from the schema defaults,
    the sanitiser, ``steps`` S (canary steps per run) and ``releases`` R (per dataset and
    run). ``sigmas``: one σ per run (K ≥ 2 is a sweep); ``num_records``: N, the canary
    included (q = batch_size / N)."""

    name: str
    data: str  # "worst_case" or "mnist"
    num_records: int
    batch_size: int
    sigmas: tuple[float, ...]
    clipping: str = "batch"
    perturbation: str = "image"
    mechanism: str = "sound"  # key of privacy.audit.IMAGE_MECHANISMS
    clip: float = 1e-4
    accountant: str = "pld"
    cost: str | None = "l2"  # None: the schema default
    channels: tuple[int, ...] = (16, 8, 4)
    delta: float = 1e-5
    steps: int = 4
    releases: int = 2_000_000
    seed: int = 0


#: z = 3 (σ = 3, or σ = 3√n for per-sample clipping): one step at δ = 1e-5 claims
#: ε = 1.27 (PLD); the √2 slip makes the true z = 3/√2. n = batch_size generated rows.
_N = 16
_KINDS = {  # the four sanitisers: image (batch, per-sample clipping), a sweep, parameter
    "batch": {"sigmas": (3.0,)},
    "per_sample": {"sigmas": (3.0 * math.sqrt(_N),), "clipping": "per_sample"},
    "sweep": {"sigmas": (3.0, 4.0)},
    "parameter": {"sigmas": (3.0,), "perturbation": "parameter"},
}


def _worst(kind: str, mechanism: str = "sound", releases: int = 2_000_000) -> AuditConfig:
    """A worst-case configuration of ``_KINDS[kind]``: N = 40n, 2 canary steps."""
    settings = {"mechanism": mechanism, "releases": releases, "steps": 2, **_KINDS[kind]}
    return AuditConfig(f"worst/{kind}", "worst_case", 40 * _N, _N, **settings)


QUICK: list[AuditConfig] = [
    *(_worst(kind) for kind in _KINDS),
    *(
        _worst(kind, mechanism)
        for kind in ("batch", "parameter")
        for mechanism in ("noise_over_sqrt_2", "sqrt_2_in_call")
    ),
    *(  # gross slips need few releases
        _worst(kind, mechanism, releases=200_000)
        for kind, mechanism in (
            ("batch", "noise_off"),
            ("parameter", "noise_off"),
            ("per_sample", "noise_over_sqrt_n"),
            ("parameter", "noise_over_sqrt_n"),
        )
    ),
]

#: The paper's rate q = 1/1200 (B = 16 of N = 19,200: the paper's B = 50 of 60,000 gives
#: the same q; n = 16 keeps the step cheap), more canary steps and releases.
_SHARP = {"num_records": 1200 * _N, "steps": 16, "releases": 4_000_000}
_MNIST = {
    "data": "mnist",
    "cost": None,
    "clip": 0.5,
    "accountant": "rdp",
    "steps": 8,
    "num_records": 60000,
    "batch_size": 50,
    "releases": 1_000_000,
}
SHARP: list[AuditConfig] = [
    *(replace(c, **_SHARP) for c in QUICK),
    AuditConfig("mnist/batch", sigmas=(1.0,), **_MNIST),
    AuditConfig("mnist/per_sample", sigmas=(math.sqrt(50),), clipping="per_sample", **_MNIST),
    AuditConfig("mnist/sweep", sigmas=(1.0, 1.5), **_MNIST),
    AuditConfig("mnist/parameter", sigmas=(1.0,), perturbation="parameter", **_MNIST),
]


def _recording(cls: type[ImageGradientSanitizer]) -> type[ImageGradientSanitizer]:
    """``cls`` that also keeps its last input ∇_X S [n + n', ...] (what the step sanitised)."""

    class Recording(cls):  # type: ignore[misc, valid-type]
        last_input: torch.Tensor | None = None

        def __call__(self, grad: torch.Tensor) -> torch.Tensor:
            self.last_input = grad.detach().clone()
            return super().__call__(grad)

    Recording.__name__ = Recording.__qualname__ = cls.__name__
    return Recording


def build_data(cfg: AuditConfig, data_root: Path) -> tuple[np.ndarray, np.ndarray]:
    """D' = D ∪ {canary}: images uint8 [N, 28, 28], labels int64 [N]; canary last."""
    base = cfg.num_records - 1
    if cfg.data == "worst_case":
        images = np.full((base, 28, 28), GREY, dtype=np.uint8)
        labels = np.zeros(base, dtype=np.int64)
    elif cfg.data == "mnist":
        try:
            images, labels = load_split(data_root, "mnist", "train")
        except FileNotFoundError as error:
            raise AuditError(f"configuration {cfg.name}: {error}") from None
        if len(labels) < base:
            raise AuditError(f"{cfg.name}: needs {base} MNIST records, found {len(labels)}")
        images, labels = images[:base], labels[:base].astype(np.int64)
    else:
        raise AuditError(f"data must be worst_case or mnist, got {cfg.data!r}")
    canary = np.full((1, 28, 28), WHITE, dtype=np.uint8)
    return np.concatenate([images, canary]), np.concatenate([labels, [0]])


def build_runs(cfg: AuditConfig, data_root: Path) -> tuple[list[Trainer], TrainingStep]:
    """The runs of ``cfg`` as training builds them (factory, then Trainer / SweepTrainer),
    and the step that advances them together."""
    images, labels = build_data(cfg, data_root)
    keys = ("batch_size", "clip", "clipping", "perturbation", "accountant", "delta", "seed", "cost")
    settings = {k: v for k in keys if (v := getattr(cfg, k)) is not None}  # cost None: default
    settings.update(channels=list(cfg.channels), steps=1, reproducible=True)
    specs = [
        make_experiment(
            f"audit-{cfg.name}-{cfg.mechanism}-{k}".replace("/", "-"),
            dataset="mnist",
            sigma=sigma,
            **settings,
        )
        for k, sigma in enumerate(cfg.sigmas)
    ]
    sanitizer = _recording(IMAGE_MECHANISMS[cfg.mechanism])
    parameter = PARAMETER_MECHANISMS[cfg.mechanism]
    parameter = type(parameter.__name__, (parameter,), {"n": cfg.batch_size})  # for ÷ √n
    cpu = torch.device("cpu")
    if len(specs) == 1:
        run = make_private(specs[0], len(labels), cpu, sanitizer, parameter)
        trainers = [Trainer(specs[0], images, labels, cpu, private_run=run)]
        stepper = trainers[0].stepper
    else:
        stack = make_private_stack(specs, len(labels), cpu, sanitizer, parameter)
        sweep = SweepTrainer(specs, images, labels, cpu, private_runs=stack)
        trainers, stepper = sweep.trainers, sweep.stepper
    if cfg.data == "worst_case":  # every generated image 0: the adversary's choice of θ
        for t in trainers:
            last = [m for m in t.model.modules() if isinstance(m, torch.nn.ConvTranspose2d)]
            torch.nn.init.zeros_(last[-1].weight)
            torch.nn.init.zeros_(last[-1].bias)
    return trainers, stepper


class _CanaryHook:
    """Wraps the first run's ``sampler.select`` (the step's one batched selection):
    records which runs drew the canary (index ``canary``); ``mode`` "peek" stops a step
    without the canary after its draws, "draws" stops every step there (only the draws),
    "out" gives the canary weight 0 (dataset D)."""

    class Skip(Exception):
        pass

    def __init__(self, sampler, canary: int):
        self.select, self.rate, self.canary = sampler.select, sampler.rate, canary
        self.mode, self.included = "peek", torch.zeros(0, dtype=torch.bool)
        sampler.select = self

    def __call__(self, u: torch.Tensor):
        indices, weights, overflow = self.select(u)
        self.included = (u[:, self.canary] < self.rate).cpu()
        drawn = (indices == self.canary) & (weights > 0)
        if not torch.equal(drawn.any(-1).cpu(), self.included) and not overflow.any():
            raise AssertionError("the Poisson buffer disagrees with the canary's uniform")
        if self.mode == "draws" or (self.mode == "peek" and not self.included.any()):
            raise self.Skip
        if self.mode == "out":
            weights = torch.where(indices == self.canary, torch.zeros_like(weights), weights)
        return indices, weights, overflow


def _query(t: Trainer) -> torch.Tensor:
    """What run ``t``'s sanitiser received in the last step: ∇_X S [n + n', ...] (image)
    or the flat ∇_θ S [P] (parameter; ``forward_backward`` leaves it unsanitised)."""
    if isinstance(t.sanitizer, ParameterGradientSanitizer):
        return torch.cat([p.grad.reshape(-1) for p in t.model.parameters() if p.requires_grad])
    return t.sanitizer.last_input


def _noise_free(t: Trainer, query: torch.Tensor) -> torch.Tensor:
    """The part of the release the noise is added to, noise-free, flattened."""
    if isinstance(t.sanitizer, ParameterGradientSanitizer):
        return t.sanitizer.clipped(query).double()
    return t.sanitizer.clipped(query)[0].flatten().double()


def _real_noise(t: Trainer, query: torch.Tensor, count: int) -> torch.Tensor:
    """At least ``count`` noise values [≥ count] drawn by the run's real sanitiser: each
    call releases the query sanitised (image: ``__call__``, its rows 0:n; parameter: the
    ``.grad`` of the parameters after the real ``apply``), minus its noise-free part."""
    free = _noise_free(t, query)
    params = [p for p in t.model.parameters() if p.requires_grad]
    out, got = [], 0
    while got < count:
        if isinstance(t.sanitizer, ParameterGradientSanitizer):
            for p, chunk in zip(params, query.split([p.numel() for p in params]), strict=True):
                p.grad = chunk.view_as(p).clone()
            t.sanitizer.apply(params)
            release = torch.cat([p.grad.reshape(-1) for p in params])
        else:
            release = t.sanitizer(query)[: t.n].flatten()
        out.append(release.double() - free)
        got += free.numel()
    return torch.cat(out)


def collect(
    cfg: AuditConfig, trainers: list[Trainer], stepper: TrainingStep, max_draws: int
) -> dict:
    """Run the step until every run drew the canary ``cfg.steps`` times; per run: the
    noise-free blocks (a from D, b from D') of each included step, and the projected
    noise of ``CHECK_CALLS`` real releases per step (normalised: release − b on u)."""
    hook = _CanaryHook(trainers[0].sampler, cfg.num_records - 1)
    pairs: list[list[tuple[torch.Tensor, ...]]] = [[] for _ in trainers]
    checks: list[list[torch.Tensor]] = [[] for _ in trainers]
    draws = debias_differ = 0
    while min(len(p) for p in pairs) < cfg.steps:
        if draws >= max_draws:
            raise AuditError(f"{cfg.name}: fewer than {cfg.steps} canary steps in {draws} draws")
        draws += 1
        states = [t.rng.get_state() for t in trainers]
        hook.mode = "peek"
        try:
            stepper.forward_backward(trainers)
        except _CanaryHook.Skip:
            continue
        queries_in = [_query(t).clone() for t in trainers]
        included = hook.included.clone()
        for t, state in zip(trainers, states, strict=True):
            t.rng.set_state(state)
        hook.mode = "out"
        stepper.forward_backward(trainers)
        for k, t in enumerate(trainers):
            a, b = _noise_free(t, _query(t)), _noise_free(t, queries_in[k])
            if isinstance(t.sanitizer, ImageGradientSanitizer):  # released without noise
                debias_differ += not torch.equal(
                    t.sanitizer.clipped(_query(t))[1], t.sanitizer.clipped(queries_in[k])[1]
                )
            if not included[k]:
                if not torch.equal(a, b):
                    raise AssertionError(f"{cfg.name}: run {k} differs without the canary")
                continue
            if len(pairs[k]) < cfg.steps:
                pairs[k].append((a, b, _query(t).clone(), queries_in[k]))
                checks[k].append(_real_noise(t, queries_in[k], CHECK_CALLS * b.numel()))
    return {"pairs": pairs, "checks": checks, "draws": draws, "debias_differ": debias_differ}


def audit_run(cfg: AuditConfig, t: Trainer, pairs, checks, debias_differ: int) -> dict:
    """Releases drawn by the real sanitiser (every score's noise is its noise), certified
    bound, claim, and for a broken variant the computed power against it. A sound one
    fails if ``debias_differ`` steps' rows released without noise depended on the canary."""
    sanitizer = t.sanitizer
    distances = torch.stack([(b - a).norm() for a, b, _, _ in pairs])  # [S]
    std = sanitizer.noise_std
    per_step = -(-cfg.releases // len(pairs))
    scores: tuple[list, list] = ([], [])  # of releases from D and from D'
    for d, (_, _, query_out, query_in) in zip(distances, pairs, strict=True):
        # Release c + e projected on u about the midpoint: ∓d/2 + e·u; e·u has the law of
        # one coordinate of the sanitiser's iid noise (variance checked per coordinate).
        for side, sign, query in ((0, -1, query_out), (1, 1, query_in)):
            noise = _real_noise(t, query, per_step)[:per_step]
            scores[side].append(((sign * d / 2 + noise) * d).numpy())  # LLR up to 1/std²
    order = np.argsort(np.arange(per_step * len(pairs)) % per_step, kind="stable")  # interleaved
    scores_out, scores_in = (np.concatenate(s)[order][: cfg.releases] for s in scores)
    certified = epsilon_lower_bound(scores_out, scores_in, cfg.delta)
    claimed = one_step_claim(sanitizer.noise_multiplier, cfg.delta, cfg.accountant)
    sens = sanitizer.sensitivity
    result = {
        "sanitizer": type(sanitizer).__name__,
        "mechanism": cfg.mechanism,
        "clipping": sanitizer.clipping,
        "sigma": sanitizer.noise_scale,
        "noise_multiplier_claimed": sanitizer.noise_multiplier,
        "q": t.q,
        "sampler_rate": t.sampler.rate,
        "sensitivity_claimed": sens,
        "distance_max_over_sensitivity": float(distances.max()) / sens,
        "distance_min_over_sensitivity": float(distances.min()) / sens,
        "noise_std_declared": std,
        **(check := noise_check(torch.stack(checks).flatten(), distances, std, CHECK_LEVEL)),
        "epsilon_claimed_one_step_q1": claimed,
        "epsilon_certified_95": certified,
        "epsilon_accountant_one_step_at_q": t.accountant.epsilon() if t.accountant.steps else None,
        "sensitivity_respected": bool(float(distances.max()) <= sens * (1 + SENSITIVITY_SLACK)),
    }
    if cfg.mechanism == "sound":
        result["passed"] = bool(
            certified <= claimed
            and result["noise_check_passed"]
            and result["sensitivity_respected"]
            and not debias_differ
        )
    else:
        result["caught"] = bool(certified > claimed or not result["noise_check_passed"])
        fraction = TRUE_NOISE_FRACTION[cfg.mechanism]  # of 2Δσ; None: 1/√n
        scale = 1 / math.sqrt(cfg.batch_size) if fraction is None else fraction
        true_std = 2 * sanitizer.clip * sanitizer.noise_scale * scale
        attack = (true_std, std, claimed, float(distances.mean()), check["noise_check_df"])
        result.update(audit_power(*attack, CHECK_LEVEL, cfg.releases, cfg.delta))
    return result


def commit() -> str:
    """``git rev-parse --short HEAD`` of this source tree, or "unknown"."""
    git = ["git", "rev-parse", "--short", "HEAD"]
    try:
        out = subprocess.run(
            git, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


#: The configuration's fields each result line repeats.
_REPORTED = ("perturbation", "num_records", "batch_size", "accountant", "delta")


def audit(
    cfg: AuditConfig, data_root: Path = Path("data"), max_draws: int | None = None
) -> list[dict]:
    """Audit ``cfg``: one result dict per run (K for a sweep)."""
    if cfg.steps < 1 or cfg.releases < 1000:
        raise AuditError(f"{cfg.name}: steps must be ≥ 1 and releases ≥ 1000")
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    trainers, stepper = build_runs(cfg, data_root)
    got = collect(cfg, trainers, stepper, max_draws or int(50 * cfg.steps / trainers[0].q + 1000))
    results, source = [], commit()
    for k, t in enumerate(trainers):
        t.accountant.step()  # the run's ledger for one step at its rate q (context only)
        res = audit_run(cfg, t, got["pairs"][k], got["checks"][k], got["debias_differ"])
        results.append(
            {
                "commit": source,
                "config": cfg.name,
                "data": cfg.data,
                "run": k,
                "runs": len(trainers),
                **{key: getattr(cfg, key) for key in _REPORTED},
                "draws": got["draws"],
                "canary_steps": cfg.steps,
                "steps_debias_rows_differ": got["debias_differ"],
                "releases_per_dataset": cfg.releases,
                **res,
            }
        )
    for r in results:
        r["seconds"] = round(time.perf_counter() - start, 1)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharp", action="store_true", help="the sharp configurations")
    parser.add_argument("--releases", type=int, help="releases per dataset and run")
    parser.add_argument("--steps", type=int, help="canary steps per run")
    parser.add_argument("--only", default="", help="configurations whose name contains this")
    parser.add_argument("--mechanism", choices=sorted(IMAGE_MECHANISMS), help="only this one")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path(os.environ.get("DPSINKHORN_AUDIT_DATA", "data")),
        help="folder with mnist/train.npz",
    )
    args = parser.parse_args(argv)
    configs = [
        c
        for c in (SHARP if args.sharp else QUICK)
        if args.only in c.name and args.mechanism in (None, c.mechanism)
    ]
    overrides = {k: v for k in ("releases", "steps") if (v := getattr(args, k)) is not None}
    mnist = split_path(args.data_root, "mnist", "train")
    status = 0
    try:
        if not configs:
            raise AuditError("no configuration matches --only / --mechanism")
        if any(c.data == "mnist" for c in configs) and not mnist.is_file():
            raise AuditError(f"{mnist} not found (give --data-root)")  # before hours of work
        for cfg in configs:
            for result in audit(replace(cfg, **overrides), args.data_root):
                print(json.dumps(result), flush=True)
                if result["mechanism"] == "sound" and not result["passed"]:
                    status = 1
    except AuditError as error:
        print(f"audit: error: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    raise SystemExit(main())
