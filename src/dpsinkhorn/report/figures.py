"""Figures: ``dpsinkhorn report {fig2,fig4a,fig4b,fig4c,fig5,fig7,eps10} --config FILES --out-dir``
writes ``figures/<name>.{png,pdf,csv}`` (the csv: the plotted numbers; error bars: std over
seeds). matplotlib is imported inside the functions."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    FIGURES_DIR,
    classifiers_of,
    experiment_dir,
    figure_experiment,
    paper_figure_datasets,
)
from dpsinkhorn.config.studies import FIGURE_STUDIES, study_cells
from dpsinkhorn.config.targets import SAMPLE_FIGURES, TITLES, gradstudy_file, sample_name
from dpsinkhorn.report.common import (
    DATASET_TITLES,
    METRIC_TITLES_TEX,
    METRICS,
    ConfigLike,
    PathLike,
    check_exist,
    csv_text,
    epsilon_text,
    format_g,
    load_config_like,
    md_table,
    metric_cells,
    metric_columns,
    require_keys,
)
from dpsinkhorn.report.grids import draw_grid, grid_classes, sample_grid
from dpsinkhorn.report.paper import PAPER_CLAIM, PAPER_DP
from dpsinkhorn.report.studies import CellResult, measure_study, require_study


def _figure(nrows: int, ncols: int, width: float = 4.2, height: float = 3.2):
    from matplotlib.figure import Figure  # Agg via Figure.savefig; no pyplot state

    fig = Figure(figsize=(width * ncols, height * nrows), dpi=100)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save_figure(
    fig, out_dir: Path, name: str, columns: Sequence[str], records: list, title: str = ""
) -> list[Path]:
    """Write ``figures/<name>.{png,pdf}`` and the plotted numbers as ``<name>.csv``."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    paths = [out_dir / FIGURES_DIR / f"{name}.{suffix}" for suffix in ("png", "pdf", "csv")]
    for path, suffix in zip(paths[:2], ("png", "pdf"), strict=True):
        # No creation date in a PDF: a rerun's figure is the same bytes (PNGs have none).
        metadata = {"CreationDate": None} if suffix == "pdf" else None
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix, bbox_inches="tight", metadata=metadata)
    fileio.write_text(paths[2], csv_text(columns, records))
    return paths


Value = Callable[[CellResult], tuple[float, float] | None]


def _claim_line(ax, value: float, label: str) -> None:
    ax.axvline(value, color="k", ls="--", lw=1, label=f"paper's claimed row: {label}")


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
) -> None:
    """One errorbar line per series, sorted by x (non-finite x left out); error bars: std."""
    seeds = max((r.row.seeds for r in results), default=1)
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
    """A cell's row of a figure's CSV (:data:`FIGURE_CSV_COLUMNS`, ``error_<model>``: 100 −
    accuracy in %, and ``extra``)."""
    record = {"cell": r.label, "experiment": r.experiment, "base": r.base}
    record |= {key: r.spec[key] for key in ("dataset", "lr", "optimizer", "p", "m")}
    record |= {"sigma": r.sigma, "steps": r.steps, "epsilon": r.row.epsilon}
    record["epsilon_paper_convention"] = r.row.epsilon_paper
    acc = {m.removeprefix("acc_"): v for m, v in r.row.mean.items() if m.startswith("acc_")}
    errors = {f"error_{m}": 100.0 - v for m, v in acc.items() if v is not None}
    return record | metric_cells(r.row) | errors | extra


FIGURE_CSV_COLUMNS = (
    *"cell experiment base series dataset lr optimizer p m sigma steps epsilon".split(),
    "epsilon_paper_convention",
    *metric_columns(METRICS),
)


def _classifiers(config: Mapping, results: Sequence[CellResult]) -> list[str]:
    datasets = dict.fromkeys(r.spec["dataset"] for r in results)
    return list(dict.fromkeys(m for d in datasets for m in classifiers_of(config, d)))


