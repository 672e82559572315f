"""What a run produces and what it costs: ``dpsinkhorn targets`` and ``dpsinkhorn plan``.

The file lists here are the single source of truth for the paper's outputs beyond
Table 1 (Tables 2/4/5, Figures 2/4a/4b/4c/5/7, reproduction.md): the Snakemake rules
take their inputs and outputs from :func:`inputs` and :func:`outputs`, and
``dpsinkhorn targets <name>`` prints the same paths, so any single cell can be rerun by
handing its path to Snakemake.

``dpsinkhorn plan`` counts the workflow's jobs and estimates training compute as
steps per experiment × steps/s, the steps/s *measured* here and now by timing a few
training steps of each distinct step shape on the chosen device (or given with
``--steps-per-s``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dpsinkhorn import config as config_lib
from dpsinkhorn.config import studies
from dpsinkhorn.config.specs import SWEEP_SHARED_KEYS, sweep_key  # noqa: F401  (plan's API too)
from dpsinkhorn.config.targets import NAMES, SAMPLE_FIGURES

#: Records in each dataset's training split (fixes q = B / N before any data exists).
TRAIN_SIZES = {"mnist": 60000, "fmnist": 60000, "celeba": 162770}

# ------------------------------------------------------------------------ file lists


def evaluation_files(config: Mapping, results: str | Path, experiments: Iterable[str]) -> list[str]:
    """FID and classifier result files of every seed of these experiments."""
    results = Path(results)
    return [
        str(results / exp / f"{metric}_seed{seed}.json")
        for exp in dict.fromkeys(experiments)
        for metric in ["fid"]
        + [
            f"acc_{m}"
            for m in config_lib.classifiers_of(config, config_lib.dataset_of(config, exp))
        ]
        for seed in config["seeds"]
    ]


def privacy_files(config: Mapping, results: str | Path, experiments: Iterable[str]) -> list[str]:
    return [
        str(Path(results) / exp / "privacy.json")
        for exp in dict.fromkeys(experiments)
        if config_lib.needs_training(config, exp)
    ]


def available(config: Mapping) -> list[str]:
    """The output names this config produces, in the paper's order."""
    names = []
    if config_lib.table1_experiments(config):
        names.append("table1")
    names += config_lib.report_tables(config)
    names += studies.configured_studies(config)
    names += [f for f in SAMPLE_FIGURES if config_lib.figure_datasets(config)]
    names.append("reproduction")
    return [n for n in NAMES if n in names]


def _check_name(config: Mapping, name: str) -> None:
    if name not in available(config):
        raise ValueError(
            f"this config does not produce {name!r} (it produces: {', '.join(available(config))})"
        )


def outputs(config: Mapping, name: str, results: str | Path) -> dict[str, str]:
    """The files the output ``name`` consists of (tables: md/csv/tex; figures: png/pdf/csv)."""
    _check_name(config, name)
    results = Path(results)
    if name == "reproduction":
        return {"md": str(results / "reproduction.md")}
    if name in ("table3", "table6"):
        return config_lib.table_outputs(config, name, results)
    if name.startswith("table"):
        out = {s: str(results / "tables" / f"{name}.{s}") for s in ("md", "csv", "tex")}
        if name == "table1":
            for dataset in config_lib.figure_datasets(config):
                out[f"samples_{dataset}"] = str(results / "figures" / f"samples_{dataset}.png")
        return out
    return {s: str(results / "figures" / f"{name}.{s}") for s in ("png", "pdf", "csv")}


def cell_experiments(config: Mapping, name: str) -> list[str]:
    """The experiments whose results the output ``name`` shows."""
    _check_name(config, name)
    if name == "table1":
        return list(config_lib.table1_experiments(config).values())
    if name in ("table3", "table6"):
        return list(config_lib.table_experiments(config, name).values())
    if name in SAMPLE_FIGURES:
        return [config_lib.figure_experiment(config, d) for d in config_lib.figure_datasets(config)]
    if name == "reproduction":
        return list(
            dict.fromkeys(e for n in available(config)[:-1] for e in cell_experiments(config, n))
        )
    return studies.study_experiments(config, name)


def inputs(config: Mapping, name: str, results: str | Path) -> dict[str, list[str]]:
    """What the step writing ``name`` reads (studies, sample figures, reproduction.md)."""
    results = Path(results)
    exps = cell_experiments(config, name)
    seed = config["seeds"][0]
    if name in SAMPLE_FIGURES:
        return {"samples": [str(results / e / f"samples_seed{seed}.npz") for e in exps]}
    if name == "reproduction":
        tables = [n for n in available(config) if n.startswith("table")]
        files = {"tables": [outputs(config, t, results)["csv"] for t in tables]}
        if "eps10" in available(config):  # its cells are a section of reproduction.md
            files["studies"] = [outputs(config, "eps10", results)["csv"]]
        return files
    files = {
        "results": evaluation_files(config, results, exps),
        "privacy": privacy_files(config, results, exps),
    }
    if name == "fig4c":
        files["gradients"] = [str(results / e / "gradstudy.json") for e in exps]
    return files


