"""The workflow's outputs (tables, figures, reproduction.md), the files behind each, and
which experiments train alone or together in one sweep (:func:`training_jobs`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dpsinkhorn.config.experiments import (
    FIGURES_DIR,
    NONPRIVATE,
    TABLES_DIR,
    PathLike,
    evaluation_dir,
    experiment,
    experiment_classifiers,
    experiment_dir,
    figure_datasets,
    figure_experiment,
    needs_training,
    paper_figure_datasets,
    private_experiments,
    table1_experiments,
    table_experiments,
    trained_experiments,
)
from dpsinkhorn.config.identity import sweep_key
from dpsinkhorn.config.studies import (
    FIGURE_STUDIES,
    STUDIES,
    TABLE_STUDIES,
    configured_studies,
    study_experiments,
)
from dpsinkhorn.config.validate import load_config
from dpsinkhorn.config.workflow import wildcard_regex

#: The main tables built from configured experiments (not from studies).
MAIN_TABLES = ("table1", "table3", "table6")
#: CelebA tables (paper Tables 3 and 6), built by :mod:`dpsinkhorn.report`.
CELEBA_TABLES = ("table3", "table6")
#: Sample-grid figures -> samples per class (paper Figures 2 and 7).
SAMPLE_FIGURES = {"fig2": 10, "fig7": 20}
#: Every output name, in the paper's order.
NAMES = tuple(
    "table1 table2 table3 table4 table5 table6 fig2 fig4a fig4b fig4c fig5 fig7 eps10 "
    "reproduction".split()
)

TITLES = {
    **STUDIES,
    "table1": "Table 1: DP image generation on MNIST and Fashion-MNIST",
    "table3": "Table 3: DP image generation on CelebA 32×32 (gender-conditioned)",
    "table6": "Table 6: generator architecture on CelebA 32×32 (DP-Sinkhorn, L2 cost)",
    "fig2": "Figure 2: DP-Sinkhorn samples, 10 per class",
    "fig7": "Figure 7: more DP-Sinkhorn samples, 20 per class (appendix)",
    "reproduction": "Reproduction: the paper's numbers against this run",
}

#: The sample figure of each CelebA table: the rows whose samples it shows, top to bottom.
TABLE_FIGURES = {"table3": ("fig3", ("dp",)), "table6": ("fig6", ("dcgan", "biggan"))}

#: The files a training run writes into its folder (``train.release.OUTPUT_FILES``).
TRAINING_FILES = ("generator.pt", "privacy.json", "train_log.csv")
#: What a completed evaluation job writes beside its scores: the code of each phase.
EVALUATION_PHASES = "evaluate_phases.json"
#: An unfinished evaluation job's finished phases' scores.
EVALUATION_PROGRESS = "evaluate_progress.json"


def results_dir(config: Mapping) -> str:
    """A run's results folder, relative to the working folder: ``results/<run_name>``."""
    return f"results/{config['run_name']}"


def sample_name(seed: int) -> str:
    """The file name of one seed's synthetic dataset: ``samples_seed<seed>.npz``."""
    return f"samples_seed{seed}.npz"


def score_name(metric: str, seed: int) -> str:
    """``<metric>_seed<seed>.json``; ``metric`` is ``fid`` or ``acc_<classifier>``."""
    return f"{metric}_seed{seed}.json"


def experiment_metrics(config: Mapping, exp: str) -> list[str]:
    """An experiment's score metrics: ``fid``, then ``acc_<model>`` per classifier."""
    return ["fid"] + [f"acc_{m}" for m in experiment_classifiers(config, exp)]


def evaluation_files(config: Mapping, results: PathLike, experiments: Iterable[str]) -> list[str]:
    """FID and classifier result files of every seed of these experiments."""
    return [
        str(evaluation_dir(config, results, exp) / score_name(metric, seed))
        for exp in dict.fromkeys(experiments)
        for metric in experiment_metrics(config, exp)
        for seed in config["seeds"]
    ]


def privacy_files(config: Mapping, results: PathLike, experiments: Iterable[str]) -> list[str]:
    """The privacy reports (``privacy.json``) of those of these experiments that train."""
    return [
        str(experiment_dir(config, results, exp) / "privacy.json")
        for exp in dict.fromkeys(experiments)
        if needs_training(config, exp)
    ]