def _series(results: Sequence[CellResult], label: Callable[[CellResult], str]):
    """Series name of a cell, prefixed by its base experiment where the study has several."""
    several = len({r.base for r in results}) > 1
    return lambda r: f"{r.base}: {label(r)}" if several else label(r)


def _sweep_figure(config: Mapping, out_dir: Path, name: str) -> list[Path]:
    """Figure 4a (FID and accuracy against the learning rate, a line per optimiser) or 4b
    (FID and each classifier's error rate against the sound ε, a line per m)."""
    results = measure_study(config, out_dir, name)
    models = _classifiers(config, results)
    panels = [("fid", False, "FID ↓")]  # (metric, as error rate, y label)
    if name == "fig4a":
        model = "cnn" if "cnn" in models else models[-1]
        series = _series(results, lambda r: r.spec["optimizer"])
        panels.append((f"acc_{model}", False, f"{model.upper()} accuracy (%) ↑"))
        x_of, xlabel, width, models = (lambda r: r.spec["lr"]), "learning rate", 4.2, []
    else:
        series = _series(results, lambda r: f"m = {r.spec['m']:g}")
        panels += [(f"acc_{m}", True, f"{m} error rate (%) ↓") for m in models]
        x_of, xlabel, width = (lambda r: r.row.epsilon), "ε (sound)", 3.6
    fig, axes = _figure(1, len(panels), width=width)
    for ax, (metric, error, ylabel) in zip(axes[0], panels, strict=True):
        _plot_lines(ax, results, x_of, series, _metric(metric, error))
        if name == "fig4a":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    records = [_figure_record(r, series=series(r)) for r in results]
    columns = (*FIGURE_CSV_COLUMNS, *(f"error_{m}" for m in models))
    return _save_figure(fig, out_dir, name, columns, records, TITLES[name])


def _fig5(config: Mapping, out_dir: Path) -> list[Path]:
    results = measure_study(config, out_dir, "fig5")
    datasets = list(dict.fromkeys(r.spec["dataset"] for r in results))
    fig, axes = _figure(2, len(datasets))
    records = []
    for col, dataset in enumerate(datasets):
        in_dataset = [r for r in results if r.spec["dataset"] == dataset]
        models = classifiers_of(config, dataset)
        panels = [(0, "FID", _metric("fid"))]
        panels += [(1, m, _metric(f"acc_{m}", error=True)) for m in models]
        for row, label, value in panels:
            series = _series(in_dataset, lambda r, label=label: label)
            _plot_lines(axes[row, col], in_dataset, lambda r: r.spec["p"], series, value)
        axes[0, col].set_title(DATASET_TITLES.get(dataset, dataset), fontsize=9)
        axes[0, col].set_ylabel("FID ↓")
        axes[1, col].set_ylabel("error rate (%) ↓")
        for ax in axes[:, col]:
            ax.set_xlabel("p (debiasing fraction)")
        series = _series(in_dataset, lambda r: r.spec["dataset"])
        records += [_figure_record(r, series=series(r)) for r in in_dataset]
    models = _classifiers(config, results)
    columns = (*FIGURE_CSV_COLUMNS, *(f"error_{m}" for m in models))
    return _save_figure(fig, out_dir, "fig5", columns, records, TITLES["fig5"])


#: The per-p lists of ``evaluate.gradstudy``'s file that Figure 4c's CSV holds.
GRADSTUDY_LISTS = ("bias", "bias_relative", "variance", "variance_normalised", "bias_noise_floor")
GRADSTUDY_KEYS = ("trained_p", "p", "batches", *GRADSTUDY_LISTS)
FIG4C_COLUMNS = ("cell", "experiment", "trained_p", "p", *GRADSTUDY_LISTS, "batches")


