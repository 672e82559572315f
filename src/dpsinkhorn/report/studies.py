"""Study tables 2, 4, 5: ``dpsinkhorn report {table2,table4,table5} --config FILES --out-dir``.
One row per study cell, as Table 1's rows; the paper's value is found by the cell's
settings, never its label. :func:`measure_study` also serves the figures."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpsinkhorn.config import experiment
from dpsinkhorn.config.studies import TABLE_STUDIES, configured_studies, study_cells
from dpsinkhorn.config.targets import TITLES, evaluation_files, privacy_files
from dpsinkhorn.report.common import (
    ACCOUNTING_NOTE,
    METRIC_TITLES,
    METRIC_TITLES_TEX,
    METRICS,
    ConfigLike,
    PathLike,
    Row,
    booktabs,
    cell_text,
    check_exist,
    config_files_text,
    csv_text,
    epsilon_text,
    format_g,
    guarantee_note,
    latex_cells,
    latex_escape,
    latex_row,
    load_config_like,
    md_table,
    measured_row,
    metric_cells,
    metric_columns,
    write_tables,
)
from dpsinkhorn.report.paper import (
    PAPER_EPSILON,
    TABLE_METRICS,
    debiasing_kind,
    loss_kind,
    paper_values,
)


@dataclass
class CellResult:
    """One study cell measured in this run."""

    label: str
    experiment: str
    base: str
    spec: dict
    row: Row

    @property
    def privacy(self) -> dict:
        """privacy.json of a DP-Sinkhorn experiment, else {}."""
        return self.row.privacy if self.spec["method"] == "dp_sinkhorn" else {}

    @property
    def sigma(self) -> float | None:
        return self.privacy.get("sigma", self.spec.get("sigma"))

    @property
    def steps(self) -> int | None:
        return self.privacy.get("steps", self.spec.get("steps"))


def require_study(config: Mapping, name: str, files: Sequence[str] = ()) -> None:
    if name not in configured_studies(config):
        where = f" ({', '.join(files)})" if files else ""
        have = ", ".join(configured_studies(config)) or "none"
        raise ValueError(
            f"the config{where} has no study {name!r}: add studies.{name} to it "
            f"(studies it has: {have})"
        )


def measure_study(
    config: Mapping,
    out_dir: Path,
    study: str,
    paper: Callable[[Mapping], Sequence[float | None] | None] | None = None,
    metrics: Sequence[str] = METRICS,
) -> list[CellResult]:
    """Every cell of a study, measured: mean ± std over seeds, ε, privacy report."""
    cells = study_cells(config, study)
    names = list(dict.fromkeys(c.experiment for c in cells))
    # what the workflow's study rules read (config.targets): per-seed results, privacy reports
    files = evaluation_files(config, out_dir, names) + privacy_files(config, out_dir, names)
    check_exist(Path(f) for f in files)
    results = []
    for cell in cells:
        spec = experiment(config, cell.experiment)
        values = (paper(spec) if paper else None) or (None,) * len(metrics)
        row = measured_row(config, out_dir, cell.experiment, cell.label, values, metrics)
        results.append(CellResult(cell.label, cell.experiment, cell.base, spec, row))
    return results


def _budget_note(results: Sequence[CellResult]) -> str:
    """How the cells' lengths or noise were set when they were solved from a target ε."""
    notes = {
        f"{'steps' if spec['steps'] is None else 'σ'} solved so that ε = "
        f"{spec['target_epsilon']:g} under the {spec['epsilon_convention']} convention"
        for spec in (r.spec for r in results)
        if spec["method"] == "dp_sinkhorn"
        and spec["target_epsilon"] is not None
        and (spec["sigma"] is None or spec["steps"] is None)
    }
    if not notes:
        return ""
    return "Cells with a target ε: " + "; ".join(sorted(notes)) + "."


def _table_row_cells(table: str, r: CellResult) -> list[str]:
    """The settings columns of a Markdown row (Table 2: components; 4/5: σ, Δ, p, m, steps)."""
    spec = r.spec
    if table == "table2":
        debias = debiasing_kind(spec["p"])
        debias += f" (p = {spec['p']:g})" if debias == "Semi" else ""
        image = "Yes" if spec["perturbation"] == "image" else "No"
        return [image, loss_kind(spec), debias]
    return [format_g(v) for v in (r.sigma, spec["clip"], spec["p"], spec["m"], r.steps)]


def _settings_record(r: CellResult) -> dict:
    """A cell's settings, as the columns :data:`SETTINGS_COLUMNS` of a study table's CSV."""
    spec = r.spec
    record = {"cell": r.label, "experiment": r.experiment, "optimizer": spec["optimizer"]}
    record |= {key: spec[key] for key in ("dataset", "method", "perturbation", "cost")}
    record |= {"loss": loss_kind(spec), "debiasing": debiasing_kind(spec["p"])}
    record |= {key: float(spec[key]) for key in ("clip", "p", "m", "lr")}
    record |= {"sigma": None if r.sigma is None else float(r.sigma), "steps": r.steps}
    return record | {"epsilon": r.row.epsilon, "epsilon_paper_convention": r.row.epsilon_paper}


