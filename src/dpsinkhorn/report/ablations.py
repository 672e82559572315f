"""Tables 2, 4, 5, Figures 2, 4a, 4b, 4c, 5, 7, reproduction.md and the report captions.

``dpsinkhorn report <name> --config FILES --out-dir results/<run>`` for ``name`` in
:data:`REPORTS` (sub-commands added to ``dpsinkhorn report`` by :func:`register_reports`).

* Tables (``tables/<name>.{md,csv,tex}``): one row per cell of the study
  (:func:`dpsinkhorn.config.studies.study_cells`, in its order), mean ± std over the seeds as in
  Table 1 (:func:`dpsinkhorn.report.core.measured_row`). The paper's value is found by the
  cell's *settings*, never its label: Table 2 by (perturbation, loss, debiasing), Tables 4
  and 5 by (σ, Δ, p, m); a cell that matches no row of the paper shows no paper value.
* Figures (``figures/<name>.{png,pdf,csv}``; the csv holds the plotted numbers): fig4a
  (learning rate × optimiser), fig4b (sound ε × m), fig4c (gradient bias and variance
  against p, from each cell's ``gradstudy.json``), fig5 (p, one column per dataset), and
  the sample grids fig2 (10 per class) and fig7 (20 per class) of each dataset's Table 1
  DP experiment. Error bars are the std over seeds where there is more than one seed.
* ``reproduction.md``: every cell of every table of the run that the paper reports,
  with paper value, ours and the difference.
* :func:`caption`: a plain-text paragraph saying what was run for an output (used by
  ``snakemake --report``); it reads privacy.json where it exists and never fails on
  missing result files.
"""

from __future__ import annotations

import argparse
import csv
import io as _io
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    classifiers_of,
    experiment,
    figure_datasets,
    figure_experiment,
    load_config,
    report_tables,
    table1_experiments,
    table_experiments,
)
from dpsinkhorn.config.studies import (
    FIGURE_STUDIES,
    STUDIES,
    TABLE_STUDIES,
    configured_studies,
    study_cells,
    study_experiments,
)
from dpsinkhorn.config.targets import MAIN_TABLES, NAMES, SAMPLE_FIGURES, TITLES
from dpsinkhorn.report import core as report

TABLES = TABLE_STUDIES
FIGURES = FIGURE_STUDIES
#: The ``dpsinkhorn report`` sub-commands this module adds, in the paper's order.
REPORTS = tuple(n for n in NAMES if n not in MAIN_TABLES)
#: Every output :func:`caption` describes.
CAPTIONED = NAMES

# ------------------------------------------------------------------- paper values

#: The final paper's Table 2 (MNIST, ε = 10): (perturbation, loss, debiasing) -> (FID, MLP, CNN).
PAPER_TABLE2 = {
    ("parameter", "L2", "No"): (218.6, 79.9, 80.7),
    ("image", "L2", "No"): (124.3, 82.0, 80.8),
    ("image", "L1", "No"): (73.9, 68.4, 65.7),
    ("image", "L1+L2", "No"): (89.1, 80.8, 77.6),
    ("image", "L1+L2", "Full"): (86.0, 68.7, 66.7),
    ("image", "L1+L2", "Semi"): (48.4, 82.7, 83.2),
}
#: Appendix Table 4 (MNIST, ε = 10): (σ, Δ, p, m) -> (FID, Log Reg, MLP, CNN).
PAPER_TABLE4 = {
    (1.1, 1.0, 0.2, 1.0): (75.0, 81.2, 82.6, 79.5),
    (1.3, 1.0, 0.2, 1.0): (80.0, 81.9, 82.4, 80.1),
    (1.3, 0.3, 0.2, 1.0): (68.8, 79.8, 81.2, 76.9),
    (1.3, 0.7, 0.2, 1.0): (72.0, 79.6, 81.1, 77.0),
    (1.5, 0.5, 0.2, 1.0): (74.5, 82.3, 82.6, 82.1),
    (1.5, 0.7, 0.2, 1.0): (69.2, 80.5, 82.2, 80.8),
    (1.9, 0.5, 0.2, 1.0): (76.4, 80.2, 80.5, 79.2),
    (1.9, 0.7, 0.2, 1.0): (70.3, 82.2, 83.4, 80.5),
    (1.5, 0.5, 0.4, 1.0): (48.4, 82.8, 82.7, 83.2),
}
#: Appendix Table 5 (Fashion-MNIST, ε = 10): (σ, Δ, p, m) -> (FID, Log Reg, MLP, CNN).
PAPER_TABLE5 = {
    (1.1, 1.0, 0.2, 1.0): (140.0, 74.0, 74.0, 68.0),
    (1.3, 0.3, 0.2, 1.0): (156.6, 74.1, 74.5, 65.8),
    (1.3, 0.7, 0.2, 1.0): (157.9, 74.0, 74.2, 65.8),
    (1.5, 0.5, 0.2, 1.0): (163.4, 73.7, 74.4, 67.5),
    (1.5, 0.7, 0.2, 1.0): (161.5, 73.9, 74.2, 69.3),
    (1.9, 0.5, 0.2, 1.0): (153.8, 73.5, 73.9, 69.4),
    (1.9, 0.7, 0.2, 1.0): (154.7, 73.9, 73.9, 68.4),
    (1.9, 0.5, 0.4, 1.0): (133.0, 73.2, 73.2, 69.6),
    (1.9, 0.5, 0.4, 3.0): (128.3, 75.1, 74.6, 71.1),
}
PAPER_DATASET = {"table2": "mnist", "table4": "mnist", "table5": "fmnist"}
TABLE_METRICS = {
    "table2": ("fid", "acc_mlp", "acc_cnn"),
    "table4": report.METRICS,
    "table5": report.METRICS,
}
PAPER_EPSILON = 10.0  # every row of Tables 2, 4, 5 (paper convention)
ACCOUNTING_NOTE = (
    "ε (sound) is the accountant's ε; ε (paper conv.) is the same run under the paper's "
    "accounting convention, which the paper reports as ε = 10."
)

PathLike = str | os.PathLike
ConfigLike = Mapping | Sequence[PathLike] | PathLike


def loss_kind(spec: Mapping) -> str:
    """'L2', 'L1' or 'L1+L2': the cost of an experiment (mixed with m = 0 is L2)."""
    cost = spec.get("cost") or "mixed"
    if cost == "l1":
        return "L1"
    if cost == "l2" or not spec.get("m"):
        return "L2"
    return "L1+L2"