def _fig4c(config: Mapping, out_dir: Path) -> list[Path]:
    cells = study_cells(config, "fig4c")
    paths = {c.experiment: Path(gradstudy_file(out_dir, c.experiment)) for c in cells}
    check_exist(paths.values())
    fig, axes = _figure(1, 2)
    records, studied = [], {}  # experiment -> its gradient study (one per experiment)
    for cell in cells:
        if cell.experiment in studied:
            continue
        path = paths[cell.experiment]
        data = studied[cell.experiment] = require_keys(fileio.read_json(path), GRADSTUDY_KEYS, path)
        for i, p in enumerate(data["p"]):
            record = {"cell": cell.label, "experiment": cell.experiment, "p": p}
            record |= {key: data[key] for key in ("trained_p", "batches")}
            records.append(record | {key: data[key][i] for key in GRADSTUDY_LISTS})
    for ax, key, ylabel in [
        (axes[0, 0], "bias_relative", "relative bias ‖E G_p − E G_1‖ / ‖E G_1‖"),
        (axes[0, 1], "variance_normalised", "variance tr Cov(G_p) / tr Cov(G_0)"),
    ]:
        for data in sorted(studied.values(), key=lambda data: float(data["trained_p"])):
            ys = [np.nan if v is None else float(v) for v in data[key]]
            ax.plot(data["p"], ys, marker="o", ms=4, label=f"trained p = {data['trained_p']:g}")
        ax.set_xlabel("p of the estimator G_p")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if studied:
            ax.legend(fontsize=7)
    return _save_figure(fig, out_dir, "fig4c", FIG4C_COLUMNS, records, TITLES["fig4c"])


def _samples_figure(config: Mapping, out_dir: Path, name: str) -> list[Path]:
    per_class = SAMPLE_FIGURES[name]
    datasets = paper_figure_datasets(config)
    if not datasets:
        raise ValueError(
            f"{name}: the config has no Table 1 DP experiment (table1_row: paper or sound10) "
            "whose samples it would show"
        )
    seed = config["seeds"][0]
    sources = {
        d: experiment_dir(config, out_dir, figure_experiment(config, d)) / sample_name(seed)
        for d in datasets
    }
    check_exist(sources.values())
    side_by_side = name == "fig2"
    panels, records = [], []
    for dataset, path in sources.items():
        images, labels, names = grid_classes(*fileio.load_samples(path), dataset)
        panels.append((dataset, sample_grid(images, labels, len(names), per_class), names))
        for c, class_name in enumerate(names):
            available = int(np.count_nonzero(labels == c))
            shown = min(available, per_class)
            exp = figure_experiment(config, dataset)
            values = (dataset, exp, seed, str(path), c, class_name, shown, available)
            records.append(dict(zip(SAMPLES_CSV_COLUMNS, values, strict=True)))
    rows = max(len(n) for _, _, n in panels)
    width, height = 1.5 + 0.4 * per_class, 0.8 + 0.4 * rows
    nrows, ncols = (1, len(panels)) if side_by_side else (len(panels), 1)
    fig, axes = _figure(nrows, ncols, width, height)
    for ax, (dataset, grid, names) in zip(axes.flat, panels, strict=True):
        title = f"{DATASET_TITLES.get(dataset, dataset)}: {figure_experiment(config, dataset)}"
        draw_grid(ax, grid, names, f"{title} (seed {seed})", fontsize=7)
    return _save_figure(fig, out_dir, name, SAMPLES_CSV_COLUMNS, records)


SAMPLES_CSV_COLUMNS = (*"dataset experiment seed samples class class_name shown available".split(),)
EPS10_COLUMNS = (*FIGURE_CSV_COLUMNS, "batch_size", "clipping", "noise_multiplier")


def _eps10_results(config: Mapping, out_dir: Path) -> list[CellResult]:
    return measure_study(config, out_dir, "eps10", paper=lambda spec: PAPER_DP["mnist"])


def _eps10_label(r: CellResult) -> str:
    sigma = "σ –" if r.sigma is None else f"σ {r.sigma:.3g}"
    return f"{r.label} (B {r.spec['batch_size']}, {r.steps} steps, {sigma})"