def all_outputs(config: Mapping, results: str | Path) -> list[str]:
    """Every output file of the run (``rule all``), except Table 1's (listed by its rule)."""
    return [
        path
        for name in available(config)
        if name not in ("table1", "table3", "table6")
        for path in outputs(config, name, results).values()
    ]


def study_regex(config: Mapping, kind: str) -> str:
    """Wildcard regex of the configured outputs of one kind: table | figure | samples."""
    names = {
        "table": studies.TABLE_STUDIES,
        "figure": studies.FIGURE_STUDIES,
        "samples": tuple(SAMPLE_FIGURES),
    }[kind]
    return config_lib.wildcard_regex(n for n in available(config) if n in names)


def gradient_settings(config: Mapping) -> dict:
    """fig4c's estimator p values and batch count (paper: 6 values of p, 300 batches)."""
    study = (config.get("studies") or {}).get("fig4c") or {}
    return {
        "p_values": study.get("p_values", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        "batches": study.get("batches", 300),
    }


# ------------------------------------------------------------------------- planning


def resolved_steps(spec: Mapping) -> int:
    """Training steps of an experiment, solving them from target ε where they are null."""
    from dpsinkhorn.privacy.core import resolve_budget

    if spec["method"] != "dp_sinkhorn" or spec["steps"] is not None:
        return int(spec["steps"])
    _, steps = resolve_budget(
        sigma=spec["sigma"], steps=None, target_epsilon=spec["target_epsilon"],
        q=spec["batch_size"] / TRAIN_SIZES[spec["dataset"]], batch_size=spec["batch_size"],
        delta=spec["delta"], clipping=spec["clipping"], accountant=spec["accountant"],
        **({"convention": spec["epsilon_convention"]} if "epsilon_convention" in spec else {}),
    )  # fmt: skip
    return int(steps)


def step_shape(spec: Mapping) -> tuple:
    """What a training step's cost depends on (experiments that share it share a timing)."""
    keys = ("dataset", "generator", "channels", "latent_dim", "batch_size", "p", "method")
    keys += ("cost", "perturbation", "sinkhorn_scaling")
    return tuple(json.dumps(spec.get(k), sort_keys=True) for k in keys)


def measure_steps_per_s(spec: Mapping, device: str, steps: int) -> float:
    """Time ``steps`` training steps (after 2 warm-up steps) on random data of the right shape."""
    import numpy as np

    from dpsinkhorn.bench.timing import time_steps
    from dpsinkhorn.train.core import Trainer, resolve_device

    shape = {"celeba": (32, 32, 3)}.get(spec["dataset"], (28, 28))
    num = TRAIN_SIZES[spec["dataset"]]
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(num, *shape), dtype=np.uint8)
    labels = np.arange(num) % (2 if spec["dataset"] == "celeba" else 10)
    dev = resolve_device(device)
    trainer = Trainer(dict(spec), images, labels, dev)
    return time_steps(trainer.step, dev, steps, warmup=2)


def group_experiments(specs: Sequence[Mapping], max_runs: int) -> list[list[str]]:
    """Split trained experiments into sweeps of at most ``max_runs`` compatible runs.

    Deterministic: experiments keep their order; each group fills up in that order.
    ``max_runs`` = 1 gives one group per experiment (no sweeps).
    """
    if max_runs < 1:
        raise ValueError(f"sweep_runs must be at least 1, got {max_runs}")
    by_key: dict[tuple, list[list[str]]] = {}
    for spec in specs:
        groups = by_key.setdefault(sweep_key(spec), [[]])
        if len(groups[-1]) == max_runs:
            groups.append([])
        groups[-1].append(spec["name"])
    return [group for groups in by_key.values() for group in groups]


def training_jobs(config: Mapping) -> tuple[list[str], list[list[str]]]:
    """(experiments trained by their own ``train`` job, groups trained by ``train_sweep``).

    ``sweep_runs`` (config) = K > 1 puts up to K compatible experiments into one job.
    """
    specs = [config_lib.experiment(config, e) for e in config_lib.trained_experiments(config)]
    groups = group_experiments(specs, int(config.get("sweep_runs", 1)))
    return [g[0] for g in groups if len(g) == 1], [g for g in groups if len(g) > 1]