def debiasing_kind(p: float) -> str:
    """'No' (p = 0), 'Full' (p = 1) or 'Semi' (0 < p < 1)."""
    return "No" if p == 0 else "Full" if p == 1 else "Semi"


def perturbation_kind(spec: Mapping) -> str:
    return spec.get("perturbation") or "image"


def _key(*values: float) -> tuple[float, ...]:
    return tuple(round(float(v), 6) for v in values)


def paper_values(table: str, spec: Mapping) -> tuple[float, ...] | None:
    """The paper's numbers of the row with this experiment's settings, or None."""
    if spec["dataset"] != PAPER_DATASET[table] or spec["method"] != "dp_sinkhorn":
        return None
    if table == "table2":
        key = (perturbation_kind(spec), loss_kind(spec), debiasing_kind(spec["p"]))
        return PAPER_TABLE2.get(key)
    if spec["sigma"] is None or perturbation_kind(spec) != "image" or loss_kind(spec) != "L1+L2":
        return None
    paper = PAPER_TABLE4 if table == "table4" else PAPER_TABLE5
    lookup = {_key(*k): v for k, v in paper.items()}
    return lookup.get(_key(spec["sigma"], spec["clip"], spec["p"], spec["m"]))


# --------------------------------------------------------------------- collecting


@dataclass
class CellResult:
    """One study cell measured in this run."""

    label: str
    experiment: str
    base: str
    spec: dict
    row: report.Row
    privacy: dict  # privacy.json of a DP experiment, else {}

    @property
    def sigma(self) -> float | None:
        return self.privacy.get("sigma", self.spec.get("sigma"))

    @property
    def steps(self) -> int | None:
        return self.privacy.get("steps", self.spec.get("steps"))


def _load(config: ConfigLike) -> tuple[dict, list[str]]:
    """(validated config, its files): from config file(s), or an already loaded mapping."""
    if isinstance(config, Mapping):
        return dict(config), []
    files = [config] if isinstance(config, str | os.PathLike) else list(config)
    return load_config(files), [str(f) for f in files]


def _require_study(config: Mapping, name: str, files: Sequence[str] = ()) -> None:
    if name not in configured_studies(config):
        where = f" ({', '.join(files)})" if files else ""
        have = ", ".join(configured_studies(config)) or "none"
        raise ValueError(
            f"the config{where} has no study {name!r}: add studies.{name} to it "
            f"(studies it has: {have})"
        )


def experiment_files(config: Mapping, out_dir: Path, name: str) -> list[Path]:
    """The per-seed results and privacy report one experiment's row reads."""
    spec = experiment(config, name)
    exp_dir = out_dir / name
    files = []
    for seed in config["seeds"]:
        files.append(exp_dir / f"fid_seed{seed}.json")
        files += [
            exp_dir / f"acc_{m}_seed{seed}.json" for m in classifiers_of(config, spec["dataset"])
        ]
    if spec["method"] == "dp_sinkhorn":
        files.append(exp_dir / "privacy.json")
    return files


def measure_study(
    config: Mapping,
    out_dir: Path,
    study: str,
    paper: Callable[[Mapping], Sequence[float | None] | None] | None = None,
    metrics: Sequence[str] = report.METRICS,
) -> list[CellResult]:
    """Every cell of a study, measured: mean ± std over seeds, ε, privacy report."""
    cells = study_cells(config, study)
    names = list(dict.fromkeys(c.experiment for c in cells))
    report._check_exist(f for n in names for f in experiment_files(config, out_dir, n))
    results = []
    for cell in cells:
        spec = experiment(config, cell.experiment)
        values = (paper(spec) if paper else None) or (None,) * len(metrics)
        row = report.measured_row(config, out_dir, cell.experiment, cell.label, values, metrics)
        privacy = {}
        if spec["method"] == "dp_sinkhorn":
            privacy = fileio.read_json(out_dir / cell.experiment / "privacy.json")
        results.append(CellResult(cell.label, cell.experiment, cell.base, spec, row, privacy))
    return results


# ------------------------------------------------------------------------ helpers


def _g(value: float | None, missing: str = "–") -> str:
    return missing if value is None else f"{value:g}"


def _files_text(files: Sequence[str], config: Mapping) -> str:
    if files:
        return f"config file{'s' if len(files) > 1 else ''} {', '.join(files)}"
    return f"the config of run {config.get('run_name', '?')}"


def _seeds_text(config: Mapping) -> str:
    seeds = config["seeds"]
    return (
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} "
        f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''}: each seed one synthetic set of "
        f"{config['evaluation']['num_samples']} samples and one training of each classifier)"
    )


def _budget_note(results: Sequence[CellResult]) -> str:
    """How the cells' lengths or noise were set when they were solved from a target ε."""
    notes = set()
    for r in results:
        spec = r.spec
        if spec["method"] != "dp_sinkhorn" or spec.get("target_epsilon") is None:
            continue
        if spec["sigma"] is not None and spec["steps"] is not None:
            continue
        solved = "steps" if spec["steps"] is None else "σ"
        convention = spec.get("epsilon_convention") or "sound"
        notes.add(
            f"{solved} solved so that ε = {spec['target_epsilon']:g} under the {convention} "
            "convention"
        )
    if not notes:
        return ""
    return "Cells with a target ε: " + "; ".join(sorted(notes)) + "."


def _write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping]) -> Path:
    buffer = _io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    fileio.write_text(path, buffer.getvalue())
    return path


def _csv_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return report._num(value, 6)
    return str(value)


# ------------------------------------------------------------------------- tables


def _table_row_cells(table: str, r: CellResult) -> list[str]:
    """The settings columns of a Markdown row (Table 2: components; 4/5: σ, Δ, p, m, steps)."""
    spec = r.spec
    if table == "table2":
        debias = debiasing_kind(spec["p"])
        debias += f" (p = {spec['p']:g})" if debias == "Semi" else ""
        image = "Yes" if perturbation_kind(spec) == "image" else "No"
        return [image, loss_kind(spec), debias]
    return [_g(r.sigma), _g(spec["clip"]), _g(spec["p"]), _g(spec["m"]), _g(r.steps)]


def _settings_record(r: CellResult) -> dict:
    spec = r.spec
    return {
        "cell": r.label,
        "experiment": r.experiment,
        "dataset": spec["dataset"],
        "method": spec["method"],
        "perturbation": perturbation_kind(spec),
        "cost": spec.get("cost") or "mixed",
        "loss": loss_kind(spec),
        "debiasing": debiasing_kind(spec["p"]),
        "sigma": None if r.sigma is None else float(r.sigma),
        "clip": float(spec["clip"]),
        "p": float(spec["p"]),
        "m": float(spec["m"]),
        "lr": float(spec["lr"]),
        "optimizer": spec["optimizer"],
        "steps": r.steps,
        "epsilon": r.row.epsilon,
        "epsilon_paper_convention": r.row.epsilon_paper,
    }


