"""Throughput of the training step: ``dpsinkhorn bench --config ... --experiment ...``.

``--impl ours`` times ``train.Trainer.step``; ``--impl reference`` the step written the
plain way (:class:`dpsinkhorn.bench.reference.ReferenceStep`). Both run the same model,
loss, mechanism and sizes in one process, after warm-up, with the device synchronised
around the timed loop. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn.bench.measure import (
    count_ops,
    generator_layer_profile,
    profile_kernels,
    solver_iteration_times,
    time_steps,
)
from dpsinkhorn.bench.precision import precision_error
from dpsinkhorn.bench.reference import ReferenceStep
from dpsinkhorn.data.datasets import load_split
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train.cli import add_step_arguments, step_options
from dpsinkhorn.train.step import TrainingStep
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import StepOptions, Trainer

#: Variants of our step that ``--variant`` times, each equal to the default step
#: (tests/test_step.py): the Poisson selection by compaction instead of a float64 top-k
#: (``privacy.sampler``), the generator in channels-last memory format, and the solver's
#: cost and gradients in one broadcast pass (``ot.solver.fused_cost``).
STEP_VARIANTS = ("compact_poisson", "channels_last", "fused_cost")


def use_variants(trainers: list, stepper: TrainingStep, variants) -> None:
    """Switch ``trainers`` (fresh, before their first step) and their ``stepper`` to
    ``variants`` (names of :data:`STEP_VARIANTS`)."""
    for trainer in trainers:
        if "compact_poisson" in variants:
            trainer.sampler.selection = "compact"
        if "channels_last" in variants:
            trainer.model.to(memory_format=torch.channels_last)
    stepper.fused_cost = "fused_cost" in variants


def benchmark(spec: dict, data_dir: Path, args: argparse.Namespace) -> dict:
    """Time ``args.impl`` (and ``--sweep K`` seeds trained together) on the experiment's
    data, with ``dpsinkhorn bench``'s options resolved against the config; each timing
    with its :func:`count_ops` and, with ``--profile N``, :func:`profile_kernels`. The keys:
    benchmarks/README.md."""
    steps, warmup, profile_steps, precision = args.steps, args.warmup, args.profile, args.precision
    images, labels = load_split(
        Path(data_dir), spec["dataset"], "train", folder=spec.get("prepared_folder")
    )
    dev = resolve_device(args.device)
    result: dict = {"experiment": spec["name"], "timed_steps": steps, "warmup_steps": warmup}
    q = int(spec["batch_size"]) / len(labels)
    result["capacity"] = PoissonSampler(len(labels), q, torch.device("cpu")).capacity
    if args.solver:
        numel = int(np.prod(images.shape[1:]))
        result["solver_iterations"] = solver_iteration_times(spec, result["capacity"], numel, dev)
    options = StepOptions(args.cuda_graphs, args.compile_solver, precision)

    def time_ours(key: str, trainers: list[Trainer], stepper: TrainingStep) -> None:
        use_variants(trainers, stepper, args.variant)
        step = lambda: stepper(trainers)  # noqa: E731
        result[f"{key}_steps_per_s"] = time_steps(step, dev, steps, warmup)
        if profile_steps:
            result[f"{key}_profile"] = profile_kernels(step, dev, profile_steps)
        device_step = lambda: stepper.device_step(trainers)  # noqa: E731
        result[key] = count_ops(device_step, flops=key == "ours")

    if args.impl in ("ours", "both"):
        trainer = Trainer(spec, images, labels, dev, options)
        time_ours("ours", [trainer], trainer.stepper)
        result["ours"].update(
            cuda_graphs=trainer.cuda_graphs,
            compile_solver=args.compile_solver,
            precision=precision,
            variants=args.variant,
        )
        if precision != "fp32":
            result["precision_error"] = precision_error(spec, images, labels, dev, precision)
    if args.impl in ("reference", "both"):
        reference = ReferenceStep(spec, images, labels, dev)
        result["reference_steps_per_s"] = time_steps(reference.step, dev, steps, warmup)
        result["reference"] = count_ops(reference.step)
        if dev.type == "cuda":  # may its convolutions use TF32 (PyTorch's default)?
            try:
                result["reference"]["cudnn_tf32"] = bool(torch.backends.cudnn.allow_tf32)
            except RuntimeError:  # legacy and new TF32 flags mixed: unreadable
                result["reference"]["cudnn_tf32"] = None
    if sweep_runs := args.sweep:
        specs = [
            {**spec, "name": f"{spec['name']}_{k}", "seed": int(spec["seed"]) + k}
            for k in range(sweep_runs)
        ]
        sweep = SweepTrainer(specs, images, labels, dev, options)
        result["sweep_runs"] = sweep_runs
        time_ours("sweep", sweep.trainers, sweep.stepper)
        if "ours_steps_per_s" in result:
            result["sweep_per_run_ratio"] = result["sweep_steps_per_s"] / result["ours_steps_per_s"]
    if args.impl == "both":
        result["ratio"] = result["ours_steps_per_s"] / result["reference_steps_per_s"]
    result["steps_per_s"] = result.get("ours_steps_per_s", result.get("reference_steps_per_s"))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    result.update(
        device=f"{dev} ({name})", threads=torch.get_num_threads(), torch=torch.__version__
    )
    return result


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="time the training step (steps/s)")
    p.add_argument("--config", nargs="+", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--impl", choices=["ours", "reference", "both"], default="ours")
    p.add_argument(
        "--steps", type=config_lib.at_least(1), default=50, help="timed steps per implementation"
    )
    p.add_argument("--warmup", type=config_lib.at_least(0), default=5)
    p.add_argument(
        "--sweep",
        type=config_lib.at_least(0),
        default=0,
        metavar="K",
        help="also time K seeds of the experiment trained together (dpsinkhorn.train.sweep)",
    )
    p.add_argument("--device", type=config_lib.device_option, help="override the config's device")
    add_step_arguments(p)
    p.add_argument(
        "--variant",
        action="append",
        choices=STEP_VARIANTS,
        default=[],
        help="time ours (and the sweep) with this variant of the step; repeatable",
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
        type=config_lib.at_least(0),
        default=0,
        metavar="N",
        help="also profile N steps of ours (and the sweep) with torch.profiler: device time "
        "per kernel, of the graph replay with --cuda-graphs",
    )
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to benchmark")
    args.device = args.device or cfg["device"]
    vars(args).update(step_options(args, cfg))
    result = benchmark(spec, cfg["data_dir"], args)
    if args.layers:
        result["generator_layers"] = generator_layer_profile(spec, args.device)
        layers_ms = sum(row["ms_forward_backward"] for row in result["generator_layers"])
        result["generator_share_of_step"] = layers_ms / 1e3 * result["steps_per_s"]
    print(json.dumps(result))
    return 0