def sample_files(
    config: Mapping, results: PathLike, experiments: Iterable[str], first_seed: bool = False
) -> list[str]:
    """The synthetic datasets (written by the evaluation jobs) of these experiments, every
    seed's, or the first seed's (``first_seed``: what the sample figures show)."""
    seeds = config["seeds"][:1] if first_seed else config["seeds"]
    return [
        str(experiment_dir(config, results, e) / sample_name(s)) for e in experiments for s in seeds
    ]


def fid_reference_file(results: PathLike, dataset: str) -> str:
    """FID statistics of a dataset's test split (computed from it: never in a release)."""
    return str(Path(results) / NONPRIVATE / f"fid_ref_{dataset}.npz")


def gradstudy_file(results: PathLike, exp: str) -> str:
    """Figure 4c's gradient study of a trained generator (private: never in a release)."""
    return str(Path(results) / NONPRIVATE / exp / "gradstudy.json")


def release_manifest_file(results: PathLike) -> str:
    """The run's publishable files and the ledger covering each (``dpsinkhorn release``)."""
    return str(Path(results) / "release_manifest.json")


def privacy_summary_file(results: PathLike) -> str:
    """Per dataset: the DP releases, their composed ε, the configurations tried."""
    return str(Path(results) / "privacy_summary.json")


def released_metrics(config: Mapping, exp: str) -> list[str]:
    """Score metrics a DP experiment's release holds: all when its scores lie in its own
    folder (public test split), else none."""
    same = evaluation_dir(config, ".", exp) == experiment_dir(config, ".", exp)
    return experiment_metrics(config, exp) if same else []


def release_inputs(config: Mapping, results: PathLike) -> list[str]:
    """What the release manifest covers: every DP experiment's files, and the summary."""
    exps = private_experiments(config)
    return [
        *(str(experiment_dir(config, results, e) / f) for e in exps for f in TRAINING_FILES),
        *sample_files(config, results, exps),
        *(
            str(experiment_dir(config, results, e) / score_name(m, s))
            for e in exps
            for m in released_metrics(config, e)
            for s in config["seeds"]
        ),
        privacy_summary_file(results),
    ]


def report_tables(config: Mapping) -> list[str]:
    """The CelebA tables (``table3``, ``table6``) that some experiment of the config fills."""
    return [t for t in CELEBA_TABLES if table_experiments(config, t)]


def table_figure_experiments(config: Mapping, table: str) -> list[str]:
    """Experiments shown in the table's figures (Table 1: each dataset's main DP experiment;
    fig3: the DP row; fig6: DCGAN, BigGAN)."""
    if table == "table1":
        return [figure_experiment(config, d) for d in figure_datasets(config)]
    _, kinds = TABLE_FIGURES[table]
    return [name for (_, row), name in table_experiments(config, table).items() if row in kinds]


def table_files(config: Mapping, table: str, results: PathLike) -> dict[str, list[str]]:
    """What Table 1 or a CelebA table reads: per-seed results, privacy reports, samples."""
    rows = table_experiments(config, table).values()
    return {
        "results": evaluation_files(config, results, rows),
        "privacy": privacy_files(config, results, rows),
        "samples": sample_files(config, results, table_figure_experiments(config, table), True),
    }


def available(config: Mapping) -> list[str]:
    """The output names this config produces, in the paper's order."""
    names = []
    if table1_experiments(config):
        names.append("table1")
    names += report_tables(config)
    names += configured_studies(config)
    names += [f for f in SAMPLE_FIGURES if paper_figure_datasets(config)]
    names.append("reproduction")
    return [n for n in NAMES if n in names]


def _check_name(config: Mapping, name: str) -> None:
    if name not in available(config):
        raise ValueError(
            f"this config does not produce {name!r} (it produces: {', '.join(available(config))})"
        )


def outputs(config: Mapping, name: str, results: PathLike) -> dict[str, str]:
    """:func:`output_files` of an output the config produces."""
    _check_name(config, name)
    return output_files(config, name, results)


def output_files(config: Mapping, name: str, results: PathLike) -> dict[str, str]:
    """The files the output ``name`` consists of (tables: md/csv/tex, Table 1's sample grids,
    a CelebA table's figure; figures: png/pdf/csv)."""
    results = Path(results)
    if name == "reproduction":
        return {"md": str(results / "reproduction.md")}
    if not name.startswith("table"):
        return {s: str(results / FIGURES_DIR / f"{name}.{s}") for s in ("png", "pdf", "csv")}
    out = {s: str(results / TABLES_DIR / f"{name}.{s}") for s in ("md", "csv", "tex")}
    if name in TABLE_FIGURES:
        out["figure"] = str(results / FIGURES_DIR / f"{TABLE_FIGURES[name][0]}.png")
    for dataset in figure_datasets(config) if name == "table1" else ():
        out[f"samples_{dataset}"] = str(results / FIGURES_DIR / f"samples_{dataset}.png")
    return out