SETTINGS_COLUMNS = (
    "cell",
    "experiment",
    "dataset",
    "method",
    "perturbation",
    "cost",
    "loss",
    "debiasing",
    "sigma",
    "clip",
    "p",
    "m",
    "lr",
    "optimizer",
    "steps",
    "epsilon",
    "epsilon_paper_convention",
)


def table_csv_columns(table: str) -> tuple[str, ...]:
    """CSV header of a study table: settings, each metric and its std, the paper's values."""
    metrics = TABLE_METRICS[table]
    cells = [c for m in metrics for c in (m, f"{m}_std")]
    return (*SETTINGS_COLUMNS, *cells, *(f"paper_{m}" for m in metrics))


def _table_csv(table: str, results: Sequence[CellResult]) -> str:
    buffer = _io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    columns = table_csv_columns(table)
    writer.writerow(columns)
    for r in results:
        record = _settings_record(r)
        for metric in TABLE_METRICS[table]:
            record[metric] = r.row.mean.get(metric)
            record[f"{metric}_std"] = r.row.std.get(metric)
            record[f"paper_{metric}"] = r.row.paper.get(metric)
        writer.writerow([_csv_value(record.get(c)) for c in columns])
    return buffer.getvalue()


def _table_markdown(
    table: str, results: Sequence[CellResult], config: Mapping, files: Sequence[str]
) -> str:
    metrics = TABLE_METRICS[table]
    seeds = len(config["seeds"])
    match = (
        "(perturbation, loss, debiasing) in the final paper's Table 2"
        if table == "table2"
        else f"(σ, Δ, p, m) in the appendix's Table {table.removeprefix('table')}"
    )
    deltas = sorted({f"{r.spec['delta']:g}" for r in results if r.privacy})
    caption = (
        f"Run {config.get('run_name', '?')} ({_files_text(files, config)}): one row per cell of "
        f"the study {table} (in its order), each cell an experiment trained for this run. "
        f"Values are mean ± std over {seeds} seed(s) (sample std, ddof=1; no ± for one seed); "
        f"each seed is one synthetic set of {config['evaluation']['num_samples']} samples and "
        "one training of each classifier, evaluated on the real test set; FID against the "
        f"real test set. `(paper X)` is the value of the paper's row with the same settings, "
        f"{match}; a cell matching no row of the paper shows none. {ACCOUNTING_NOTE}"
        + (f" δ = {', '.join(deltas)}." if deltas else "")
        + " Accuracy in %."
    )
    budget = _budget_note(results)
    lines = [f"# {TITLES[table]}", "", caption + (f" {budget}" if budget else ""), ""]
    public = report.guarantee_note([r.row for r in results])
    lines += [public, ""] if public else []
    if table == "table2":
        settings = ["Image gradient perturbation", "Loss", "Debiasing"]
    else:
        settings = ["σ", "Δ", "p", "m", "steps"]
    header = ["Cell", *settings, "ε (sound)", "ε (paper conv.)"]
    header += [report.METRIC_TITLES[m] for m in metrics]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        eps_paper = report._eps(r.row.epsilon_paper, False)
        if any(v is not None for v in r.row.paper.values()) and math.isfinite(
            r.row.epsilon_paper or math.inf
        ):
            eps_paper += f" (paper {PAPER_EPSILON:g})"
        cells = [r.label, *_table_row_cells(table, r), report._eps(r.row.epsilon, False)]
        cells += [eps_paper] + [report._cell(r.row, m) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Experiments",
        "",
        "| Cell | Experiment | Based on | Changes |",
        "|---|---|---|---|",
    ]
    for cell in study_cells(config, table):
        changes = ", ".join(f"{k} = {v}" for k, v in cell.changes.items()) or "–"
        lines.append(f"| {cell.label} | `{cell.experiment}` | `{cell.base}` | {changes} |")
    return "\n".join(lines).rstrip() + "\n"


def _table_latex(table: str, results: Sequence[CellResult]) -> str:
    metrics = TABLE_METRICS[table]
    if table == "table2":
        settings = ["Image grad.", "Loss", "Debiasing"]
    else:
        settings = ["$\\sigma$", "$\\Delta$", "$p$", "$m$", "steps"]
    header = [*settings, "$\\varepsilon$", "$\\varepsilon_{\\mathrm{paper}}$"]
    header += [report.METRIC_TITLES_TEX[m] for m in metrics]
    lines = [
        f"% {TITLES[table]}, written by `dpsinkhorn report {table}`. "
        "Needs \\usepackage{booktabs}.",
        "% mean $\\pm$ std over seeds of this run. Accuracy in %.",
        "\\begin{tabular}{" + "l" * len(settings) + "r" * (len(header) - len(settings)) + "}",
        "\\toprule",
        " & ".join(header) + " \\\\",
        "\\midrule",
    ]
    for r in results:
        cells = [report._latex_escape(c) for c in _table_row_cells(table, r)]
        cells += [
            report._eps(r.row.epsilon, False, True),
            report._eps(r.row.epsilon_paper, False, True),
        ]
        cells += [report._cell(r.row, m, " $\\pm$ ", latex=True) for m in metrics]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def study_table_results(config: Mapping, out_dir: Path, table: str) -> list[CellResult]:
    """The rows of Table 2, 4 or 5, with the paper's values of the matching rows."""
    return measure_study(
        config, out_dir, table, lambda spec: paper_values(table, spec), TABLE_METRICS[table]
    )


