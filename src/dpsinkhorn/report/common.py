"""Shared by every report: result rows, reading result files, formatting cells, the
Markdown/LaTeX/CSV writers and shared notes. Accuracy in %, ε = inf for non-private rows;
a cell is mean ± sample std (ddof=1; 0 for one seed) over the seeds."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    PRIVATE_METHODS,
    TABLES_DIR,
    evaluation_dir,
    experiment,
    experiment_classifiers,
    experiment_dir,
    load_config,
)
from dpsinkhorn.config.targets import score_name
from dpsinkhorn.data.catalog import DATASETS, own_dataset_info

METRICS = ("fid", "acc_logreg", "acc_mlp", "acc_cnn")
#: A classifier cell of an unconditional generator (its samples have no labels).
UNCONDITIONAL_CELL = "n/a (unconditional)"
#: Row sources: measured by this run, or copied from the paper.
THIS_RUN, REPORTED = "this run", "reported in paper"

DATASET_TITLES = {key: info.title for key, info in DATASETS.items()}
CLASS_NAMES = {key: list(info.class_names) for key, info in DATASETS.items()}
#: Table 1 row kind (an experiment's ``table1_row``) -> the label of its row.
ROW_LABELS = {
    "real": "Real data",
    "nonprivate": "Non-private Sinkhorn",
    "paper": "DP-Sinkhorn (paper setting)",
    "perrow": "DP-Sinkhorn (paper setting, per-row clipping)",
    "sound10": "DP-Sinkhorn (sound ε=10)",
    "sound_official": "DP-Sinkhorn (official code's σ, sound ε=10)",
    "dpmerf": "DP-MERF (computed, sound ε=10)",
}
#: What each clipping mode does to the block of generated-image gradients (captions).
CLIPPING_TEXT = {
    "batch": "the whole block of generated-image gradients clipped to Δ as one vector",
    "per_sample": "each generated row clipped to Δ (per-row, as the paper's Appendix B.1 "
    "states it)",
}
#: Whose mechanism each clipping mode of ``perturbation: image`` is (docs/PAPER.md, "What
#: the released code runs"): the official code's hooks, or the paper's text.
MECHANISM_SOURCE = {
    "batch": "the released code's mechanism (nv-tlabs/DP-Sinkhorn_code, sinkhorn_poisson.py)",
    "per_sample": "the paper's text (Appendix B.1), not the released code",
}
#: The same, as the short tag of a table row (README.md's Table 1 blocks).
MECHANISM_TAG = {"batch": "released code's mechanism", "per_sample": "paper's text"}


def mechanism_tag(privacy: dict) -> str:
    """:data:`MECHANISM_TAG` of a DP row that clips the image gradient, else ''."""
    if privacy.get("perturbation", "image") != "image":
        return ""
    return MECHANISM_TAG.get(privacy.get("clipping"), "")


#: privacy.json "guarantee" starts with this when the noise seed was public (no DP at all).
NO_GUARANTEE = "none"
#: The two ε columns, as the study tables and reproduction.md explain them.
ACCOUNTING_NOTE = (
    "ε (sound) is the accountant's ε; ε (paper conv.) is the same run under the paper's "
    "accounting convention, which the paper reports as ε = 10."
)

#: What the report functions accept as a config: file(s), or a validated config mapping.
PathLike = str | os.PathLike
ConfigLike = Mapping | Sequence[PathLike] | PathLike


@dataclass
class Row:
    """One line of Table 1: a method on one dataset."""

    method: str
    dataset: str
    source: str
    epsilon: float | None = None
    epsilon_paper: float | None = None
    mean: dict[str, float | None] = field(default_factory=dict)
    std: dict[str, float | None] = field(default_factory=dict)
    paper: dict[str, float | None] = field(default_factory=dict)  # paper's value, our rows
    exp_name: str | None = None  # our rows: the experiment that produced it
    seeds: int = 0
    privacy: dict = field(default_factory=dict)  # our DP rows: the privacy.json ledger
    counts: dict[str, int] = field(default_factory=dict)  # results sets: seeds per metric
    unconditional: bool = False  # our rows: no labels, so no classifier cells


def require_keys(data: Mapping, keys: Iterable[str], path: Path) -> Mapping:
    """``data`` (read from ``path``) if it has every key; else a one-line error naming one."""
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{path}: missing key {missing[0]!r} (found {sorted(data)})")
    return data


def read_number(path: Path, key: str) -> float:
    """The number under ``key`` of a result json; a one-line error names file and key."""
    value = require_keys(fileio.read_json(path), [key], path)[key]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{path}: {key!r} must be a number, got {value!r}")
    return float(value)


def accuracy_percent(path: Path) -> float:
    """A classifier result's accuracy in % (the file holds a fraction in [0, 1])."""
    value = read_number(path, "accuracy")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: 'accuracy' must be a fraction in [0, 1], got {value}")
    return 100.0 * value


