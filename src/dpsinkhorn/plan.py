"""What a run's training costs: ``dpsinkhorn plan``.

Training time = steps per experiment / steps/s, the rate measured here by timing a few
steps of each distinct step shape (or ``--steps-per-s``, or a GPU's rates file ``--rates``,
with each job's SLURM request). The workflow's jobs: ``snakemake -n``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn.config.cluster import load_rates, matching_rate, rates_file, train_request
from dpsinkhorn.config.experiments import (
    dataset_of,
    experiment,
    needs_training,
    prepared_folder_of,
    trained_experiments,
)
from dpsinkhorn.config.studies import study_experiments
from dpsinkhorn.config.targets import group_experiments
from dpsinkhorn.config.validate import at_least, load_config
from dpsinkhorn.data.catalog import DATASETS, TRAIN_SIZES
from dpsinkhorn.devices import resolve_device

#: ``--rates`` without a file: the config's ``cluster.step_rates`` (what the workflow reads).
FROM_CONFIG = "<cluster.step_rates>"


def prepared_record(config: Mapping, dataset: str) -> dict | None:
    """An own dataset's public ``dataset.json`` (None for a built-in dataset): its training
    size and classes are known once it is prepared (``dpsinkhorn data``)."""
    if dataset in TRAIN_SIZES:
        return None
    record = Path(config["data_dir"]) / prepared_folder_of(config, dataset) / "dataset.json"
    if not record.is_file():
        raise ValueError(
            f"dataset {dataset!r}: its training size is known once it is prepared: run "
            f"`dpsinkhorn data --dataset {dataset} --config <config>` first ({record} not found)"
        )
    try:
        return json.loads(record.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{record}: not JSON ({err}); prepare {dataset!r} again") from None


def train_size(spec: Mapping, record: Mapping | None = None) -> int:
    """Records in the experiment's training split: the built-in dataset's, else the prepared
    own dataset's ``num_train`` (``record``: :func:`prepared_record`)."""
    return TRAIN_SIZES[spec["dataset"]] if record is None else int(record["num_train"])


def resolved_steps(spec: Mapping, record: Mapping | None = None) -> int:
    """Training steps of an experiment, solving them from target ε where they are null
    (``record``: an own dataset's, :func:`prepared_record`)."""
    from dpsinkhorn.privacy.budget import budget_of

    if spec["method"] != "dp_sinkhorn" or spec["steps"] is not None:
        return int(spec["steps"])
    return int(budget_of(spec, train_size(spec, record))[1])  # (σ, steps)


def step_shape(spec: Mapping) -> tuple:
    """What a training step's cost depends on (experiments that share it share a timing)."""
    keys = ("dataset", "generator", "channels", "latent_dim", "batch_size", "p", "method")
    keys += ("cost", "perturbation", "sinkhorn_scaling")
    return tuple(json.dumps(spec.get(k), sort_keys=True) for k in keys)


def measure_steps_per_s(
    spec: Mapping, device: str, steps: int, record: Mapping | None = None
) -> float:
    """Time ``steps`` training steps (after 2 warm-up steps) on random data of the right shape
    (an own dataset: ``record``'s size, image shape and classes)."""
    from dpsinkhorn.bench.measure import time_steps
    from dpsinkhorn.train.trainer import Trainer

    if record is None:
        info = DATASETS[spec["dataset"]]
        (channels, size, _), classes = info.image_shape, info.num_classes
    else:
        channels, size, classes = record["channels"], record["image_size"], len(record["classes"])
    shape = (size, size) if channels == 1 else (size, size, channels)
    num = train_size(spec, record)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(num, *shape), dtype=np.uint8)
    labels = np.arange(num) % classes
    dev = resolve_device(device)
    trainer = Trainer(dict(spec), images, labels, dev)
    return time_steps(trainer.step, dev, steps, warmup=2)


def plan(
    config: Mapping, device: str = "cpu", steps_per_s: float | None = None, bench_steps: int = 5
) -> dict:
    """A training-compute estimate for every trained experiment."""
    rates: dict[tuple, float] = {}
    rows = []
    for name in trained_experiments(config):
        spec = experiment(config, name)
        record = prepared_record(config, dataset_of(config, name))
        shape = step_shape(spec)
        if shape not in rates:
            rates[shape] = steps_per_s or measure_steps_per_s(spec, device, bench_steps, record)
        steps = resolved_steps(spec, record)
        hours = steps / rates[shape] / 3600
        rows.append(
            {"experiment": name, "steps": steps, "steps_per_s": rates[shape], "hours": hours}
        )
    source = f"measured ({bench_steps} timed steps per step shape, random data of N records)"
    return {
        "training": rows,
        "training_hours": sum(r["hours"] for r in rows),
        "training_steps": sum(r["steps"] for r in rows),
        "device": device,
        "steps_per_s_source": "given" if steps_per_s is not None else source,
    }