def study_table(table: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``tables/<table>.{md,csv,tex}`` for Table 2, 4 or 5; return the paths."""
    if table not in TABLES:
        raise ValueError(f"unknown study table {table!r} (one of {', '.join(TABLES)})")
    config, files = _load(config)
    out_dir = Path(out_dir)
    _require_study(config, table, files)
    results = study_table_results(config, out_dir, table)
    md = _table_markdown(table, results, config, files)
    return report._write_tables(
        out_dir, table, md, _table_csv(table, results), _table_latex(table, results)
    )


# ------------------------------------------------------------------------ figures


def _figure(nrows: int, ncols: int, width: float = 4.2, height: float = 3.2):
    from matplotlib.figure import Figure  # Agg via Figure.savefig; no pyplot state

    fig = Figure(figsize=(width * ncols, height * nrows), dpi=100)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save_figure(fig, out_dir: Path, name: str) -> list[Path]:
    fig.tight_layout()
    written = []
    for suffix in ("png", "pdf"):
        path = out_dir / "figures" / f"{name}.{suffix}"
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix, bbox_inches="tight")
        written.append(path)
    return written


Value = Callable[[CellResult], tuple[float, float] | None]


def _metric(metric: str, error: bool = False) -> Value:
    """(mean, std) of a metric of a cell; ``error``: 100 − accuracy (error rate in %)."""

    def value(r: CellResult) -> tuple[float, float] | None:
        mean = r.row.mean.get(metric)
        if mean is None:
            return None
        std = r.row.std.get(metric) or 0.0
        return (100.0 - mean if error else mean), std

    return value


def _plot_lines(
    ax,
    results: Sequence[CellResult],
    x_of: Callable[[CellResult], float],
    series_of: Callable[[CellResult], str],
    value: Value,
    seeds: int,
) -> None:
    """One errorbar line per series, points sorted by x (non-finite x left out)."""
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for r in results:
        x, y = x_of(r), value(r)
        if y is None or x is None or not math.isfinite(x):
            continue
        groups.setdefault(series_of(r), []).append((float(x), *y))
    for label, points in groups.items():
        xs, ys, errs = zip(*sorted(points), strict=True)
        ax.errorbar(
            xs, ys, yerr=errs if seeds > 1 else None, marker="o", ms=4, capsize=3, label=label
        )
    if groups:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _figure_record(r: CellResult, **extra: object) -> dict:
    record = {"cell": r.label, "experiment": r.experiment, "base": r.base}
    record.update(
        dataset=r.spec["dataset"],
        lr=r.spec["lr"],
        optimizer=r.spec["optimizer"],
        p=r.spec["p"],
        m=r.spec["m"],
        sigma=r.sigma,
        steps=r.steps,
        epsilon=r.row.epsilon,
        epsilon_paper_convention=r.row.epsilon_paper,
    )
    for metric in report.METRICS:
        record[metric] = r.row.mean.get(metric)
        record[f"{metric}_std"] = r.row.std.get(metric)
    record.update(extra)
    return record


FIGURE_CSV_COLUMNS = (
    "cell",
    "experiment",
    "base",
    "series",
    "dataset",
    "lr",
    "optimizer",
    "p",
    "m",
    "sigma",
    "steps",
    "epsilon",
    "epsilon_paper_convention",
    *(c for m in report.METRICS for c in (m, f"{m}_std")),
)


def _classifiers(config: Mapping, results: Sequence[CellResult]) -> list[str]:
    datasets = dict.fromkeys(r.spec["dataset"] for r in results)
    return list(dict.fromkeys(m for d in datasets for m in classifiers_of(config, d)))


def _series(results: Sequence[CellResult], label: Callable[[CellResult], str]):
    """Series name of a cell, prefixed by its base experiment where the study has several."""
    several = len({r.base for r in results}) > 1
    return lambda r: f"{r.base}: {label(r)}" if several else label(r)


def _p(r: CellResult) -> float:
    return r.spec["p"]


def _errors(r: CellResult, models: Sequence[str]) -> dict[str, float]:
    """Error rate (100 − accuracy, %) of each classifier with a result."""
    return {
        f"error_{m}": 100.0 - r.row.mean[f"acc_{m}"]
        for m in models
        if r.row.mean.get(f"acc_{m}") is not None
    }


def _fig4a(config: Mapping, out_dir: Path) -> list[Path]:
    results = measure_study(config, out_dir, "fig4a")
    seeds = len(config["seeds"])
    models = _classifiers(config, results)
    model = "cnn" if "cnn" in models else models[-1]
    series = _series(results, lambda r: r.spec["optimizer"])
    fig, axes = _figure(1, 2)
    for ax, metric, ylabel in [
        (axes[0, 0], "fid", "FID ↓"),
        (axes[0, 1], f"acc_{model}", f"{model.upper()} accuracy (%) ↑"),
    ]:
        _plot_lines(ax, results, lambda r: r.spec["lr"], series, _metric(metric), seeds)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(ylabel)
    fig.suptitle(TITLES["fig4a"], fontsize=10)
    written = _save_figure(fig, out_dir, "fig4a")
    records = [_figure_record(r, series=series(r)) for r in results]
    return written + [_write_csv(out_dir / "figures" / "fig4a.csv", FIGURE_CSV_COLUMNS, records)]


def _fig4b(config: Mapping, out_dir: Path) -> list[Path]:
    results = measure_study(config, out_dir, "fig4b")
    seeds = len(config["seeds"])
    models = _classifiers(config, results)
    series = _series(results, lambda r: f"m = {r.spec['m']:g}")
    fig, axes = _figure(1, 1 + len(models), width=3.6)
    panels = [("fid", False, "FID ↓")] + [
        (f"acc_{m}", True, f"{m} error rate (%) ↓") for m in models
    ]
    for ax, (metric, error, ylabel) in zip(axes[0], panels, strict=True):
        _plot_lines(ax, results, lambda r: r.row.epsilon, series, _metric(metric, error), seeds)
        ax.set_xlabel("ε (sound)")
        ax.set_ylabel(ylabel)
    fig.suptitle(TITLES["fig4b"], fontsize=10)
    written = _save_figure(fig, out_dir, "fig4b")
    records = [_figure_record(r, series=series(r), **_errors(r, models)) for r in results]
    columns = (*FIGURE_CSV_COLUMNS, *(f"error_{m}" for m in models))
    return written + [_write_csv(out_dir / "figures" / "fig4b.csv", columns, records)]


def _fig5(config: Mapping, out_dir: Path) -> list[Path]:
    results = measure_study(config, out_dir, "fig5")
    seeds = len(config["seeds"])
    datasets = list(dict.fromkeys(r.spec["dataset"] for r in results))
    fig, axes = _figure(2, len(datasets))
    records = []
    for col, dataset in enumerate(datasets):
        in_dataset = [r for r in results if r.spec["dataset"] == dataset]
        ax = axes[0, col]
        _plot_lines(ax, in_dataset, _p, _series(in_dataset, lambda r: "FID"), _metric("fid"), seeds)
        ax.set_title(report.DATASET_TITLES.get(dataset, dataset), fontsize=9)
        ax.set_ylabel("FID ↓")
        ax = axes[1, col]
        for model in classifiers_of(config, dataset):
            series = _series(in_dataset, lambda r, model=model: model)
            _plot_lines(ax, in_dataset, _p, series, _metric(f"acc_{model}", error=True), seeds)
        ax.set_ylabel("error rate (%) ↓")
        for ax in axes[:, col]:
            ax.set_xlabel("p (debiasing fraction)")
        series = _series(in_dataset, lambda r: r.spec["dataset"])
        models = classifiers_of(config, dataset)
        records += [_figure_record(r, series=series(r), **_errors(r, models)) for r in in_dataset]
    fig.suptitle(TITLES["fig5"], fontsize=10)
    written = _save_figure(fig, out_dir, "fig5")
    models = _classifiers(config, results)
    columns = (*FIGURE_CSV_COLUMNS, *(f"error_{m}" for m in models))
    return written + [_write_csv(out_dir / "figures" / "fig5.csv", columns, records)]


GRADSTUDY_KEYS = ("p", "bias_relative", "variance_normalised")
FIG4C_COLUMNS = ("cell", "experiment", "trained_p", "p", "bias", "bias_relative", "variance")
FIG4C_COLUMNS += ("variance_normalised", "bias_noise_floor", "batches")


def _fig4c(config: Mapping, out_dir: Path) -> list[Path]:
    cells = study_cells(config, "fig4c")
    paths = {c.experiment: out_dir / c.experiment / "gradstudy.json" for c in cells}
    report._check_exist(paths.values())
    fig, axes = _figure(1, 2)
    records, lines = [], []
    for cell in cells:
        if any(cell.experiment == e for e, _ in lines):
            continue
        data = fileio.read_json(paths[cell.experiment])
        missing = [k for k in GRADSTUDY_KEYS if k not in data]
        if missing:
            raise ValueError(f"{paths[cell.experiment]}: missing key(s) {missing}")
        trained_p = data.get("trained_p", experiment(config, cell.experiment)["p"])
        lines.append((cell.experiment, (float(trained_p), cell.label, data)))
        for i, p in enumerate(data["p"]):
            record = {"cell": cell.label, "experiment": cell.experiment, "trained_p": trained_p}
            record["p"], record["batches"] = p, data.get("batches")
            for key in ("bias", "bias_relative", "variance", "variance_normalised"):
                record[key] = (data.get(key) or [None] * len(data["p"]))[i]
            record["bias_noise_floor"] = (data.get("bias_noise_floor") or [None] * len(data["p"]))[
                i
            ]
            records.append(record)
    for ax, key, ylabel in [
        (axes[0, 0], "bias_relative", "relative bias ‖E G_p − E G_1‖ / ‖E G_1‖"),
        (axes[0, 1], "variance_normalised", "variance tr Cov(G_p) / tr Cov(G_0)"),
    ]:
        for _, (trained_p, _label, data) in sorted(lines, key=lambda item: item[1][0]):
            ys = [np.nan if v is None else float(v) for v in data[key]]
            ax.plot(data["p"], ys, marker="o", ms=4, label=f"trained p = {trained_p:g}")
        ax.set_xlabel("p of the estimator G_p")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=7)
    fig.suptitle(TITLES["fig4c"], fontsize=10)
    written = _save_figure(fig, out_dir, "fig4c")
    return written + [_write_csv(out_dir / "figures" / "fig4c.csv", FIG4C_COLUMNS, records)]


def _samples_figure(config: Mapping, out_dir: Path, name: str) -> list[Path]:
    per_class = SAMPLE_FIGURES[name]
    datasets = figure_datasets(config)
    if not datasets:
        raise ValueError(
            f"{name}: the config has no Table 1 DP experiment (table1_row: paper or sound10) "
            "whose samples it would show"
        )
    seed = config["seeds"][0]
    sources = {
        d: out_dir / figure_experiment(config, d) / f"samples_seed{seed}.npz" for d in datasets
    }
    report._check_exist(sources.values())
    side_by_side = name == "fig2"
    panels, records = [], []
    for dataset, path in sources.items():
        images, labels = fileio.load_samples(path)
        names = list(report.CLASS_NAMES.get(dataset) or [])
        if len(names) <= int(labels.max()):
            names = [str(c) for c in range(int(labels.max()) + 1)]
        panels.append((dataset, report.sample_grid(images, labels, len(names), per_class), names))
        for c, class_name in enumerate(names):
            available = int(np.count_nonzero(labels == c))
            records.append(
                {
                    "dataset": dataset,
                    "experiment": figure_experiment(config, dataset),
                    "seed": seed,
                    "samples": str(path),
                    "class": c,
                    "class_name": class_name,
                    "shown": min(available, per_class),
                    "available": available,
                }
            )
    rows = max(len(n) for _, _, n in panels)
    width, height = 1.5 + 0.4 * per_class, 0.8 + 0.4 * rows
    nrows, ncols = (1, len(panels)) if side_by_side else (len(panels), 1)
    fig, axes = _figure(nrows, ncols, width, height)
    for ax, (dataset, grid, names) in zip(axes.flat, panels, strict=True):
        h = (grid.shape[0] + 2) // len(names)
        ax.imshow(grid, cmap="gray" if grid.ndim == 2 else None, vmin=0, vmax=255)
        ax.set_yticks([c * h + (h - 2) / 2 for c in range(len(names))], names, fontsize=7)
        ax.set_xticks([])
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        title = report.DATASET_TITLES.get(dataset, dataset)
        ax.set_title(f"{title}: {figure_experiment(config, dataset)} (seed {seed})", fontsize=9)
    written = _save_figure(fig, out_dir, name)
    columns = ("dataset", "experiment", "seed", "samples", "class", "class_name", "shown")
    columns += ("available",)
    return written + [_write_csv(out_dir / "figures" / f"{name}.csv", columns, records)]


#: The paper's claimed MNIST DP-Sinkhorn row (final Table 1), reported as ε = 10 under its
#: convention: the reference line of the sound ε = 10 study.
PAPER_CLAIM = dict(zip(report.METRICS, report.PAPER_DP["mnist"], strict=True))
EPS10_COLUMNS = (*FIGURE_CSV_COLUMNS, "batch_size", "clipping", "noise_multiplier")


def _eps10_results(config: Mapping, out_dir: Path) -> list[CellResult]:
    return measure_study(config, out_dir, "eps10", paper=lambda spec: report.PAPER_DP["mnist"])


def _eps10_label(r: CellResult) -> str:
    sigma = "σ –" if r.sigma is None else f"σ {r.sigma:.3g}"
    return f"{r.label} (B {r.spec['batch_size']}, {r.steps} steps, {sigma})"


def _eps10(config: Mapping, out_dir: Path) -> list[Path]:
    """Accuracy and FID of each cell at a sound ε = 10, the paper's claimed row as a line."""
    results = _eps10_results(config, out_dir)
    seeds = len(config["seeds"])
    models = _classifiers(config, results)
    fig, axes = _figure(1, 2, width=5.0, height=1.8 + 0.35 * len(results))
    ys = np.arange(len(results), dtype=float)
    ax = axes[0, 0]
    for k, model in enumerate(models):
        points = [(y, _metric(f"acc_{model}")(r)) for y, r in zip(ys, results, strict=True)]
        points = [(y + 0.2 * (k - (len(models) - 1) / 2), v) for y, v in points if v]
        if points:
            means, stds = [v[0] for _, v in points], [v[1] for _, v in points]
            ax.errorbar(means, [y for y, _ in points], xerr=stds if seeds > 1 else None,
                        fmt="o", ms=4, label=model)  # fmt: skip
    ax.axvline(PAPER_CLAIM["acc_cnn"], color="k", ls="--", lw=1,
               label=f"paper's claimed row: CNN {PAPER_CLAIM['acc_cnn']:g}%")  # fmt: skip
    ax.set_xlabel("accuracy on the real test set (%) ↑")
    ax = axes[0, 1]
    fid = [(y, _metric("fid")(r)) for y, r in zip(ys, results, strict=True)]
    fid = [(y, v) for y, v in fid if v]
    if fid:
        ax.errorbar([v[0] for _, v in fid], [y for y, _ in fid], fmt="o", ms=4, label="FID",
                    xerr=[v[1] for _, v in fid] if seeds > 1 else None)  # fmt: skip
    ax.axvline(PAPER_CLAIM["fid"], color="k", ls="--", lw=1,
               label=f"paper's claimed row: FID {PAPER_CLAIM['fid']:g}")  # fmt: skip
    ax.set_xlabel("FID ↓")
    for ax in axes[0]:
        ax.set_yticks(ys, [_eps10_label(r) for r in results], fontsize=7)
        ax.invert_yaxis()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=2)
    fig.suptitle(TITLES["eps10"], fontsize=10)
    written = _save_figure(fig, out_dir, "eps10")
    records = [
        _figure_record(
            r, series=r.spec["clipping"], batch_size=r.spec["batch_size"],
            clipping=r.spec["clipping"], noise_multiplier=r.privacy.get("noise_multiplier"),
        )
        for r in results
    ]  # fmt: skip
    return written + [_write_csv(out_dir / "figures" / "eps10.csv", EPS10_COLUMNS, records)]