def epsilon_value(value: object) -> float:
    """privacy.json may store an infinite epsilon as null, "inf" or a number."""
    return math.inf if value is None else float(value)


def check_exist(paths: Iterable[Path]) -> None:
    """Raise FileNotFoundError naming the first missing file (and a few more)."""
    missing = [p for p in paths if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(map(str, missing[1:6]))}...)"
        raise FileNotFoundError(
            f"missing result file: {missing[0]}" + (more if len(missing) > 1 else "")
        )


def read_scores(
    row: Row, folder: Path, seeds: Sequence[int], models: Sequence[str], present_only: bool = False
) -> None:
    """Fill ``row.mean``, ``row.std`` and ``row.counts`` of every metric of :data:`METRICS`
    from the score files in ``folder`` (FID, then the accuracy of each of ``models``), over
    ``seeds``; ``present_only``: skip a seed whose file is missing (else it is an error)."""
    for metric in METRICS:
        values = []
        if metric == "fid" or metric.removeprefix("acc_") in models:
            paths = [folder / score_name(metric, s) for s in seeds]
            values = [
                read_number(p, "fid") if metric == "fid" else accuracy_percent(p)
                for p in paths
                if p.is_file() or not present_only
            ]
        row.counts[metric] = len(values)
        row.mean[metric] = row.std[metric] = None
        if values:  # mean and sample std (ddof=1; 0 for one seed)
            row.mean[metric] = float(np.mean(values))
            row.std[metric] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def read_epsilons(row: Row, spec: Mapping, ledger: Path) -> None:
    """``row``'s ε: ∞ for a non-private method, else from its ``ledger`` (privacy.json),
    kept as ``row.privacy``; a DP-MERF row (one release) has no paper convention ("–")."""
    if spec["method"] not in PRIVATE_METHODS:
        row.epsilon = row.epsilon_paper = math.inf
        return
    row.privacy = dict(fileio.read_json(ledger))
    require_keys(row.privacy, ("epsilon", "epsilon_paper_convention"), ledger)
    row.epsilon = epsilon_value(row.privacy["epsilon"])
    if spec["method"] != "dpmerf":
        row.epsilon_paper = epsilon_value(row.privacy["epsilon_paper_convention"])


def measured_row(
    config: dict,
    results_dir: Path,
    name: str,
    label: str,
    paper: Sequence[float | None],
    metrics: Sequence[str] = METRICS,
) -> Row:
    """One row of this run: mean ± std over seeds of an experiment's result files; ε from
    privacy.json (∞ if not DP); ``paper``: the paper's values for ``metrics`` or None."""
    spec = experiment(config, name)
    row = Row(label, spec["dataset"], THIS_RUN, exp_name=name, seeds=len(config["seeds"]))
    row.unconditional = spec.get("conditional", True) is False
    models = experiment_classifiers(config, name)
    read_scores(row, evaluation_dir(config, results_dir, name), config["seeds"], models)
    read_epsilons(row, spec, experiment_dir(config, results_dir, name) / "privacy.json")
    row.paper = dict(zip(metrics, paper, strict=True))
    return row


def load_config_like(config: ConfigLike) -> tuple[dict, list[str]]:
    """(validated config, its files): from config file(s), or an already loaded mapping.
    The config's own datasets' (public) titles and class names join :data:`DATASET_TITLES`
    and :data:`CLASS_NAMES`."""
    files = []
    if not isinstance(config, Mapping):
        files = [config] if isinstance(config, str | os.PathLike) else list(config)
        config = load_config(files)
    config = dict(config)
    for name, definition in (config.get("datasets") or {}).items():
        info = own_dataset_info(name, definition)
        DATASET_TITLES[name], CLASS_NAMES[name] = info.title, list(info.class_names)
    return config, [str(f) for f in files]


