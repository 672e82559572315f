"""Throughput of the training step: ``dpsinkhorn bench --config ... --experiment ...``.

``--impl ours`` times ``train.Trainer.step`` (data resident on the device, fixed
shapes, no host synchronisation). ``--impl reference`` times the straightforward
step as the paper describes it (``ReferenceStep``): Poisson sample by boolean
mask, real images converted every step, a tensor hook that clips and noises
(or, with ``perturbation: parameter``, the parameter gradient clipped and noised
after the backward pass), geomloss with its defaults (diameter estimated from the
points) called twice.
Both run the same model, loss, mechanism and sizes, in one process, after
warm-up, with the device synchronised around the timed loop. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from geomloss import SamplesLoss
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.models import PRECISIONS, ConditionalDCGAN, GeneratorConfig, GeneratorPrecision
from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.loss import debias_size, feature_diameter, mixed_cost
from dpsinkhorn.privacy.accounting import budget_of
from dpsinkhorn.privacy.mechanism import ParameterGradientSanitizer
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import Trainer


class ReferenceStep:
    """The plain DP-Sinkhorn step of paper Algorithm 1, written the obvious way (benchmark only)."""

    def __init__(self, spec: dict, images, labels, device: torch.device):
        self.spec, self.device = spec, device
        self.images = torch.as_tensor(images, device=device)  # uint8, converted every step
        self.labels = torch.as_tensor(labels, device=device)
        self.n = int(spec["batch_size"])
        self.n_prime = debias_size(self.n, spec["p"])
        self.q = self.n / len(self.labels)
        self.num_classes = int(self.labels.max()) + 1
        config = GeneratorConfig(
            num_classes=self.num_classes,
            latent_dim=spec["latent_dim"],
            embed_dim=spec["embed_dim"],
            channels=tuple(spec["channels"]),
            out_channels=1 if self.images.ndim == 3 else self.images.shape[-1],
        )
        self.model = ConditionalDCGAN(config).to(device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"]
        )
        self.private = spec["method"] == "dp_sinkhorn"
        self.perturbation = spec.get("perturbation", "image")
        if self.private:
            self.sigma, _ = budget_of(spec, len(self.labels))

    def _features(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(labels, self.num_classes).float()
        return torch.cat([images.flatten(1), self.spec["alpha_c"] * onehot], dim=1)

    def _sanitize(self, grad: torch.Tensor) -> torch.Tensor:
        clip, n = self.spec["clip"], self.n
        head, tail = grad[:n], grad[n:]
        head = head * min(1.0, clip / (head.norm().item() + 1e-12))
        head = head + 2 * clip * self.sigma * torch.randn_like(head)
        if len(tail):
            tail = tail * min(1.0, clip / (tail.norm().item() + 1e-12))
        return torch.cat([head, tail])

    def _sanitize_parameters(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        clip = self.spec["clip"]
        norm = torch.cat([g.flatten() for g in grads]).norm().item()
        for g in grads:
            g.mul_(min(1.0, clip / (norm + 1e-12)))
            g.add_(2 * clip * self.sigma * torch.randn_like(g))

    def step(self) -> torch.Tensor:
        spec, n, n_prime = self.spec, self.n, self.n_prime
        chosen = (torch.rand(len(self.labels), device=self.device) < self.q).nonzero().squeeze(1)
        real = self.images[chosen].float() / 127.5 - 1.0
        y = self._features(real, self.labels[chosen])
        z = torch.rand(n + n_prime, spec["latent_dim"], device=self.device)
        labels = torch.randint(0, self.num_classes, (n + n_prime,), device=self.device)
        fake = self.model(z, labels)
        if self.private and self.perturbation == "image":
            fake.register_hook(self._sanitize)
        x = self._features(fake, labels)
        ot = SamplesLoss(
            "sinkhorn", p=1, blur=spec["entropy_reg"], debias=False,
            cost=lambda a, b: mixed_cost(a, b, spec["m"], spec.get("cost", "mixed")),
        )  # fmt: skip
        self_term = ot(x[:n], x[n_prime : n + n_prime])
        data_term = ot(x[:n], y) if len(chosen) else torch.zeros((), device=self.device)
        loss = 2 * data_term - self_term
        self.optimizer.zero_grad()
        loss.backward()
        if self.private and self.perturbation == "parameter":
            self._sanitize_parameters()
        self.optimizer.step()
        return loss.detach()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, device: torch.device, steps: int, warmup: int) -> float:
    """Steps per second of ``step()`` over ``steps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps / (time.perf_counter() - start)


