"""reproduction.md (``dpsinkhorn report reproduction --config FILES --out-dir``): every table
cell the paper reports beside ours, the sound ε = 10 study, what the paper's ε = 10 means,
the privacy summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import report_tables, table1_experiments
from dpsinkhorn.config.studies import TABLE_STUDIES, configured_studies
from dpsinkhorn.config.targets import MAIN_TABLES, TITLES, privacy_summary_file
from dpsinkhorn.report import resultset
from dpsinkhorn.report.common import (
    ACCOUNTING_NOTE,
    DATASET_TITLES,
    METRIC_TITLES_TEX,
    THIS_RUN,
    ConfigLike,
    PathLike,
    Row,
    config_files_text,
    format_g,
    load_config_like,
    md_table,
    paper_digits,
    paper_number,
)
from dpsinkhorn.report.figures import eps10_section
from dpsinkhorn.report.paper import TABLE_METRICS, loss_kind
from dpsinkhorn.report.privacy_summary import summary_markdown
from dpsinkhorn.report.studies import study_table_results
from dpsinkhorn.report.tables import paper_epsilons, table1_title, table_metrics, table_rows


def produced_tables(config: Mapping) -> list[str]:
    """The paper tables this config produces, in the paper's order."""
    names = ["table1"] if table1_experiments(config) else []
    names += report_tables(config)
    names += [t for t in configured_studies(config) if t in TABLE_STUDIES]
    return sorted(names, key=lambda t: int(t.removeprefix("table")))


def _row_cells(label: str, row: Row, metrics: Sequence[str], paper_eps=None) -> list[list[str]]:
    """Markdown cells (row, metric, paper, ours: mean ± std over seeds, ours − paper) of each
    cell of ``row`` that the paper reports, and of its paper-convention ε (``paper_eps``)."""
    found = [
        (METRIC_TITLES_TEX[m], paper, row.mean.get(m), row.std.get(m), paper_digits(paper))
        for m in metrics
        if (paper := row.paper.get(m)) is not None
    ]
    if paper_eps is not None:
        found.append(("ε (paper conv.)", paper_eps, row.epsilon_paper, None, 2))
    cells = []
    for metric, paper, mean, std, digits in found:
        ours, diff = "–", "–"
        if mean is not None:
            ours = "∞" if math.isinf(mean) else f"{mean:.{digits}f}"
            if row.seeds > 1 and std is not None:
                ours += f" ± {std:.{digits}f}"
            diff = f"{mean - paper:+.{digits}f}"
        cells.append([label, metric, paper_number(paper), ours, diff])
    return cells


def reproduced_cells(config: Mapping, out_dir: Path, table: str) -> list[list[str]]:
    """Every cell of ``table`` that the paper reports and this run reproduced (markdown)."""
    found: list[list[str]] = []
    if table in MAIN_TABLES:
        paper_eps = paper_epsilons(table)
        for row in table_rows(config, table, out_dir):
            if row.source != THIS_RUN:
                continue
            label = f"{DATASET_TITLES.get(row.dataset, row.dataset)}: {row.method}"
            label = label if table == "table1" else row.method
            found += _row_cells(label, row, table_metrics(table), paper_eps.get(row.method))
    else:
        for r in study_table_results(config, out_dir, table):
            if table == "table2":
                settings = f"{r.spec['perturbation']}, {loss_kind(r.spec)}, p = {r.spec['p']:g}"
            else:
                values = (r.sigma, r.spec["clip"], r.spec["p"], r.spec["m"])
                settings = ", ".join(
                    f"{k} {format_g(v)}" for k, v in zip("σΔpm", values, strict=True)
                )
            found += _row_cells(f"{r.label} ({settings})", r.row, TABLE_METRICS[table])
    return found


def not_paper_scale_reasons(config: Mapping, files: Sequence[str]) -> list[str]:
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
        f"Run {config.get('run_name', '?')} ({config_files_text(files, config)}); seeds "
        f"{', '.join(map(str, seeds))}; {config['evaluation']['num_samples']} samples per seed. "
        "Every cell of the paper's tables that this run reproduced: the paper's value, ours "
        "(mean ± std over seeds; sample std, ddof=1) and the difference ours − paper. "
        "Accuracy in %. Rows of Tables 2, 4 and 5 are matched to the paper by their settings. "
        f"{ACCOUNTING_NOTE} The smoke and quick configs are NOT paper scale (few steps, "
        "samples and seeds): their numbers test the pipeline and say nothing about the paper.",
        "",
    ]
    reasons = not_paper_scale_reasons(config, files)
    if reasons:
        lines += [f"**This run is not at paper scale** ({'; '.join(reasons)}).", ""]
    for table in tables:
        title = TITLES[table]
        if table == "table1":
            title = table1_title(dataset for dataset, _ in table1_experiments(config))
        lines += [f"## {title}", ""]
        cells = reproduced_cells(config, out_dir, table)
        if not cells:
            lines += ["No cell of this run matches a cell of the paper's table.", ""]
            continue
        header = ["Table", "Row", "Metric", "Paper", "Ours (mean ± std)"]
        table_cells = [[table.removeprefix("table"), *c] for c in cells]
        lines += md_table([*header, "Difference (ours − paper)"], table_cells) + [""]
    if "eps10" in configured_studies(config):
        lines += eps10_section(config, out_dir)
    lines += _epsilon_meaning_lines(config, out_dir, tables)
    summary = Path(privacy_summary_file(out_dir))  # an input of the reproduction rule
    if summary.exists():
        lines += ["", *summary_markdown(fileio.read_json(summary))]
    else:
        lines += [
            "",
            f"No {summary.name}: run `dpsinkhorn privacy-summary` for privacy across releases.",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _epsilon_meaning_lines(config: Mapping, out_dir: Path, tables: Sequence[str]) -> list[str]:
    """ "What the paper's ε = 10 means": this run's paper-setting rows, then each committed
    results set (cwd = repository root) with rows of this config's Table 1 datasets."""
    lines = []
    if "table1" in tables:
        section = resultset.epsilon_meaning(table_rows(config, "table1", out_dir), {})
        if section:
            lines += [section[0] + " (this run)", *section[1:]]
    datasets = {dataset for dataset, _ in table1_experiments(config)}
    return lines + resultset.epsilon_meaning_of_sets(Path.cwd(), datasets)


def reproduction(config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write ``<out_dir>/reproduction.md``; return its path."""
    (config, files), out_dir = load_config_like(config), Path(out_dir)
    path = out_dir / "reproduction.md"
    fileio.write_text(path, reproduction_markdown(config, out_dir, files))
    return [path]