def format_g(value: float | None, missing: str = "–", spec: str = "g") -> str:
    """``value`` in ``%g`` form (or format ``spec``); ``missing`` for None."""
    return missing if value is None else format(value, spec)


def settings_cells(spec: Mapping, keys: Sequence[str]) -> list[str]:
    """An experiments table's cells: the settings ``keys`` of a validated experiment (σ:
    "–" for a non-DP method, "solved" when solved from a target ε)."""

    def cell(key: str) -> str:
        value = spec[key]
        if key == "sigma":
            return "–" if spec["method"] not in PRIVATE_METHODS else format_g(value, "solved")
        return f"{value:g}" if isinstance(value, float) else str(value)

    return [cell(key) for key in keys]


def config_files_text(files: Sequence[str], config: Mapping) -> str:
    """'config file(s) a, b' for captions, or the run's name when no file is known."""
    if files:
        return f"config file{'s' if len(files) > 1 else ''} {', '.join(files)}"
    return f"the config of run {config.get('run_name', '?')}"


def metric_columns(metrics: Sequence[str]) -> list[str]:
    """Each metric and its std: ``fid, fid_std, acc_logreg, ...``."""
    return [c for m in metrics for c in (m, f"{m}_std")]


def metric_cells(row: Row, metrics: Sequence[str] = METRICS) -> dict[str, float | None]:
    """The cells of :func:`metric_columns`: mean and std over seeds (None: not measured)."""
    return {c: v for m in metrics for c, v in [(m, row.mean.get(m)), (f"{m}_std", row.std.get(m))]}


def csv_columns(metrics: Sequence[str] = METRICS) -> tuple[str, ...]:
    """CSV header: method, dataset, both ε, then each metric and its std, then source."""
    cells = metric_columns(metrics)
    return ("method", "dataset", "epsilon", "epsilon_paper_convention", *cells, "source")


def csv_record(row: Row, metrics: Sequence[str] = METRICS) -> dict:
    """A table row as a record of :func:`csv_columns`."""
    names = {"method": row.method, "dataset": row.dataset, "source": row.source}
    eps = {"epsilon": row.epsilon, "epsilon_paper_convention": row.epsilon_paper}
    return names | eps | metric_cells(row, metrics)


def to_csv(rows: Sequence[Row], metrics: Sequence[str] = METRICS) -> str:
    """CSV with the columns of :func:`csv_columns` (empty cell = not available)."""
    return csv_text(csv_columns(metrics), [csv_record(r, metrics) for r in rows], digits=4)


def cell_text(row: Row, metric: str, pm: str = " ± ", latex: bool = False) -> str:
    """A metric cell: mean (± std with several seeds), then ``(paper X)`` in Markdown."""
    mean = row.mean.get(metric)
    if mean is None and row.unconditional and metric.startswith("acc_"):
        return UNCONDITIONAL_CELL if not latex else "n/a"
    if mean is None:
        return "–" if not latex else "--"
    text = f"{mean:g}" if row.source == REPORTED else f"{mean:.1f}"  # reported: as printed
    if row.seeds > 1 and row.std.get(metric) is not None:
        text += f"{pm}{row.std[metric]:.1f}"
    if not latex and row.paper.get(metric) is not None:
        text += f" (paper {paper_number(row.paper[metric])})"
    return text


def paper_digits(value: float) -> int:
    """The decimals of a paper value as printed there: one, or two where it has two (74.96)."""
    return 2 if round(value, 1) != value else 1


def paper_number(value: float) -> str:
    """A paper value as printed there (:func:`paper_digits`)."""
    return f"{value:.{paper_digits(value)}f}"


def epsilon_text(value: float | None, reported: bool, latex: bool = False) -> str:
    """An ε cell: ∞, as printed for reported rows, else two decimals."""
    if value is None:
        return "–" if not latex else "--"
    if math.isinf(value):
        return "$\\infty$" if latex else "∞"
    return f"{value:g}" if reported else f"{value:.2f}"


