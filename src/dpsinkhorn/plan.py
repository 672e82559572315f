"""What a run costs: ``dpsinkhorn plan``.

``dpsinkhorn plan`` counts the workflow's jobs and estimates training compute as
steps per experiment × steps/s, the steps/s *measured* here and now by timing a few
training steps of each distinct step shape on the chosen device (or given with
``--steps-per-s``), or taken from a file of rates measured on a GPU (``--rates``).
Which outputs and jobs a run has comes from :mod:`dpsinkhorn.config.targets`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpsinkhorn.config.cluster import load_rates, matching_rate, rates_file, train_request
from dpsinkhorn.config.experiments import (
    dataset_of,
    datasets,
    experiment,
    experiment_names,
    fixture_source,
    needs_training,
    prepared_folder_of,
    table1_experiments,
    trained_experiments,
)
from dpsinkhorn.config.studies import study_experiments
from dpsinkhorn.config.targets import available, cell_experiments, group_experiments, training_jobs
from dpsinkhorn.config.validate import load_config

#: ``--rates`` without a file: the config's ``cluster.step_rates`` (what the workflow reads).
FROM_CONFIG = "<cluster.step_rates>"
#: Records in each dataset's training split (fixes q = B / N before any data exists).
TRAIN_SIZES = {"mnist": 60000, "fmnist": 60000, "celeba": 162770}

# ----------------------------------------------------------------- from timed steps


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
    return json.loads(record.read_text())


def train_size(spec: Mapping, record: Mapping | None = None) -> int:
    """Records in the experiment's training split: the built-in dataset's, else the prepared
    own dataset's ``num_train`` (``record``: :func:`prepared_record`)."""
    if record is not None:
        return int(record["num_train"])
    return TRAIN_SIZES[spec["dataset"]]


def resolved_steps(spec: Mapping, record: Mapping | None = None) -> int:
    """Training steps of an experiment, solving them from target ε where they are null
    (``record``: an own dataset's, :func:`prepared_record`)."""
    from dpsinkhorn.privacy.budget import budget_of

    if spec["method"] != "dp_sinkhorn" or spec["steps"] is not None:
        return int(spec["steps"])
    _, steps = budget_of(spec, train_size(spec, record))
    return int(steps)


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
    import numpy as np

    from dpsinkhorn.bench.timing import time_steps
    from dpsinkhorn.devices import resolve_device
    from dpsinkhorn.train.trainer import Trainer

    shape = {"celeba": (32, 32, 3)}.get(spec["dataset"], (28, 28))
    classes = 2 if spec["dataset"] == "celeba" else 10
    if record is not None:
        size = int(record["image_size"])
        shape = (size, size) if int(record["channels"]) == 1 else (size, size, 3)
        classes = len(record["classes"])
    num = train_size(spec, record)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(num, *shape), dtype=np.uint8)
    labels = np.arange(num) % classes
    dev = resolve_device(device)
    trainer = Trainer(dict(spec), images, labels, dev)
    return time_steps(trainer.step, dev, steps, warmup=2)


def job_count(config: Mapping) -> dict[str, int]:
    """Jobs per workflow step for a full build from nothing (as ``snakemake -n`` counts them)."""
    exps = experiment_names(config)
    names = available(config)
    jobs = {
        "data": len(datasets(config)),
        "celeba_fixture": int(fixture_source(config) is not None and "celeba" in datasets(config)),
        "fid_reference": len(datasets(config)),
        "train": len(training_jobs(config)[0]),
        "train_sweep": len(training_jobs(config)[1]),
        "evaluate": len(exps),  # one job per experiment: samples, FID, classifiers, all seeds
        "grad_study": len(cell_experiments(config, "fig4c")) if "fig4c" in names else 0,
        "reports": len(names),
        "privacy_summary": 1,  # then the release manifest
        "release_manifest": 1,
        "all": 1,
    }
    return {k: v for k, v in jobs.items() if v}


def slurm_job_count(config: Mapping) -> int:
    """SLURM jobs of a full build with profiles/slurm: each training or sweep, each FID
    reference, each gradient study, and each experiment's evaluation job; data and
    reports run locally."""
    jobs = job_count(config)
    remote = ("train", "train_sweep", "fid_reference", "grad_study", "evaluate")
    return sum(jobs.get(k, 0) for k in remote)