def _eps10_section(config: Mapping, out_dir: Path) -> list[str]:
    """reproduction.md's table of the sound ε = 10 study, against the paper's claimed row."""
    results = _eps10_results(config, out_dir)
    models = _classifiers(config, results)
    lines = [
        f"## {TITLES['eps10']}",
        "",
        "Every cell spends a sound ε = 10 (σ solved for its B, steps and clipping mode). "
        f"Goal: the paper's claimed MNIST row, CNN {PAPER_CLAIM['acc_cnn']:g}% (FID "
        f"{PAPER_CLAIM['fid']:g}), which the paper reports as ε = 10 under its convention. "
        "Figure: figures/eps10.png.",
        "",
        "| Cell | B | steps | clipping | σ | lr | p | ε (sound) | FID | "
        + " | ".join(report.METRIC_TITLES_TEX[f"acc_{m}"] for m in models)
        + " | CNN − paper |",
        "|" + "---|" * (10 + len(models)),
    ]
    for r in results:

        def cell(metric: str, r: CellResult = r) -> str:
            mean, std = r.row.mean.get(metric), r.row.std.get(metric)
            if mean is None:
                return "–"
            return f"{mean:.1f}" + (f" ± {std:.1f}" if r.row.seeds > 1 and std else "")

        cnn = r.row.mean.get("acc_cnn")
        diff = "–" if cnn is None else f"{cnn - PAPER_CLAIM['acc_cnn']:+.1f}"
        cells = [r.label, str(r.spec["batch_size"]), str(r.steps), r.spec["clipping"],
                 _g(r.sigma), f"{r.spec['lr']:g}", f"{r.spec['p']:g}",
                 report._eps(r.row.epsilon, False), cell("fid"),
                 *(cell(f"acc_{m}") for m in models), diff]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