def csv_text(columns: Sequence[str], rows: Iterable[Mapping], digits: int = 6) -> str:
    """Records as CSV with these columns (other keys left out); a cell is empty for None,
    'inf' for ∞, a float rounded to ``digits``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        cells = {k: row.get(k) for k in columns}
        for key, value in cells.items():
            if isinstance(value, float):
                cells[key] = "inf" if math.isinf(value) else repr(round(value, digits))
        writer.writerow(cells)
    return buffer.getvalue()


#: Column titles of the metrics in Markdown and LaTeX.
METRIC_TITLES = {"fid": "FID ↓", "acc_logreg": "Log Reg", "acc_mlp": "MLP", "acc_cnn": "CNN"}
METRIC_TITLES_TEX = {"fid": "FID", "acc_logreg": "Log Reg", "acc_mlp": "MLP", "acc_cnn": "CNN"}


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Markdown lines of a table: header, separator, one line per row of cells."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, *rows]]
    return [lines[0], "|" + "---|" * len(header), *lines[1:]]


def markdown_table(
    rows: Sequence[Row],
    metrics: Sequence[str],
    paper_eps: dict[str, float],
    marks: dict[str, str] | None = None,
) -> list[str]:
    """Markdown lines of one table: ε columns, metrics, source. ``paper_eps``: method ->
    the paper's ε, shown as ``(paper X)``; ``marks``: method -> footnote mark."""
    header = ["Method", "ε (sound)", "ε (paper conv.)", *(METRIC_TITLES[m] for m in metrics)]
    cells_of_rows = []
    for row in rows:
        method = row.method + (marks or {}).get(row.method, "")
        reported = row.source == REPORTED
        eps_paper = epsilon_text(row.epsilon_paper, reported)
        if row.source == THIS_RUN and row.method in paper_eps:
            eps_paper += f" (paper {paper_eps[row.method]:g})"
        cells = [method, epsilon_text(row.epsilon, reported), eps_paper]
        cells_of_rows.append([*cells, *(cell_text(row, m) for m in metrics), row.source])
    return md_table([*header, "Source"], cells_of_rows)


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped and ε as ``$\\varepsilon$``."""
    for char, repl in [("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$")]:
        text = text.replace(char, repl)
    for char in "#_{}":
        text = text.replace(char, "\\" + char)
    return text.replace("ε", "$\\varepsilon$")


def to_latex(
    rows: Sequence[Row],
    metrics: Sequence[str] = METRICS,
    table: str = "table1",
    note: str = "",
) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs}); reported rows marked with †."""
    ncols = 3 + len(metrics)
    comments = [
        f"Table {table.removeprefix('table')}, written by `dpsinkhorn report {table}`. "
        "Needs \\usepackage{booktabs}.",
        "Rows marked \\dag are reported in the paper; the others come from this run",
        "(mean $\\pm$ std over seeds). Accuracy in %." + (f" {note}" if note else ""),
    ]
    header = ["Method", "$\\varepsilon$", "$\\varepsilon_{\\mathrm{paper}}$"]
    body = []
    for dataset in dict.fromkeys(r.dataset for r in rows):
        title = DATASET_TITLES.get(dataset, dataset)
        body += ["\\midrule", f"\\multicolumn{{{ncols}}}{{l}}{{\\textit{{{title}}}}} \\\\"]
        for row in (r for r in rows if r.dataset == dataset):
            mark = "\\textsuperscript{\\dag}" if row.source == REPORTED else ""
            body.append(latex_row([latex_escape(row.method) + mark, *latex_cells(row, metrics)]))
    header += [METRIC_TITLES_TEX[m] for m in metrics]
    return booktabs(comments, "l" + "r" * (ncols - 1), header, body)


def latex_cells(row: Row, metrics: Sequence[str]) -> list[str]:
    """A row's ε (sound, paper convention) and metric cells in LaTeX."""
    reported = row.source == REPORTED
    cells = [epsilon_text(e, reported, latex=True) for e in (row.epsilon, row.epsilon_paper)]
    return cells + [cell_text(row, m, " $\\pm$ ", latex=True) for m in metrics]