def _eps10(config: Mapping, out_dir: Path) -> list[Path]:
    """Accuracy and FID of each cell at a sound ε = 10, the paper's claimed row as a line."""
    results = _eps10_results(config, out_dir)
    seeds = len(config["seeds"])
    models = _classifiers(config, results)
    fig, axes = _figure(1, 2, width=5.0, height=1.8 + 0.35 * len(results))
    # (panel, label, metric, offset of its points from the cell's line)
    series = [(0, m, f"acc_{m}", 0.2 * (k - (len(models) - 1) / 2)) for k, m in enumerate(models)]
    for panel, label, metric, offset in [*series, (1, "FID", "fid", 0.0)]:
        points = [(y + offset, _metric(metric)(r)) for y, r in enumerate(results)]
        points = [(y, v) for y, v in points if v]
        if points:
            heights, values = zip(*points, strict=True)
            means, stds = zip(*values, strict=True)
            xerr = stds if seeds > 1 else None
            axes[0, panel].errorbar(means, heights, xerr=xerr, fmt="o", ms=4, label=label)
    _claim_line(axes[0, 0], PAPER_CLAIM["acc_cnn"], f"CNN {PAPER_CLAIM['acc_cnn']:g}%")
    axes[0, 0].set_xlabel("accuracy on the real test set (%) ↑")
    _claim_line(axes[0, 1], PAPER_CLAIM["fid"], f"FID {PAPER_CLAIM['fid']:g}")
    axes[0, 1].set_xlabel("FID ↓")
    for ax in axes[0]:
        ax.set_yticks(range(len(results)), [_eps10_label(r) for r in results], fontsize=7)
        ax.invert_yaxis()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=2)
    records = []
    for r in results:
        extra = {key: r.spec[key] for key in ("batch_size", "clipping")}
        z = r.privacy.get("noise_multiplier")
        records.append(_figure_record(r, series=r.spec["clipping"], noise_multiplier=z, **extra))
    return _save_figure(fig, out_dir, "eps10", EPS10_COLUMNS, records, TITLES["eps10"])


def eps10_section(config: Mapping, out_dir: Path) -> list[str]:
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
    ]
    header = ["Cell", "B", "steps", "clipping", "σ", "lr", "p", "ε (sound)", "FID"]
    header += [METRIC_TITLES_TEX[f"acc_{m}"] for m in models] + ["CNN − paper"]
    table = []
    for r in results:

        def cell(metric: str, r: CellResult = r) -> str:
            mean, std = r.row.mean.get(metric), r.row.std.get(metric)
            if mean is None:
                return "–"
            return f"{mean:.1f}" + (f" ± {std:.1f}" if r.row.seeds > 1 and std else "")

        cnn = r.row.mean.get("acc_cnn")
        diff = "–" if cnn is None else f"{cnn - PAPER_CLAIM['acc_cnn']:+.1f}"
        cells = [r.label, str(r.spec["batch_size"]), str(r.steps), r.spec["clipping"]]
        cells += [format_g(r.sigma), f"{r.spec['lr']:g}", f"{r.spec['p']:g}"]
        cells += [epsilon_text(r.row.epsilon, False), cell("fid")]
        table.append([*cells, *(cell(f"acc_{m}") for m in models), diff])
    return lines + md_table(header, table) + [""]


FIGURE_BUILDERS = {
    "fig4a": lambda config, out_dir: _sweep_figure(config, out_dir, "fig4a"),
    "fig4b": lambda config, out_dir: _sweep_figure(config, out_dir, "fig4b"),
    "fig4c": _fig4c,
    "fig5": _fig5,
    "eps10": _eps10,
}


def figure(name: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``figures/<name>.{png,pdf,csv}``; return the paths."""
    (config, files), out_dir = load_config_like(config), Path(out_dir)
    if name in SAMPLE_FIGURES:
        return _samples_figure(config, out_dir, name)
    if name not in FIGURE_BUILDERS:
        raise ValueError(
            f"unknown figure {name!r} (one of {', '.join([*FIGURE_STUDIES, *SAMPLE_FIGURES])})"
        )
    require_study(config, name, files)
    return FIGURE_BUILDERS[name](config, out_dir)