def plan(
    config: Mapping, device: str = "cpu", steps_per_s: float | None = None, bench_steps: int = 5
) -> dict:
    """Job counts and a training-compute estimate for every trained experiment."""
    rates: dict[tuple, float] = {}
    rows = []

    def record(name: str) -> dict | None:
        return prepared_record(config, dataset_of(config, name))

    for name in trained_experiments(config):
        spec = experiment(config, name)
        shape = step_shape(spec)
        if steps_per_s is not None:
            rates[shape] = steps_per_s
        elif shape not in rates:
            rates[shape] = measure_steps_per_s(spec, device, bench_steps, record(name))
        steps = resolved_steps(spec, record(name))
        rows.append(
            {
                "experiment": name,
                "steps": steps,
                "steps_per_s": rates[shape],
                "hours": steps / rates[shape] / 3600,
            }
        )
    jobs = job_count(config)
    return {
        "jobs": jobs,
        "total_jobs": sum(jobs.values()),
        "slurm_jobs": slurm_job_count(config),
        "training": rows,
        "training_hours": sum(r["hours"] for r in rows),
        "training_steps": sum(r["steps"] for r in rows),
        "device": device,
        "steps_per_s_source": "given"
        if steps_per_s is not None
        else f"measured ({bench_steps} "
        "timed steps per step shape, random data of the dataset's size)",
    }


# ------------------------------------------------------------- from measured rates


def plan_from_rates(
    config: Mapping, rates: Sequence[dict], experiments: Sequence[str], sweep_runs: int = 1
) -> dict:
    """Training hours of ``experiments`` (trained ones) from measured rates, job by job.

    Experiments are grouped into sweeps of at most ``sweep_runs`` as the workflow groups
    them; a job's hours = its longest run's steps / the job's measured steps/s (a sweep
    with no measured sweep rate: the single-run rate / its runs). A job with no measured
    rate for its shape gets hours None and is counted apart, never guessed. Each job also
    carries its SLURM request (minutes, chain of jobs) as the workflow computes it
    (:func:`dpsinkhorn.config.cluster.train_request`, the config's ``cluster:`` keys).
    """
    trained = [e for e in experiments if needs_training(config, e)]
    specs = [experiment(config, e) for e in trained]
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
    known = [j for j in jobs if j["hours"] is not None]
    return {
        "jobs": jobs,
        "hours_measured": sum(j["hours"] for j in known),
        "unmeasured": [e for j in jobs if j["hours"] is None for e in j["experiments"]],
        "sweep_runs": sweep_runs,
    }