def job_count(config: Mapping) -> dict[str, int]:
    """Jobs per workflow step for a full build from nothing (as ``snakemake -n`` counts them)."""
    exps = config_lib.experiment_names(config)
    trained = config_lib.trained_experiments(config)
    seeds = len(config["seeds"])
    names = available(config)
    jobs = {
        "data": len(config_lib.datasets(config)),
        "celeba_fixture": int(config_lib.fixture_source(config) is not None
                              and "celeba" in config_lib.datasets(config)),
        "fid_reference": len(config_lib.datasets(config)),
        "train": len(training_jobs(config)[0]),
        "train_sweep": len(training_jobs(config)[1]),
        "sample": len(trained) * seeds,
        "sample_real": (len(exps) - len(trained)) * seeds,
        "fid": len(exps) * seeds,
        "classify": sum(  # one job trains all seeds of one classifier
            len(config_lib.classifiers_of(config, config_lib.dataset_of(config, e))) for e in exps
        ),
        "grad_study": len(cell_experiments(config, "fig4c")) if "fig4c" in names else 0,
        "reports": len(names),
        "all": 1,
    }  # fmt: skip
    return {k: v for k, v in jobs.items() if v}


def plan(
    config: Mapping, device: str = "cpu", steps_per_s: float | None = None, bench_steps: int = 5
) -> dict:
    """Job counts and a training-compute estimate for every trained experiment."""
    rates: dict[tuple, float] = {}
    rows = []
    for name in config_lib.trained_experiments(config):
        spec = config_lib.experiment(config, name)
        shape = step_shape(spec)
        if steps_per_s is not None:
            rates[shape] = steps_per_s
        elif shape not in rates:
            rates[shape] = measure_steps_per_s(spec, device, bench_steps)
        steps = resolved_steps(spec)
        rows.append(
            {"experiment": name, "steps": steps, "steps_per_s": rates[shape],
             "hours": steps / rates[shape] / 3600}
        )  # fmt: skip
    jobs = job_count(config)
    return {
        "jobs": jobs,
        "total_jobs": sum(jobs.values()),
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


def load_rates(path: str | Path) -> list[dict]:
    """Measured step rates (JSON ``{"rates": [{dataset, batch_size, runs, steps_per_s,
    source}, ...]}``); a one-line error names the file and the bad entry."""
    from dpsinkhorn import fileio

    data = fileio.read_json(path)
    rates = data.get("rates") if isinstance(data, dict) else None
    if not isinstance(rates, list) or not rates:
        raise ValueError(f"{path}: needs a non-empty list 'rates'")
    for k, rate in enumerate(rates):
        for key in ("dataset", "batch_size", "runs", "steps_per_s", "source"):
            if key not in rate:
                raise ValueError(f"{path}: rates[{k}] has no {key!r}")
        if not rate["steps_per_s"] > 0:
            raise ValueError(f"{path}: rates[{k}].steps_per_s must be > 0")
    return rates


def _matching_rate(rates: Sequence[dict], spec: Mapping, runs: int) -> tuple[dict | None, str]:
    """The measured rate for a job of ``runs`` runs of this shape, and how it was matched.

    A single run takes a ``runs: 1`` rate; a sweep of k runs the rate of the smallest
    measured sweep of K >= k runs (a sweep step of fewer runs does no more work).
    """
    same = [r for r in rates if r["dataset"] == spec["dataset"]
            and int(r["batch_size"]) == int(spec["batch_size"])]  # fmt: skip
    if runs == 1:
        found = [r for r in same if int(r["runs"]) == 1]
        return (found[0], "measured") if found else (None, "")
    found = sorted((r for r in same if int(r["runs"]) >= runs), key=lambda r: int(r["runs"]))
    if not found:
        return None, ""
    how = "measured" if int(found[0]["runs"]) == runs else f"{found[0]['runs']}-run rate"
    return found[0], how


def plan_from_rates(
    config: Mapping, rates: Sequence[dict], experiments: Sequence[str], sweep_runs: int = 1
) -> dict:
    """Training hours of ``experiments`` (trained ones) from measured rates, job by job.

    Experiments are grouped into sweeps of at most ``sweep_runs`` as the workflow groups
    them; a job's hours = its longest run's steps / the job's measured steps/s. A job with
    no measured rate for its shape gets hours None and is counted apart, never guessed.
    """
    trained = [e for e in experiments if config_lib.needs_training(config, e)]
    specs = [config_lib.experiment(config, e) for e in trained]
    jobs = []
    for group in group_experiments(specs, sweep_runs):
        spec = config_lib.experiment(config, group[0])
        steps = max(resolved_steps(config_lib.experiment(config, e)) for e in group)
        rate, how = _matching_rate(rates, spec, len(group))
        jobs.append({
            "experiments": group, "steps": steps, "batch_size": spec["batch_size"],
            "steps_per_s": rate["steps_per_s"] if rate else None,
            "hours": steps / rate["steps_per_s"] / 3600 if rate else None,
            "rate_source": f"{how}: {rate['source']}" if rate else "no measured rate",
        })  # fmt: skip
    known = [j for j in jobs if j["hours"] is not None]
    return {
        "jobs": jobs,
        "hours_measured": sum(j["hours"] for j in known),
        "unmeasured": [e for j in jobs if j["hours"] is None for e in j["experiments"]],
        "sweep_runs": sweep_runs,
    }


def _rates_cli(args: argparse.Namespace, config: Mapping, experiments: Sequence[str]) -> int:
    result = plan_from_rates(config, load_rates(args.rates), experiments, args.sweep_runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for job in result["jobs"]:
        rate = "no measured rate" if job["steps_per_s"] is None else f"{job['steps_per_s']:.1f}"
        hours = "?" if job["hours"] is None else f"{job['hours']:.2f}"
        runs, names = len(job["experiments"]), " ".join(job["experiments"])
        print(f"  {runs} run(s) B {job['batch_size']:<5} {job['steps']:>9,} steps  "
              f"{rate:>16} steps/s  {hours:>6} h  {names}")  # fmt: skip
    sources = dict.fromkeys(j["rate_source"] for j in result["jobs"] if j["steps_per_s"])
    print(f"GPU-hours from measured rates: {result['hours_measured']:.1f} h, one job at a time, "
          f"sweeps of at most {args.sweep_runs} run(s)")  # fmt: skip
    for source in sources:
        print(f"  rate: {source}")
    if result["unmeasured"]:
        print(f"  NOT included ({len(result['unmeasured'])} generators, no measured rate for "
              f"their batch size; measure one with dpsinkhorn bench on the GPU): "
              + " ".join(result["unmeasured"]))  # fmt: skip
    return 0


# ----------------------------------------------------------------------------- CLI


def _results_dir(config: Mapping) -> Path:
    return Path("results") / config["run_name"]


def _targets_cli(args: argparse.Namespace) -> int:
    config = config_lib.load_config(args.config)
    results = _results_dir(config)
    names = available(config) if args.name == "all" else [args.name]
    for name in names:
        print(f"# {name}: {studies.STUDIES.get(name, name)}")
        for path in outputs(config, name, results).values():
            print(path)
        if args.cells:
            for exp in cell_experiments(config, name):
                files = evaluation_files(config, results, [exp])
                print(f"#   cell {exp}: " + " ".join(files))
    return 0


def _plan_cli(args: argparse.Namespace) -> int:
    config = config_lib.load_config(args.config)
    from dpsinkhorn.devices import resolve_device

    if args.study is not None:
        experiments = studies.study_experiments(config, args.study)
    else:
        experiments = config_lib.trained_experiments(config)
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
    print(f"training: {len(result['training'])} generators, {result['training_steps']:,} steps")
    for row in sorted(result["training"], key=lambda r: -r["hours"]):
        print(f"  {row['experiment']:40s} {row['steps']:>9,} steps  "
              f"{row['steps_per_s']:8.2f} steps/s  {row['hours']:8.2f} h")  # fmt: skip
    hours = result["training_hours"]
    days = f" ({hours / 24:.1f} days)" if hours > 48 else ""
    print(f"total training on {device}: {hours:.1f} h{days} one job at a time; "
          f"steps/s {result['steps_per_s_source']}")  # fmt: skip
    if not math.isfinite(hours):
        return 1
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser(
        "targets", help="print the files of a table/figure (hand them to snakemake to rerun it)"
    )
    t.add_argument("name", help=f"one of {', '.join(NAMES)}, or all")
    t.add_argument("--config", nargs="+", default=["config/config.yaml"])
    t.add_argument("--cells", action="store_true", help="also each cell's result files")
    t.set_defaults(handler=_targets_cli)
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
        help="JSON of measured step rates (e.g. results-paper-scale/h100-83ae335/"
        "step_rates.json): GPU-hours per job from them instead of timing steps here",
    )
    p.add_argument("--study", help="with --rates: only the generators of this study")
    p.add_argument(
        "--sweep-runs", type=int, default=1, help="with --rates: runs per sweep job (sweep_runs)"
    )
    p.set_defaults(handler=_plan_cli)
