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
from dpsinkhorn.bench.components import generator_layer_profile, solver_iteration_times
from dpsinkhorn.bench.opcount import count_ops
from dpsinkhorn.bench.precision import cudnn_tf32_default, precision_error
from dpsinkhorn.bench.reference import ReferenceStep
from dpsinkhorn.bench.timing import profile_kernels, time_steps
from dpsinkhorn.data.datasets import load_split
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.models import PRECISIONS
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train.step import TrainingStep
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import Trainer

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
    """Time the implementation(s) ``args.impl`` of the training step on the experiment's
    data, with the options of ``dpsinkhorn bench`` (:func:`register_cli`; ``cuda_graphs``,
    ``compile_solver`` and ``precision`` resolved against the config).

    ``--sweep K`` also times ``sweep.SweepTrainer`` on K seeds of the experiment
    (``sweep_per_run_ratio`` = sweep_steps_per_s / ours_steps_per_s). The reference runs
    with PyTorch's defaults (``reference.cudnn_tf32``: whether its CUDA convolutions could
    use TF32). ``ours`` / ``reference`` / ``sweep`` hold each step's :func:`count_ops`
    (eager); ``--profile N`` adds :func:`profile_kernels` of N steps after the timing.
    """
    steps, warmup, profile_steps, precision = args.steps, args.warmup, args.profile, args.precision
    images, labels = load_split(
        Path(data_dir), spec["dataset"], "train", folder=spec.get("prepared_folder")
    )
    dev = resolve_device(args.device)
    result: dict = {"experiment": spec["name"], "timed_steps": steps, "warmup_steps": warmup}
    q = int(spec["batch_size"]) / len(labels)
    result["capacity"] = PoissonSampler(len(labels), q, torch.device("cpu")).capacity
    if args.solver:
        image_numel = int(np.prod(images.shape[1:]))
        result["solver_iterations"] = solver_iteration_times(
            spec, result["capacity"], image_numel, dev
        )
    step_options, variants = (args.cuda_graphs, args.compile_solver, precision), args.variant
    if args.impl in ("ours", "both"):
        trainer = Trainer(spec, images, labels, dev, *step_options)
        use_variants([trainer], trainer.stepper, variants)
        result["ours_steps_per_s"] = time_steps(trainer.step, dev, steps, warmup)
        if profile_steps:
            result["ours_profile"] = profile_kernels(trainer.step, dev, profile_steps)
        result["ours"] = count_ops(lambda: trainer.stepper.device_step([trainer]))
        result["ours"].update(
            cuda_graphs=trainer.cuda_graphs,
            compile_solver=args.compile_solver,
            precision=precision,
            variants=variants,
        )
        if precision != "fp32":
            result["precision_error"] = precision_error(spec, images, labels, dev, precision)
    if args.impl in ("reference", "both"):
        reference = ReferenceStep(spec, images, labels, dev)
        result["reference_steps_per_s"] = time_steps(reference.step, dev, steps, warmup)
        result["reference"] = count_ops(reference.step)
        if dev.type == "cuda":
            result["reference"]["cudnn_tf32"] = cudnn_tf32_default()
    if sweep_runs := args.sweep:
        specs = [
            {**spec, "name": f"{spec['name']}_{k}", "seed": int(spec["seed"]) + k}
            for k in range(sweep_runs)
        ]
        sweep = SweepTrainer(specs, images, labels, dev, *step_options)
        use_variants(sweep.trainers, sweep.stepper, variants)
        result["sweep_runs"] = sweep_runs

        def sweep_step():
            return sweep.step(sweep.trainers)

        result["sweep_steps_per_s"] = time_steps(sweep_step, dev, steps, warmup)
        if profile_steps:
            result["sweep_profile"] = profile_kernels(sweep_step, dev, profile_steps)
        result["sweep"] = count_ops(lambda: sweep.stepper.device_step(sweep.trainers), flops=False)
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
    args.device = args.device or cfg["device"]
    for key in ("cuda_graphs", "compile_solver", "precision"):
        setattr(args, key, config_lib.cli_or_config(getattr(args, key), cfg, key))
    result = benchmark(spec, cfg["data_dir"], args)
    if args.layers:
        result["generator_layers"] = generator_layer_profile(spec, args.device)
        layers_ms = sum(row["ms_forward_backward"] for row in result["generator_layers"])
        result["generator_share_of_step"] = layers_ms / 1e3 * result["steps_per_s"]
    print(json.dumps(result))
    return 0