def _rates_cli(args: argparse.Namespace, config: Mapping, experiments: Sequence[str]) -> int:
    path = rates_file(config) if args.rates == FROM_CONFIG else args.rates
    result = plan_from_rates(config, load_rates(path), experiments, args.sweep_runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
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
    sources = dict.fromkeys(j["rate_source"] for j in result["jobs"] if j["steps_per_s"])
    print(
        f"GPU-hours from measured rates: {result['hours_measured']:.1f} h, one job at a time, "
        f"sweeps of at most {args.sweep_runs} run(s)"
    )
    for source in sources:
        print(f"  rate: {source}")
    cluster = config["cluster"]
    print(
        f"SLURM requests: steps / rate / 60 x {cluster['safety_factor']} + "
        f"{cluster['startup_minutes']} min, at most {cluster['max_job_minutes']} min "
        "(cluster: keys of the config); x ? = chain length unknown"
    )
    for note in dict.fromkeys(j["request_note"] for j in result["jobs"] if j["chain_jobs"] is None):
        print(f"  asks the cap: {note}")
    if args.study is None:
        print(f"SLURM jobs of a full build (profiles/slurm): {slurm_job_count(config)}")
    if result["unmeasured"]:
        print(
            f"  NOT included ({len(result['unmeasured'])} generators, no measured rate for "
            f"their batch size; measure one with dpsinkhorn bench on the GPU): "
            + " ".join(result["unmeasured"])
        )
    return 0


# ------------------------------------------------------------------- GPU windows

#: Work minutes of one 15-minute allocation (machine start, each call's transfers, install
#: and packing taken off): what ``--windows`` and the window count as allocation-sized.
ALLOCATION_WORK_MINUTES = 11.0


def training_minutes(config: Mapping, rates: Sequence[dict], exp: str) -> float | None:
    """Minutes of ``exp``'s whole training at the measured rate of its step's shape (one
    run); 0 for an experiment that does not train; None without a measured rate."""
    if not needs_training(config, exp):
        return 0.0
    spec = experiment(config, exp)
    rate, _ = matching_rate(rates, spec, 1)
    return None if rate is None else resolved_steps(spec) / rate / 60


def allocation_sized(minutes: float | None, work_minutes: float = ALLOCATION_WORK_MINUTES) -> bool:
    """Whether a training of ``minutes`` fits one allocation's work minutes (None: no
    measured rate, so not known to fit: it is never started in a window unless asked for)."""
    return minutes is not None and minutes <= work_minutes


def cells_of(config: Mapping, exp: str) -> int:
    """Table 1 cells an experiment's evaluation fills: FID and each classifier, every seed."""
    from dpsinkhorn.config.targets import evaluation_files

    return len(evaluation_files(config, "", [exp]))


def remaining_table1(config: Mapping, sets: Sequence[Path]) -> list[str]:
    """Table 1 experiments with a cell (FID or classifier of any seed) in none of the
    results sets ``sets`` (folders ``<set>/<experiment>/``)."""
    from dpsinkhorn.config.targets import evaluation_files

    missing = []
    for exp in table1_experiments(config).values():
        names = [Path(f).name for f in evaluation_files(config, "", [exp])]
        if not all(any((s / exp / n).is_file() for s in sets) for n in names):
            missing.append(exp)
    return missing


def plan_windows(
    config: Mapping,
    rates: Sequence[dict],
    sets: Sequence[Path],
    trained: Sequence[str],
    eval_minutes: float,
    work_minutes: float,
) -> dict:
    """GPU windows the remaining Table 1 cells need: per remaining experiment its training
    (unless in ``trained``: a generator exists) at the measured rate of its step's shape
    and one evaluation (``eval_minutes``: the measured whole evaluation of one generator).

    Work that fits one allocation (``work_minutes``: each training no longer, and each
    evaluation) is counted in windows: a training is never split over allocations (the
    window does not start one it cannot finish), so the trainings are packed first fit,
    longest first, into windows of ``work_minutes``; the evaluations (resumed after their
    saved phases) fill what the trainings leave, then further windows. A longer
    training is listed apart (``cluster``: it needs a cluster or longer GPU time; the
    window never starts it unless asked for), its evaluation still counted in a window. An
    experiment without a measured rate for its shape is listed apart, never guessed."""
    for flag, value in (("--eval-minutes", eval_minutes), ("--window-work-minutes", work_minutes)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a number of minutes > 0, got {value}")
    rows, cluster, unmeasured = [], [], []
    for exp in remaining_table1(config, sets):
        train = 0.0 if exp in trained else training_minutes(config, rates, exp)
        if train is None:
            unmeasured.append(exp)
            continue
        row = {"experiment": exp, "train_minutes": train, "eval_minutes": eval_minutes}
        if allocation_sized(train, work_minutes):
            rows.append(row)
        else:
            cluster.append(row)
    minutes = sum(r["train_minutes"] + r["eval_minutes"] for r in rows)
    minutes += sum(r["eval_minutes"] for r in cluster)  # its evaluation fits a window
    filled: list[float] = []  # training minutes of each window, first fit, longest first
    for train in sorted((r["train_minutes"] for r in rows if r["train_minutes"]), reverse=True):
        k = next((k for k, used in enumerate(filled) if used + train <= work_minutes), None)
        if k is None:
            filled.append(train)
        else:
            filled[k] += train
    # the evaluations' minutes beyond what the trainings' windows leave (to a microminute)
    more = round(minutes - len(filled) * work_minutes, 6)
    return {
        "remaining": rows,
        "cluster": cluster,
        "unmeasured": unmeasured,
        "minutes": minutes,
        "cluster_train_minutes": sum(r["train_minutes"] for r in cluster),
        "work_minutes_per_window": work_minutes,
        "windows": len(filled) + (math.ceil(more / work_minutes) if more > 0 else 0),
    }


def measured_eval_minutes(sets: Sequence[Path]) -> float:
    """The longest whole evaluation of one generator recorded in the sets' provenance
    (``evaluate_seconds``, from the job's Snakemake benchmark), in minutes."""
    seconds = [
        entry["evaluate_seconds"]
        for s in sets
        if (s / "provenance.json").is_file()
        for entry in json.loads((s / "provenance.json").read_text())["experiments"].values()
        if "evaluate_seconds" in entry
    ]
    if not seconds:
        raise ValueError(
            f"no results set under {sets[0].parent if sets else '?'} records evaluate_seconds: "
            "give --eval-minutes (one generator's measured evaluation)"
        )
    return max(seconds) / 60


def _windows_cli(args: argparse.Namespace, config: Mapping) -> int:
    from dpsinkhorn.window_setup import load_window

    path = rates_file(config) if args.rates == FROM_CONFIG else args.rates
    if not Path(args.sets).is_dir():
        raise ValueError(f"--sets {args.sets}: not a folder of results sets")
    sets = sorted(p for p in Path(args.sets).iterdir() if p.is_dir())
    trained = [e for i in load_window(args.window)["work"] for e in i["import"]]
    eval_minutes = measured_eval_minutes(sets) if args.eval_minutes is None else args.eval_minutes
    result = plan_windows(
        config, load_rates(path), sets, trained, eval_minutes, args.window_work_minutes
    )
    for row in result["remaining"]:
        print(
            f"  {row['experiment']:28s} train {row['train_minutes']:6.1f} min  "
            f"evaluate {row['eval_minutes']:5.1f} min  (fits an allocation)"
        )
    for row in result["cluster"]:
        print(
            f"  {row['experiment']:28s} train {row['train_minutes']:6.1f} min  "
            f"evaluate {row['eval_minutes']:5.1f} min  (training needs a cluster or "
            f"longer GPU time: more than {args.window_work_minutes} work minutes)"
        )
    left = len(result["remaining"]) + len(result["cluster"])
    print(
        f"Table 1 cells left in {args.sets}: {left} experiments; {result['minutes']:.1f} "
        f"GPU-minutes fit allocations at {eval_minutes:.1f} min per evaluation: "
        f"{result['windows']} windows of {args.window_work_minutes} work minutes"
    )
    if result["cluster"]:
        print(
            f"  on a cluster or longer GPU time: {len(result['cluster'])} trainings, "
            f"{result['cluster_train_minutes']:.1f} GPU-minutes (then their evaluations "
            "in the windows above): " + " ".join(r["experiment"] for r in result["cluster"])
        )
    if result["unmeasured"]:
        print(
            "  NOT included (no measured rate for their step's shape; never started in a "
            "window unless asked for): " + " ".join(result["unmeasured"])
        )
    return 0


# ----------------------------------------------------------------------------- CLI


def _plan_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    from dpsinkhorn.devices import resolve_device

    if args.study is not None:
        experiments = study_experiments(config, args.study)
    else:
        experiments = trained_experiments(config)
    if args.windows:
        if not args.rates:
            raise ValueError("--windows needs --rates (measured step rates of the GPU)")
        return _windows_cli(args, config)
    if args.rates:
        return _rates_cli(args, config, experiments)
    if args.study is not None:
        raise ValueError("--study needs --rates (measured step rates of the GPU it runs on)")

    device = str(resolve_device(args.device or config["device"]))
    result = plan(config, device, args.steps_per_s, args.bench_steps)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['total_jobs']} jobs: " + ", ".join(f"{k} {v}" for k, v in result["jobs"].items())
    )
    print(
        f"on SLURM (profiles/slurm): {result['slurm_jobs']} jobs, one per training or sweep, "
        "FID reference and gradient study, and one evaluation job per experiment"
    )
    print(f"training: {len(result['training'])} generators, {result['training_steps']:,} steps")
    for row in sorted(result["training"], key=lambda r: -r["hours"]):
        print(
            f"  {row['experiment']:40s} {row['steps']:>9,} steps  "
            f"{row['steps_per_s']:8.2f} steps/s  {row['hours']:8.2f} h"
        )
    hours = result["training_hours"]
    days = f" ({hours / 24:.1f} days)" if hours > 48 else ""
    print(
        f"total training on {device}: {hours:.1f} h{days} one job at a time; "
        f"steps/s {result['steps_per_s_source']}"
    )
    if not math.isfinite(hours):
        return 1
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="job count and training compute of a config")
    p.add_argument("--config", nargs="+", default=["config/config.yaml"])
    p.add_argument(
        "--device", help="device to measure steps/s on (default: the config's; auto=cpu)"
    )
    p.add_argument("--steps-per-s", type=float, help="use this rate instead of measuring")
    p.add_argument("--bench-steps", type=int, default=5, help="timed steps per step shape")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--rates",
        nargs="?",
        const=FROM_CONFIG,
        help="JSON of measured step rates (e.g. results-paper-scale/h100-83ae335/"
        "step_rates.json; no file: the config's cluster.step_rates): GPU-hours and the "
        "SLURM request per job from them instead of timing steps here",
    )
    p.add_argument("--study", help="with --rates: only the generators of this study")
    p.add_argument(
        "--sweep-runs", type=int, default=1, help="with --rates: runs per sweep job (sweep_runs)"
    )
    p.add_argument(
        "--windows",
        action="store_true",
        help="with --rates: how many GPU windows the Table 1 cells missing from --sets need",
    )
    p.add_argument("--sets", default="results-paper-scale", help="results sets (--windows)")
    p.add_argument("--window", default="benchmarks/gpu/window.yaml", help="its imports")
    p.add_argument(
        "--eval-minutes",
        type=float,
        default=None,
        help="measured minutes of one generator's whole evaluation (--windows)",
    )
    p.add_argument(
        "--window-work-minutes",
        type=float,
        default=ALLOCATION_WORK_MINUTES,
        help="work minutes of one 15-minute allocation (--windows; default 11: machine start "
        "and each call's transfers, install and packing taken off); a longer training "
        "needs a cluster",
    )
    p.set_defaults(handler=_plan_cli)