# Ops that make the host wait for the device on CUDA: .item() and data-dependent shapes.
SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero")


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations run below autograd (forward and backward), views and
    profiler marks excluded.

    Each counted operation is at least one kernel launch on a GPU, so ``ops`` is the
    launch count a CUDA graph would save per step; ``syncs`` counts those in
    ``SYNCING_OPS``, except inside an optimiser step: there they read the optimiser's
    step counter, which stays on the host on every device (unless ``capturable``),
    so they never wait for a GPU.
    """

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0
        self._in_optimizer = False

    def __enter__(self):
        def flag(value):
            return lambda *_: setattr(self, "_in_optimizer", value)

        self._hooks = [
            register_optimizer_step_pre_hook(flag(True)),
            register_optimizer_step_post_hook(flag(False)),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.namespace != "profiler":  # profiler marks: no kernel
            self.ops += 1
        if func.name().split(".")[0] in SYNCING_OPS and not self._in_optimizer:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


def count_ops(step, flops: bool = True) -> dict:
    """ATen operations, host synchronisations and (``flops``) GFLOP of one call of ``step``.

    ``gflop_per_step``: floating-point operations of the convolutions and matrix
    products, forward and backward, as ``torch.utils.flop_counter`` counts them. Not for
    the sweep: that counter ignores ``groups`` in a convolution's weight gradient, so it
    counts vmap's grouped convolutions K times over there.
    """
    with OpCounter() as counter:
        step()
    result = {"ops_per_step": counter.ops, "host_syncs_per_step": counter.syncs}
    if flops:
        with FlopCounterMode(display=False) as flop_counter:
            step()
        result["gflop_per_step"] = flop_counter.get_total_flops() / 1e9
    return result


def cudnn_tf32_default() -> bool | None:
    """Whether cuDNN convolutions may use TF32 outside ``models.GeneratorPrecision``
    (PyTorch's default: yes); None where the flags cannot be read."""
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # legacy and new TF32 flags mixed by the caller
        return None


def profile_kernels(step, device: torch.device, steps: int, top: int = 25) -> dict:
    """Device time per step of each kernel of ``step()`` (e.g. a CUDA-graph replay).

    torch.profiler (CUPTI) records the kernels a graph replay launches one by one, so this
    sees the graphed step's arithmetic rather than eager launch overhead. Returns
    ``{"steps", "device_us_per_step", "wall_us_per_step", "kernels": [{"name",
    "us_per_step", "calls_per_step", "share"}]}`` for the ``top`` kernels by device time.
    ``step`` must already be warmed up (and captured). On a CPU the "kernels" are ATen ops.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    wall = time.perf_counter() - start
    rows = []
    for event in prof.key_averages():
        if cuda:
            us = getattr(event, "self_device_time_total", None)
            if us is None:  # older torch
                us = event.self_cuda_time_total
            if event.device_type != torch.autograd.DeviceType.CUDA or us <= 0:
                continue
        else:
            us = event.self_cpu_time_total
            if us <= 0 or event.key.startswith("ProfilerStep"):
                continue
        rows.append({"name": event.key, "us": us, "calls": event.count})
    total = sum(r["us"] for r in rows)
    rows.sort(key=lambda r: -r["us"])
    kernels = [
        {
            "name": r["name"][:120],
            "us_per_step": r["us"] / steps,
            "calls_per_step": r["calls"] / steps,
            "share": r["us"] / total if total else 0.0,
        }
        for r in rows[:top]
    ]
    return {
        "steps": steps,
        "device_us_per_step": total / steps,
        "wall_us_per_step": wall / steps * 1e6,
        "kernels": kernels,
    }


def benchmark(
    spec: dict,
    data_dir: Path,
    device: str,
    steps: int,
    warmup: int,
    impl: str = "ours",
    sweep_runs: int = 0,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    solver: bool = False,
    precision: str = "fp32",
    profile_steps: int = 0,
) -> dict:
    """Time the chosen implementation(s) of the training step on the experiment's data.

    ``sweep_runs`` = K > 0 also times ``sweep.SweepTrainer`` on K copies of the experiment
    (seeds seed..seed+K-1): ``sweep_steps_per_s`` counts sweep steps (each advances all K
    runs) and ``sweep_per_run_ratio`` = sweep_steps_per_s / ours_steps_per_s (the
    issue's target: >= 0.7 at K >= 8). ``cuda_graphs`` replays ``ours`` and the sweep
    from CUDA graphs (``train.GraphedStep``; CUDA only); ``compile_solver`` compiles
    their Sinkhorn iterations; ``solver`` adds :func:`solver_iteration_times`;
    ``precision`` is ours' and the sweep's generator arithmetic
    (``models.GeneratorPrecision``). The reference runs with PyTorch's defaults
    (``reference.cudnn_tf32`` says whether its CUDA convolutions could use TF32).
    ``ours`` / ``reference`` / ``sweep`` hold each step's ATen operation,
    host-synchronisation and FLOP counts (:func:`count_ops`, eager). ``profile_steps`` > 0
    adds ``ours_profile`` (and ``sweep_profile``): :func:`profile_kernels` over that many
    steps after the timing, i.e. of the replayed graph when ``cuda_graphs``.
    """
    images, labels = data.load_split(Path(data_dir), spec["dataset"], "train")
    dev = resolve_device(device)
    result: dict = {"experiment": spec["name"], "timed_steps": steps, "warmup_steps": warmup}
    q = int(spec["batch_size"]) / len(labels)
    result["capacity"] = PoissonSampler(len(labels), q, torch.device("cpu")).capacity
    if solver:
        image_numel = int(np.prod(images.shape[1:]))
        result["solver_iterations"] = solver_iteration_times(
            spec, result["capacity"], image_numel, dev
        )
    if impl in ("ours", "both"):
        trainer = Trainer(spec, images, labels, dev, cuda_graphs, compile_solver, precision)
        result["ours_steps_per_s"] = time_steps(trainer.step, dev, steps, warmup)
        if profile_steps:
            result["ours_profile"] = profile_kernels(trainer.step, dev, profile_steps)
        result["ours"] = count_ops(trainer.device_step)
        result["ours"].update(
            cuda_graphs=trainer.cuda_graphs, compile_solver=compile_solver, precision=precision
        )
        if precision != "fp32":
            result["precision_error"] = precision_error(spec, images, labels, dev, precision)
    if impl in ("reference", "both"):
        reference = ReferenceStep(spec, images, labels, dev)
        result["reference_steps_per_s"] = time_steps(reference.step, dev, steps, warmup)
        result["reference"] = count_ops(reference.step)
        if dev.type == "cuda":
            result["reference"]["cudnn_tf32"] = cudnn_tf32_default()
    if sweep_runs:
        specs = [
            {**spec, "name": f"{spec['name']}_{k}", "seed": int(spec["seed"]) + k}
            for k in range(sweep_runs)
        ]
        sweep = SweepTrainer(specs, images, labels, dev, compile_solver, cuda_graphs, precision)
        result["sweep_runs"] = sweep_runs
        result["sweep_steps_per_s"] = time_steps(
            lambda: sweep.step(sweep.trainers), dev, steps, warmup
        )
        if profile_steps:
            result["sweep_profile"] = profile_kernels(
                lambda: sweep.step(sweep.trainers), dev, profile_steps
            )
        result["sweep"] = count_ops(lambda: sweep.device_step(sweep.trainers), flops=False)
        if "ours_steps_per_s" in result:
            result["sweep_per_run_ratio"] = result["sweep_steps_per_s"] / result["ours_steps_per_s"]
    if impl == "both":
        result["ratio"] = result["ours_steps_per_s"] / result["reference_steps_per_s"]
    result["steps_per_s"] = result.get("ours_steps_per_s", result.get("reference_steps_per_s"))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result.update(
        device=f"{dev} ({name})", threads=torch.get_num_threads(), torch=torch.__version__
    )
    return result


#: Bounds on :func:`precision_error` under which a reduced precision may train
#: (tests/test_precision.py, tests/test_cuda.py): the loss within 0.5%, a non-private
#: update within 2%, and a private update changed by at most a tenth of what one draw
#: of the mechanism's noise changes. About 8x what bf16 measured on CPU.
PRECISION_TOLERANCE = {"loss_rel": 5e-3, "grad_rel": 2e-2, "noise_rel": 0.1}


def precision_error(
    spec: dict, images, labels, device: torch.device, precision: str, warm_steps: int = 3
) -> dict:
    """How far one training step in ``precision`` lands from the same step in fp32.

    A float32 ``Trainer`` first takes ``warm_steps`` steps; from that state, with the
    same draws (z, labels, Poisson sample), ``Trainer.forward_backward`` runs in fp32 and
    in ``precision``. Reports

    * ``loss_rel``: |S_p − S_32| / |S_32|;
    * ``grad_rel``: ‖∇θ_p − ∇θ_32‖ / ‖∇θ_32‖ without sanitisation (the update a
      non-private run takes);
    * ``noise_rel`` (private runs): ‖∇θ_p − ∇θ_32‖ / ‖∇θ_32' − ∇θ_32‖ on the sanitised
      gradient, same noise for p and 32, another noise draw for 32': the precision's
      change to a private update as a fraction of the change that the mechanism's own
      noise makes from one draw to the next;
    * ``within_tolerance``: all of them within :data:`PRECISION_TOLERANCE`.
    """
    trainer = Trainer(spec, images, labels, device)
    for _ in range(warm_steps):
        trainer.step()
    state = copy.deepcopy(trainer.state_dict())
    sanitizer = trainer.sanitizer

    def gradient(arith: str, noise_seed: int | None) -> tuple[float, torch.Tensor]:
        trainer.load_state_dict(copy.deepcopy(state))
        trainer.precision = GeneratorPrecision(arith, device)
        trainer.sanitizer = sanitizer if noise_seed is not None else None
        if trainer.sanitizer is not None:
            trainer.sanitizer.generator = torch.Generator(device).manual_seed(noise_seed)
        with trainer.precision.step():
            loss = trainer.forward_backward()
        if isinstance(trainer.sanitizer, ParameterGradientSanitizer):
            trainer.sanitizer.apply(trainer.model.parameters())
        grads = [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
        return float(loss), torch.cat(grads).double()

    loss_32, clean_32 = gradient("fp32", None)
    loss_p, clean_p = gradient(precision, None)
    result = {
        "precision": precision,
        "loss_rel": abs(loss_p - loss_32) / abs(loss_32),
        "grad_rel": float((clean_p - clean_32).norm() / clean_32.norm()),
    }
    if sanitizer is not None:
        _, noisy_32 = gradient("fp32", 1)
        _, noisy_p = gradient(precision, 1)
        _, other_noise_32 = gradient("fp32", 2)
        result["noise_rel"] = float(
            (noisy_p - noisy_32).norm() / (other_noise_32 - noisy_32).norm()
        )
    result["within_tolerance"] = all(
        result[key] <= bound for key, bound in PRECISION_TOLERANCE.items() if key in result
    )
    return result


def generator_layer_profile(
    spec: dict, device: str, repeats: int = 20, warmup: int = 3
) -> list[dict]:
    """Forward + backward time of each generator layer on one step's batch (n + n' rows).

    ``gflop_per_s``: the floating-point operations of forward + backward as counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matmuls), divided by the
    measured time. Each layer runs on its own input (detached), so the times add up to
    the generator's share of a step.
    """
    dev = resolve_device(device)
    rows = int(spec["batch_size"]) + debias_size(int(spec["batch_size"]), spec["p"])
    config = GeneratorConfig(
        latent_dim=spec["latent_dim"], embed_dim=spec["embed_dim"], channels=tuple(spec["channels"])
    )
    model = ConditionalDCGAN(config).to(dev)
    z, labels = model.sample_inputs(rows, device=dev)
    x = torch.cat([z, model.embedding(labels)], dim=1)[:, :, None, None].detach()
    profile = []
    for index, layer in enumerate(model.net):
        inp = x.detach().requires_grad_()

        def forward_backward(layer=layer, inp=inp):
            out = layer(inp)
            out.backward(torch.ones_like(out))

        seconds = 1.0 / time_steps(forward_backward, dev, repeats, warmup)
        row = {"layer": index, "kind": type(layer).__name__, "input": list(inp.shape)}
        row["ms_forward_backward"] = seconds * 1e3
        with FlopCounterMode(display=False) as counter:
            forward_backward()
        if counter.get_total_flops():
            row["gflop_per_s"] = counter.get_total_flops() / seconds / 1e9
        profile.append(row)
        x = layer(inp).detach()
    return profile


def solver_iteration_times(
    spec: dict,
    capacity: int,
    image_numel: int,
    dev: torch.device,
    repeats: int = 50,
    warmup: int = 3,
) -> dict:
    """Milliseconds of one step's Sinkhorn iterations (``ot.sinkhorn_iterations``), eager
    and through ``torch.compile``, on the step's batched problem: [2, n, max(capacity, n)]
    (data term and self term), the paper's schedule, random costs of the features' scale.
    The compile itself is not timed (``compile_s`` reports it)."""
    n = int(spec["batch_size"])
    rows = max(capacity, n)
    g = torch.Generator(device=dev).manual_seed(0)
    cost = torch.rand(2, n, rows, generator=g, device=dev) * 1.5e3
    a_log = torch.full((2, n), -math.log(n), device=dev)
    b_log = torch.full((2, rows), -math.log(rows), device=dev)
    eps_list = tuple(
        ot.epsilon_schedule(
            feature_diameter(image_numel, spec["alpha_c"], spec.get("cost", "mixed")),
            spec["entropy_reg"],
            spec["sinkhorn_scaling"],
        )
    )
    compiled = ot._compiled_iterations()
    start = time.perf_counter()
    compiled(cost, a_log, b_log, eps_list)
    _sync(dev)
    compile_s = time.perf_counter() - start
    times = {}
    for name, fn in (("eager", ot.sinkhorn_iterations), ("compiled", compiled)):
        rate = time_steps(lambda fn=fn: fn(cost, a_log, b_log, eps_list), dev, repeats, warmup)
        times[f"{name}_ms"] = 1e3 / rate
    return {"shape": [2, n, rows], "iterations": len(eps_list) + 1, "compile_s": compile_s, **times}


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="time the training step (steps/s)")
    p.add_argument("--config", nargs="+", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--impl", choices=["ours", "reference", "both"], default="ours")
    p.add_argument("--steps", type=int, default=50, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--sweep",
        type=int,
        default=0,
        metavar="K",
        help="also time K seeds of the experiment trained together (dpsinkhorn.train.sweep)",
    )
    p.add_argument("--device", help="override the config's device")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="replay ours from a CUDA graph (CUDA only; default: config key cuda_graphs)",
    )
    p.add_argument(
        "--compile-solver",
        action=argparse.BooleanOptionalAction,
        help="torch.compile ours' Sinkhorn iterations (default: config key compile_solver)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="ours' generator arithmetic (fp32, tf32, bf16; config key precision)",
    )
    p.add_argument(
        "--solver",
        action="store_true",
        help="also time the Sinkhorn iterations alone, eager and compiled (compiles once)",
    )
    p.add_argument(
        "--layers",
        action="store_true",
        help="also time each generator layer (forward + backward, GFLOP/s of the convolutions)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile N steps of ours (and the sweep) with torch.profiler: device time "
        "per kernel, of the graph replay with --cuda-graphs",
    )
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to benchmark")
    device = args.device or cfg["device"]
    result = benchmark(
        spec,
        cfg["data_dir"],
        device,
        args.steps,
        args.warmup,
        args.impl,
        args.sweep,
        config_lib.cli_or_config(args.cuda_graphs, cfg, "cuda_graphs"),
        config_lib.cli_or_config(args.compile_solver, cfg, "compile_solver"),
        args.solver,
        config_lib.cli_or_config(args.precision, cfg, "precision"),
        args.profile,
    )
    if args.layers:
        result["generator_layers"] = generator_layer_profile(spec, device)
        layers_ms = sum(row["ms_forward_backward"] for row in result["generator_layers"])
        result["generator_share_of_step"] = layers_ms / 1e3 * result["steps_per_s"]
    print(json.dumps(result))
    return 0