def plan_from_rates(
    config: Mapping, rates: Sequence[dict], experiments: Sequence[str], sweep_runs: int = 1
) -> dict:
    """Training hours of ``experiments`` (trained ones) from measured rates, job by job.

    Grouped into sweeps of at most ``sweep_runs`` as the workflow groups them; a job's
    hours = its longest run's steps / its measured steps/s (no sweep rate: the single-run
    rate / its runs; no rate: None, never guessed). Each job carries its SLURM request
    (:func:`dpsinkhorn.config.cluster.train_request`).
    """
    specs = [experiment(config, e) for e in experiments if needs_training(config, e)]
    jobs = []
    for group in group_experiments(specs, sweep_runs):
        spec = experiment(config, group[0])
        steps = max(resolved_steps(experiment(config, e)) for e in group)
        rate, source = matching_rate(rates, spec, len(group))
        request = train_request(config, group, rates)  # what the cluster job asks for
        jobs.append(
            {
                "experiments": group,
                "steps": steps,
                "batch_size": spec["batch_size"],
                "steps_per_s": rate,
                "hours": steps / rate / 3600 if rate else None,
                "rate_source": source or "no measured rate",
                "request_minutes": request.minutes,
                "chain_jobs": request.chain_jobs,
                "request_note": request.note,
            }
        )
    return {
        "jobs": jobs,
        "hours_measured": sum(j["hours"] for j in jobs if j["hours"] is not None),
        "unmeasured": [e for j in jobs if j["hours"] is None for e in j["experiments"]],
        "sweep_runs": sweep_runs,
    }


def _print_rates(result: dict, config: Mapping) -> int:
    for job in result["jobs"]:
        rate = "no measured rate" if job["steps_per_s"] is None else f"{job['steps_per_s']:.1f}"
        hours = "?" if job["hours"] is None else f"{job['hours']:.2f}"
        runs, names = len(job["experiments"]), " ".join(job["experiments"])
        chain = "?" if job["chain_jobs"] is None else job["chain_jobs"]
        print(
            f"  {runs} run(s) B {job['batch_size']:<5} {job['steps']:>9,} steps  "
            f"{rate:>16} steps/s  {hours:>6} h  SLURM {job['request_minutes']:>5} min "
            f"x {chain} job(s)  {names}"
        )
    print(
        f"GPU-hours from measured rates: {result['hours_measured']:.1f} h, one job at a time, "
        f"sweeps of at most {result['sweep_runs']} run(s)"
    )
    for source in dict.fromkeys(j["rate_source"] for j in result["jobs"] if j["steps_per_s"]):
        print(f"  rate: {source}")
    cluster = config["cluster"]
    print(
        f"SLURM requests: steps / rate / 60 x {cluster['safety_factor']} + "
        f"{cluster['startup_minutes']} min, at most {cluster['max_job_minutes']} min "
        "(cluster: keys of the config); x ? = chain length unknown"
    )
    for note in dict.fromkeys(j["request_note"] for j in result["jobs"] if j["chain_jobs"] is None):
        print(f"  asks the cap: {note}")
    if result["unmeasured"]:
        print(
            f"  NOT included ({len(result['unmeasured'])} generators, no measured rate for "
            f"their batch size; measure one with dpsinkhorn bench on the GPU): "
            + " ".join(result["unmeasured"])
        )
    return 0


def _plan_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    study = args.study
    experiments = trained_experiments(config) if study is None else study_experiments(config, study)
    if args.rates:
        path = rates_file(config) if args.rates == FROM_CONFIG else args.rates
        result = plan_from_rates(config, load_rates(path), experiments, args.sweep_runs)
    elif study is not None:
        raise ValueError("--study needs --rates (measured step rates of the GPU it runs on)")
    else:
        device = str(resolve_device(args.device or config["device"]))
        result = plan(config, device, args.steps_per_s, args.bench_steps)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if args.rates:
        return _print_rates(result, config)
    print(f"training: {len(result['training'])} generators, {result['training_steps']:,} steps")
    for row in sorted(result["training"], key=lambda r: -r["hours"]):
        print(
            f"  {row['experiment']:40s} {row['steps']:>9,} steps  "
            f"{row['steps_per_s']:8.2f} steps/s  {row['hours']:8.2f} h"
        )
    hours = result["training_hours"]
    days = f" ({hours / 24:.1f} days)" if hours > 48 else ""
    print(
        f"total training on {result['device']}: {hours:.1f} h{days} one job at a time; "
        f"steps/s {result['steps_per_s_source']}"
    )
    return 0 if math.isfinite(hours) else 1


def positive_rate(text: str) -> float:
    """An argparse ``type``: a finite steps/s > 0 (argparse names the option, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of steps/s, got {text}")
    return value


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="training compute of a config (from measured steps/s)")
    p.add_argument("--config", nargs="+", default=["config/config.yaml"])
    p.add_argument(
        "--device", help="device to measure steps/s on (default: the config's; auto=cpu)"
    )
    p.add_argument("--steps-per-s", type=positive_rate, help="use this rate instead of measuring")
    p.add_argument("--bench-steps", type=at_least(1), default=5, help="timed steps per step shape")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--rates",
        nargs="?",
        const=FROM_CONFIG,
        help="JSON of measured step rates (e.g. results-paper-scale/mnist-paper-setting-h100/"
        "step_rates.json; no file: the config's cluster.step_rates): GPU-hours and the "
        "SLURM request per job from them instead of timing steps here",
    )
    p.add_argument("--study", help="with --rates: only the generators of this study")
    p.add_argument(
        "--sweep-runs",
        type=at_least(1),
        default=1,
        help="with --rates: runs per sweep job (sweep_runs)",
    )
    p.set_defaults(handler=_plan_cli)