def booktabs(
    comments: Sequence[str], align: str, header: Sequence[str], body: Sequence[str]
) -> str:
    """A booktabs tabular after ``%`` comment lines; ``body``: its lines below the header."""
    lines = [f"% {c}" for c in comments] + [f"\\begin{{tabular}}{{{align}}}", "\\toprule"]
    lines += [latex_row(header), *body, "\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def latex_row(cells: Sequence[str]) -> str:
    """One row of a LaTeX tabular."""
    return " & ".join(cells) + " \\\\"


def write_tables(out_dir: Path, table: str, md: str, csv_text: str, tex: str) -> list[Path]:
    """Write ``tables/<table>.{md,csv,tex}`` under ``out_dir``; return the paths."""
    paths = [out_dir / TABLES_DIR / f"{table}.{suffix}" for suffix in ("md", "csv", "tex")]
    for path, text in zip(paths, (md, csv_text, tex), strict=True):
        fileio.write_text(path, text)
    return paths


def sound_epsilons(privacy: dict) -> dict[str, float]:
    """Sound ε of a ledger under both accountants, {"rdp": ε, "pld": ε} ({} if not DP):
    the other accountant's recomputed from (noise_multiplier, q, steps, delta) of the
    Poisson-subsampled Gaussian mechanism, add/remove-one adjacency."""
    from dpsinkhorn.privacy.accounting import compute_epsilon

    keys = ("noise_multiplier", "q", "steps", "delta")
    if not privacy or any(not isinstance(privacy.get(k), int | float) for k in keys):
        return {}
    found = {}
    for accountant in ("rdp", "pld"):
        if str(privacy.get("accountant", "")).startswith(accountant) and "epsilon" in privacy:
            found[accountant] = epsilon_value(privacy["epsilon"])
        else:
            z, q, steps, delta = (privacy[k] for k in keys)
            found[accountant] = compute_epsilon(z, q, int(steps), delta, accountant)
    return found


def no_guarantee(privacy: Mapping) -> bool:
    """Whether a ledger says its noise seed was public (``guarantee`` starts with none)."""
    return str(privacy.get("guarantee", "")).startswith(NO_GUARANTEE)


def guarantee_note(rows: Sequence[Row]) -> str:
    """Caption warning when any row's noise seed was public; '' otherwise."""
    names = ", ".join(f"`{r.exp_name or r.method}`" for r in rows if no_guarantee(r.privacy))
    if not names:
        return ""
    return (
        f"**No privacy guarantee for {names}: the noise seed was public (`reproducible: true`; "
        'privacy.json "guarantee": "none: the noise seed is public"), so anyone can subtract '
        "the noise. Their ε is what the same run would spend with a secret seed.**"
    )


def mechanism_note(rows: Sequence[Row]) -> str:
    """Which mechanism each DP row ran: clipping, sensitivity and noise multiplier (ledger)."""
    parts = []
    for r in rows:
        clipping = r.privacy.get("clipping")
        if r.source == REPORTED or clipping is None:
            continue
        title = DATASET_TITLES.get(r.dataset, r.dataset)
        text = f"{title} *{r.method}* (`{r.exp_name}`): {CLIPPING_TEXT.get(clipping, clipping)}"
        if r.privacy.get("perturbation", "image") == "image" and clipping in MECHANISM_SOURCE:
            text += f", {MECHANISM_SOURCE[clipping]}"
        z, sens = r.privacy.get("noise_multiplier"), r.privacy.get("sensitivity")
        if isinstance(z, int | float) and isinstance(sens, int | float):
            text += f", L2 sensitivity {sens:.3g}, Gaussian noise multiplier {z:.3g}"
        parts.append(text)
    if not parts:
        return ""
    text = (
        "Mechanism of each DP row (Gaussian mechanism on the generated-image gradient, "
        "Poisson sampling, add/remove-one adjacency; from privacy.json): " + "; ".join(parts) + "."
    )
    paper_setting = {ROW_LABELS["paper"], ROW_LABELS["perrow"]}
    datasets = [r.dataset for r in rows if r.source != REPORTED and r.method in paper_setting]
    if any(datasets.count(d) > 1 for d in datasets):  # both mechanisms on one dataset
        text += (
            " The paper-convention ε counts σ alone and ignores the clipping, so both "
            "paper-setting rows show the same paper-convention ε while their sound ε differ."
        )
    return text