def cell_experiments(config: Mapping, name: str) -> list[str]:
    """The experiments whose results the output ``name`` shows."""
    _check_name(config, name)
    if name == "table1":
        return list(table1_experiments(config).values())
    if name in CELEBA_TABLES:
        return list(table_experiments(config, name).values())
    if name in SAMPLE_FIGURES:
        return [figure_experiment(config, d) for d in paper_figure_datasets(config)]
    if name == "reproduction":
        return list(
            dict.fromkeys(e for n in available(config)[:-1] for e in cell_experiments(config, n))
        )
    return study_experiments(config, name)


def inputs(config: Mapping, name: str, results: PathLike) -> dict[str, list[str]]:
    """What the step writing ``name`` reads (studies, sample figures, reproduction.md)."""
    results = Path(results)
    exps = cell_experiments(config, name)
    if name in SAMPLE_FIGURES:
        return {"samples": sample_files(config, results, exps, first_seed=True)}
    if name == "reproduction":
        tables = [n for n in available(config) if n.startswith("table")]
        files = {"tables": [outputs(config, t, results)["csv"] for t in tables]}
        if "eps10" in available(config):  # its cells are a section of reproduction.md
            files["studies"] = [outputs(config, "eps10", results)["csv"]]
        files["privacy_summary"] = [privacy_summary_file(results)]
        return files
    files = {
        "results": evaluation_files(config, results, exps),
        "privacy": privacy_files(config, results, exps),
    }
    if name == "fig4c":
        files["gradients"] = [gradstudy_file(results, e) for e in exps]
    return files


def all_outputs(config: Mapping, results: PathLike) -> list[str]:
    """Every output file of the run (``rule all``) but Table 1's (its rule's)."""
    return [
        path
        for name in available(config)
        if name != "table1"
        for path in outputs(config, name, results).values()
    ]


def study_regex(config: Mapping, kind: str) -> str:
    """Wildcard regex of the configured outputs of one kind: table | figure | samples."""
    names = {"table": TABLE_STUDIES, "figure": FIGURE_STUDIES, "samples": tuple(SAMPLE_FIGURES)}
    return wildcard_regex(n for n in available(config) if n in names[kind])


def group_experiments(specs: Sequence[Mapping], max_runs: int) -> list[list[str]]:
    """Split trained experiments, in order, into sweeps of at most ``max_runs`` compatible
    runs (1: no sweeps)."""
    if max_runs < 1:
        raise ValueError(f"sweep_runs must be at least 1, got {max_runs}")
    by_key: dict[tuple, list[list[str]]] = {}
    for spec in specs:
        if spec["method"] == "dpmerf":  # no batched step: always its own train job
            by_key[("dpmerf", spec["name"])] = [[spec["name"]]]
            continue
        groups = by_key.setdefault(sweep_key(spec), [[]])
        if len(groups[-1]) == max_runs:
            groups.append([])
        groups[-1].append(spec["name"])
    return [group for groups in by_key.values() for group in groups]


def training_jobs(config: Mapping) -> tuple[list[str], list[list[str]]]:
    """(experiments trained by their own ``train`` job, groups trained by ``train_sweep``)."""
    specs = [experiment(config, e) for e in trained_experiments(config)]
    groups = group_experiments(specs, int(config["sweep_runs"]))
    return [g[0] for g in groups if len(g) == 1], [g for g in groups if len(g) > 1]


def _targets_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    results = Path("results") / config["run_name"]
    names = available(config) if args.name == "all" else [args.name]
    for name in names:
        print(f"# {name}: {STUDIES.get(name, name)}")
        for path in outputs(config, name, results).values():
            print(path)
        if args.cells:
            for exp in cell_experiments(config, name):
                files = evaluation_files(config, results, [exp])
                print(f"#   cell {exp}: " + " ".join(files))
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser(
        "targets", help="print the files of a table/figure (hand them to snakemake to rerun it)"
    )
    t.add_argument("name", help=f"one of {', '.join(NAMES)}, or all")
    t.add_argument("--config", nargs="+", default=["config/config.yaml"])
    t.add_argument("--cells", action="store_true", help="also each cell's result files")
    t.set_defaults(handler=_targets_cli)