#: The settings columns of Table 2 and of the search Tables 4, 5: (Markdown, LaTeX) titles.
SETTINGS_TITLES = {
    "table2": (
        ["Image gradient perturbation", "Loss", "Debiasing"],
        ["Image grad.", "Loss", "Debiasing"],
    ),
    "search": (["σ", "Δ", "p", "m", "steps"], ["$\\sigma$", "$\\Delta$", "$p$", "$m$", "steps"]),
}
SETTINGS_COLUMNS = (
    *"cell experiment dataset method perturbation cost loss debiasing sigma clip".split(),
    *"p m lr optimizer steps epsilon epsilon_paper_convention".split(),
)


def table_csv_columns(table: str) -> tuple[str, ...]:
    """CSV header of a study table: settings, each metric and its std, the paper's values."""
    metrics = TABLE_METRICS[table]
    return (*SETTINGS_COLUMNS, *metric_columns(metrics), *(f"paper_{m}" for m in metrics))


def _table_csv(table: str, results: Sequence[CellResult]) -> str:
    metrics = TABLE_METRICS[table]
    records = [
        _settings_record(r)
        | metric_cells(r.row, metrics)
        | {f"paper_{m}": r.row.paper.get(m) for m in metrics}
        for r in results
    ]
    return csv_text(table_csv_columns(table), records)


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
        f"Run {config.get('run_name', '?')} ({config_files_text(files, config)}): one row per "
        f"cell of the study {table} (in its order), each cell an experiment trained for this run. "
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
    public = guarantee_note([r.row for r in results])
    lines += [public, ""] if public else []
    settings = SETTINGS_TITLES["table2" if table == "table2" else "search"][0]
    header = ["Cell", *settings, "ε (sound)", "ε (paper conv.)"]
    header += [METRIC_TITLES[m] for m in metrics]
    table_cells = []
    for r in results:
        eps_paper = epsilon_text(r.row.epsilon_paper, False)
        if any(v is not None for v in r.row.paper.values()) and math.isfinite(
            r.row.epsilon_paper or math.inf
        ):
            eps_paper += f" (paper {PAPER_EPSILON:g})"
        cells = [r.label, *_table_row_cells(table, r), epsilon_text(r.row.epsilon, False)]
        table_cells.append([*cells, eps_paper, *(cell_text(r.row, m) for m in metrics)])
    lines += [*md_table(header, table_cells), "", "## Experiments", ""]
    experiments = [
        [c.label, f"`{c.experiment}`", f"`{c.base}`"]
        + [", ".join(f"{k} = {v}" for k, v in c.changes.items()) or "–"]
        for c in study_cells(config, table)
    ]
    lines += md_table(["Cell", "Experiment", "Based on", "Changes"], experiments)
    return "\n".join(lines).rstrip() + "\n"


def _table_latex(table: str, results: Sequence[CellResult]) -> str:
    metrics = TABLE_METRICS[table]
    settings = SETTINGS_TITLES["table2" if table == "table2" else "search"][1]
    header = [*settings, "$\\varepsilon$", "$\\varepsilon_{\\mathrm{paper}}$"]
    header += [METRIC_TITLES_TEX[m] for m in metrics]
    comments = [
        f"{TITLES[table]}, written by `dpsinkhorn report {table}`. Needs \\usepackage{{booktabs}}.",
        "mean $\\pm$ std over seeds of this run. Accuracy in %.",
    ]
    body = ["\\midrule"] + [
        latex_row([*map(latex_escape, _table_row_cells(table, r)), *latex_cells(r.row, metrics)])
        for r in results
    ]
    align = "l" * len(settings) + "r" * (len(header) - len(settings))
    return booktabs(comments, align, header, body)


def study_table_results(config: Mapping, out_dir: Path, table: str) -> list[CellResult]:
    """The rows of Table 2, 4 or 5, with the paper's values of the matching rows."""
    return measure_study(
        config, out_dir, table, lambda spec: paper_values(table, spec), TABLE_METRICS[table]
    )


def study_table(table: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``tables/<table>.{md,csv,tex}`` for Table 2, 4 or 5; return the paths."""
    if table not in TABLE_STUDIES:
        raise ValueError(f"unknown study table {table!r} (one of {', '.join(TABLE_STUDIES)})")
    (config, files), out_dir = load_config_like(config), Path(out_dir)
    require_study(config, table, files)
    results = study_table_results(config, out_dir, table)
    csv, tex = _table_csv(table, results), _table_latex(table, results)
    return write_tables(out_dir, table, _table_markdown(table, results, config, files), csv, tex)