FIGURE_BUILDERS = {"fig4a": _fig4a, "fig4b": _fig4b, "fig4c": _fig4c, "fig5": _fig5}
FIGURE_BUILDERS["eps10"] = _eps10


def figure(name: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``figures/<name>.{png,pdf,csv}``; return the paths."""
    config, files = _load(config)
    out_dir = Path(out_dir)
    if name in SAMPLE_FIGURES:
        return _samples_figure(config, out_dir, name)
    if name not in FIGURE_BUILDERS:
        raise ValueError(
            f"unknown figure {name!r} (one of {', '.join([*FIGURES, *SAMPLE_FIGURES])})"
        )
    _require_study(config, name, files)
    return FIGURE_BUILDERS[name](config, out_dir)


# ------------------------------------------------------------------ reproduction


@dataclass
class Reproduced:
    """One cell of a paper table: the paper's value and ours."""

    row: str
    metric: str
    paper: float
    mean: float | None
    std: float | None
    seeds: int

    @property
    def difference(self) -> float | None:
        return None if self.mean is None else self.mean - self.paper


def produced_tables(config: Mapping) -> list[str]:
    """The paper tables this config produces, in the paper's order."""
    names = ["table1"] if table1_experiments(config) else []
    names += report_tables(config)
    names += [t for t in configured_studies(config) if t in TABLES]
    return sorted(names, key=lambda t: int(t.removeprefix("table")))


def _row_cells(label: str, row: report.Row, metrics: Sequence[str]) -> list[Reproduced]:
    return [
        Reproduced(
            label,
            report.METRIC_TITLES_TEX[m],
            row.paper[m],
            row.mean.get(m),
            row.std.get(m),
            row.seeds,
        )
        for m in metrics
        if row.paper.get(m) is not None
    ]


def _epsilon_cell(label: str, row: report.Row, paper: float) -> Reproduced:
    return Reproduced(label, "ε (paper conv.)", paper, row.epsilon_paper, None, 1)


def reproduced_cells(config: Mapping, out_dir: Path, table: str) -> list[Reproduced]:
    """Every cell of ``table`` that the paper reports and this run reproduced."""
    found: list[Reproduced] = []
    if table == "table1":
        for row in report.table1_rows(config, out_dir):
            if row.source != report.THIS_RUN:
                continue
            label = f"{report.DATASET_TITLES.get(row.dataset, row.dataset)}: {row.method}"
            found += _row_cells(label, row, report.METRICS)
            if row.method in {report.ROW_LABELS[k] for k in report.PAPER_SETTING_ROWS}:
                found.append(_epsilon_cell(label, row, report.PAPER_DP_EPSILON))
    elif table in report.CELEBA_TABLES:
        spec = report.CELEBA_TABLES[table]
        paper_eps = {spec.labels[k]: v for k, v in spec.paper_epsilon.items()}
        for row in report.celeba_rows(config, table, out_dir):
            if row.source != report.THIS_RUN:
                continue
            found += _row_cells(row.method, row, report.CELEBA_METRICS)
            if row.method in paper_eps:
                found.append(_epsilon_cell(row.method, row, paper_eps[row.method]))
    else:
        for r in study_table_results(config, out_dir, table):
            if table == "table2":
                settings = f"{perturbation_kind(r.spec)}, {loss_kind(r.spec)}, p = {r.spec['p']:g}"
            else:
                settings = ", ".join(
                    f"{k} {_g(v)}"
                    for k, v in [
                        ("σ", r.sigma),
                        ("Δ", r.spec["clip"]),
                        ("p", r.spec["p"]),
                        ("m", r.spec["m"]),
                    ]
                )
            found += _row_cells(f"{r.label} ({settings})", r.row, TABLE_METRICS[table])
    return found


def _paper_digits(value: float) -> int:
    return 2 if round(value, 1) != value else 1


def _not_paper_scale(config: Mapping, files: Sequence[str]) -> list[str]:
    """Why this run is smaller than the paper's (empty when it is not)."""
    reasons = []
    stems = {Path(f).stem for f in files} | {str(config.get("run_name"))}
    if stems & {"smoke", "quick"}:
        reasons.append(f"config {', '.join(sorted(stems & {'smoke', 'quick'}))}")
    if len(config["seeds"]) < 5:
        reasons.append(f"{len(config['seeds'])} seed(s), the paper averages 5")
    if config["evaluation"]["num_samples"] < 60000:
        reasons.append(f"{config['evaluation']['num_samples']} samples per seed, the paper 60,000")
    return reasons


def reproduction_markdown(config: Mapping, out_dir: Path, files: Sequence[str] = ()) -> str:
    tables = produced_tables(config)
    seeds = config["seeds"]
    lines = [
        f"# {TITLES['reproduction']}",
        "",
        f"Run {config.get('run_name', '?')} ({_files_text(files, config)}); seeds "
        f"{', '.join(map(str, seeds))}; {config['evaluation']['num_samples']} samples per seed. "
        "Every cell of the paper's tables that this run reproduced: the paper's value, ours "
        "(mean ± std over seeds; sample std, ddof=1) and the difference ours − paper. "
        "Accuracy in %. Rows of Tables 2, 4 and 5 are matched to the paper by their settings. "
        f"{ACCOUNTING_NOTE} The smoke and quick configs are NOT paper scale (few steps, "
        "samples and seeds): their numbers test the pipeline and say nothing about the paper.",
        "",
    ]
    reasons = _not_paper_scale(config, files)
    if reasons:
        lines += [f"**This run is not at paper scale** ({'; '.join(reasons)}).", ""]
    for table in tables:
        lines += [f"## {TITLES[table]}", ""]
        cells = reproduced_cells(config, out_dir, table)
        if not cells:
            lines += ["No cell of this run matches a cell of the paper's table.", ""]
            continue
        lines += [
            "| Table | Row | Metric | Paper | Ours (mean ± std) | Difference (ours − paper) |",
            "|---|---|---|---|---|---|",
        ]
        number = table.removeprefix("table")
        for c in cells:
            digits = 2 if c.metric.startswith("ε") else _paper_digits(c.paper)
            ours, diff = "–", "–"
            if c.mean is not None:
                ours = "∞" if math.isinf(c.mean) else f"{c.mean:.{digits}f}"
                if c.seeds > 1 and c.std is not None:
                    ours += f" ± {c.std:.{digits}f}"
                diff = f"{c.difference:+.{digits}f}"
            paper = report._paper_number(c.paper)
            lines.append(f"| {number} | {c.row} | {c.metric} | {paper} | {ours} | {diff} |")
        lines.append("")
    if "eps10" in configured_studies(config):
        lines += _eps10_section(config, out_dir)
    lines += _epsilon_meaning_lines(config, out_dir, tables)
    return "\n".join(lines).rstrip() + "\n"


def _epsilon_meaning_lines(config: Mapping, out_dir: Path, tables: Sequence[str]) -> list[str]:
    """ "What the paper's ε = 10 means": this run's paper-setting rows, then every committed
    results set under ``./results-paper-scale`` (measured at paper scale; cwd = repo root)."""
    from dpsinkhorn.report import resultset

    lines = []
    if "table1" in tables:
        section = resultset.epsilon_meaning(report.table1_rows(config, out_dir), {})
        if section:
            lines += [section[0] + " (this run)", *section[1:]]
    return lines + resultset.epsilon_meaning_of_sets(Path.cwd())


def reproduction(config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``<out_dir>/reproduction.md``; return its path."""
    config, files = _load(config)
    out_dir = Path(out_dir)
    text = reproduction_markdown(config, out_dir, files)
    path = out_dir / "reproduction.md"
    fileio.write_text(path, text)
    return [path]


# ----------------------------------------------------------------------- captions


def _read_privacy(path: Path) -> dict:
    try:
        data = fileio.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _experiment_text(config: Mapping, out_dir: Path, name: str) -> str:
    """'name (dataset, steps, σ, ε)': measured where privacy.json exists, else configured."""
    spec = experiment(config, name)
    dataset = spec["dataset"]
    if spec["method"] == "real_data":
        return f"{name} ({dataset}, real training data)"
    if spec["method"] != "dp_sinkhorn":
        return f"{name} ({dataset}, non-private Sinkhorn, {spec['steps']} steps)"
    privacy = _read_privacy(out_dir / name / "privacy.json")
    eps, eps_paper = privacy.get("epsilon"), privacy.get("epsilon_paper_convention")
    if isinstance(eps, int | float) and privacy.get("steps") is not None:
        sigma = privacy.get("sigma", spec["sigma"])
        text = f"{privacy['steps']} steps, σ {_g(sigma, 'solved')}, ε {eps:.2f} sound"
        if isinstance(eps_paper, int | float):
            text += f" and {eps_paper:.2f} under the paper's convention"
    else:
        steps = "steps solved" if spec["steps"] is None else f"{spec['steps']} steps"
        sigma = "σ solved" if spec["sigma"] is None else f"σ {spec['sigma']:g}"
        if spec.get("target_epsilon") is not None:
            convention = spec.get("epsilon_convention") or "sound"
            eps_text = f"target ε {spec['target_epsilon']:g} ({convention} convention)"
        else:
            eps_text = "ε computed after training"
        text = f"{steps}, {sigma}, {eps_text}"
    return f"{name} ({dataset}, {text}, δ {spec['delta']:g})"


def _caption_experiments(config: Mapping, name: str) -> list[str]:
    if name == "table1":
        return list(table1_experiments(config).values())
    if name in report.CELEBA_TABLES:
        return list(table_experiments(config, name).values())
    if name in SAMPLE_FIGURES:
        return [figure_experiment(config, d) for d in figure_datasets(config)]
    if name == "reproduction":
        return list(
            dict.fromkeys(
                e for t in produced_tables(config) for e in _caption_experiments(config, t)
            )
        )
    return study_experiments(config, name)


def _rst_safe(text: str) -> str:
    """One line of plain text that reStructuredText shows as it is."""
    text = re.sub(r"[`*|\\]", "", text)
    text = re.sub(r"_+(?=[\s.,;:)]|$)", "", text)  # no trailing-underscore references
    return " ".join(text.split())


def caption(
    config: ConfigLike, out_dir: PathLike, name: str, config_files: Sequence[PathLike] = ()
) -> str:
    """One plain-text paragraph saying what was run for output ``name``.

    ``config``: config file(s), or an already validated config mapping (Snakemake's; then
    ``config_files`` may name its files). Reads privacy.json where it exists; never needs
    any result file.
    """
    if name not in CAPTIONED:
        raise ValueError(f"no caption for {name!r} (one of {', '.join(CAPTIONED)})")
    config, files = _load(config)
    files = files or [str(f) for f in config_files]
    out_dir = Path(out_dir)
    if name in STUDIES:
        _require_study(config, name, files)
    exps = [e for e in _caption_experiments(config, name) if e]
    if not exps:
        raise ValueError(f"the config produces no {name!r}: it has no experiment for it")
    parts = [
        f"{TITLES[name]}. Run {config.get('run_name', '?')} from {_files_text(files, config)}."
    ]
    if name in STUDIES:
        cells = study_cells(config, name)
        definition = (config.get("studies") or {}).get(name) or {}
        varied = list(definition.get("vary") or {}) or [k for c in cells for k in c.changes]
        varied_text = ", ".join(dict.fromkeys(varied)) or "nothing"
        parts.append(
            f"{len(cells)} cells from {', '.join(dict.fromkeys(c.base for c in cells))}, "
            f"varying {varied_text}."
        )
    parts.append(
        f"Experiment{'s' if len(exps) > 1 else ''}: "
        + "; ".join(_experiment_text(config, out_dir, e) for e in exps)
        + "."
    )
    if name == "fig4c":
        definition = config["studies"]["fig4c"]
        p_values = definition.get("p_values", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
        parts.append(
            f"Gradient estimator G_p of each trained generator drawn over "
            f"{definition.get('batches', 300)} batches for p in "
            f"{', '.join(f'{p:g}' for p in p_values)}, without clipping or noise "
            "(a non-private analysis of the training data, not a DP release)."
        )
    elif name in SAMPLE_FIGURES:
        parts.append(
            f"Samples of seed {config['seeds'][0]}, {SAMPLE_FIGURES[name]} per class, "
            "one row per class."
        )
    else:
        parts.append(f"Mean and std over {_seeds_text(config)}.")
    if name in report.CELEBA_TABLES:
        try:
            from dpsinkhorn.data.celeba import is_fixture

            if is_fixture(Path(config["data_dir"])):
                parts.append("Data: the synthetic CelebA fixture, not CelebA.")
        except (ImportError, OSError, ValueError):
            pass
    if name == "reproduction":
        reasons = _not_paper_scale(config, files)
        if reasons:
            parts.append(f"Not at paper scale: {'; '.join(reasons)}.")
    public = [
        e
        for e in exps
        if str(_read_privacy(out_dir / e / "privacy.json").get("guarantee", "")).startswith(
            report.NO_GUARANTEE_PREFIX
        )
    ]
    if public:
        parts.append(
            f"No privacy guarantee for {', '.join(public)}: the noise seed was public "
            "(reproducible: true)."
        )
    return _rst_safe(" ".join(parts))


# ---------------------------------------------------------------------------- CLI


def render(name: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write output ``name`` (one of :data:`REPORTS`); return the written paths."""
    if name in TABLES:
        return study_table(name, config, out_dir)
    if name == "reproduction":
        return reproduction(config, out_dir)
    if name in FIGURES or name in SAMPLE_FIGURES:
        return figure(name, config, out_dir)
    raise ValueError(f"unknown report {name!r} (one of {', '.join(REPORTS)})")


REPORT_HELP = {
    "table2": "Table 2 (ablation: perturbation, loss, debiasing): tables/table2.{md,csv,tex}",
    "table4": "Table 4 (MNIST hyper-parameter search): tables/table4.{md,csv,tex}",
    "table5": "Table 5 (Fashion-MNIST hyper-parameter search): tables/table5.{md,csv,tex}",
    "fig2": "Figure 2 (samples, 10 per class): figures/fig2.{png,pdf,csv}",
    "fig4a": "Figure 4a (learning rate x optimiser): figures/fig4a.{png,pdf,csv}",
    "fig4b": "Figure 4b (privacy-utility: sound ε x m): figures/fig4b.{png,pdf,csv}",
    "fig4c": "Figure 4c (gradient bias and variance against p): figures/fig4c.{png,pdf,csv}",
    "fig5": "Figure 5 (FID and error rate against p): figures/fig5.{png,pdf,csv}",
    "fig7": "Figure 7 (samples, 20 per class): figures/fig7.{png,pdf,csv}",
    "eps10": "sound ε = 10 study (B, lr, clipping, p; MNIST): figures/eps10.{png,pdf,csv}",
    "reproduction": "reproduction.md: paper vs this run for every reproduced table cell",
}


def _cli(args: argparse.Namespace) -> int:
    for path in render(args.report, args.config, args.out_dir):
        print(path)
    return 0


def register_reports(reports: argparse._SubParsersAction) -> None:
    """Add :data:`REPORTS` to the ``dpsinkhorn report`` sub-parser."""
    for name in REPORTS:
        sub = reports.add_parser(name, help=REPORT_HELP[name].replace("%", "%%"))
        sub.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
        sub.add_argument(
            "--out-dir", required=True, help="the run's results folder (results/<run>)"
        )
        sub.set_defaults(handler=_cli)
