"""Result tables and figures: ``dpsinkhorn report {table1,table3,table6} --config FILES --out-dir``.

Table 1 of the paper, rebuilt from the per-seed result files of a run:

* our rows (source ``this run``): Real data, Non-private Sinkhorn, DP-Sinkhorn (paper
  setting) and DP-Sinkhorn (sound ε=10), for each dataset of the config;
* the baselines as reported in the paper's final Table 1 (source ``reported in paper``).

Units are the paper's: accuracy in % (the json files hold fractions), ε = inf for the
non-private rows. Each cell is mean ± std over the seeds; std is the sample standard
deviation (ddof=1), and 0 for a single seed. Writes ``tables/table1.{md,csv,tex}`` and
``figures/samples_<dataset>.png`` (one row of samples per class) under ``--out-dir``.

Tables 3 and 6 (CelebA, :data:`CELEBA_TABLES`) follow the same conventions with the
columns FID, MLP, CNN; their rows come from the experiments' ``rows:`` key, and they
write ``tables/table{3,6}.{md,csv,tex}`` and ``figures/fig{3,6}.png``. A CelebA prepared
from the synthetic fixture (``<data_dir>/celeba/FIXTURE``) is named in their captions.

Another table is one more ``reports.add_parser(...)`` in :func:`register_tables`.
"""

from __future__ import annotations

import argparse
import csv
import io as _io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    TABLE_FIGURES,
    classifiers_of,
    experiment,
    figure_experiment,
    load_config,
    table1_experiments,
    table_experiments,
    table_figure_experiments,
    table_files,
)
from dpsinkhorn.config.targets import TITLES
from dpsinkhorn.data.catalog import DATASETS

METRICS = ("fid", "acc_logreg", "acc_mlp", "acc_cnn")
CSV_COLUMNS = (
    "method",
    "dataset",
    "epsilon",
    "epsilon_paper_convention",
    "fid",
    "fid_std",
    "acc_logreg",
    "acc_logreg_std",
    "acc_mlp",
    "acc_mlp_std",
    "acc_cnn",
    "acc_cnn_std",
    "source",
)
THIS_RUN, REPORTED = "this run", "reported in paper"

DATASET_TITLES = {key: info.title for key, info in DATASETS.items()}
CLASS_NAMES = {key: list(info.class_names) for key, info in DATASETS.items()}
ROW_LABELS = {
    "real": "Real data",
    "nonprivate": "Non-private Sinkhorn",
    "paper": "DP-Sinkhorn (paper setting)",
    "perrow": "DP-Sinkhorn (paper setting, per-row clipping)",
    "sound10": "DP-Sinkhorn (sound ε=10)",
}
#: Table 1 rows that run the paper's (σ, steps): both are compared with the paper's DP row.
PAPER_SETTING_ROWS = ("paper", "perrow")
#: What each clipping mode does to the block of generated-image gradients (captions).
CLIPPING_TEXT = {
    "batch": "the whole block of generated-image gradients clipped to Δ as one vector",
    "per_sample": "each generated row clipped to Δ (per-row, as the paper's Algorithm 1 and "
    "Appendix B.1 state it)",
}
#: privacy.json "guarantee" starts with this when the noise seed was public (no DP at all).
NO_GUARANTEE_PREFIX = "none"

# The paper's final Table 1 (FID, Log Reg, MLP, CNN; accuracy in %), for our rows.
PAPER_REAL = {"mnist": (1.6, 92.2, 97.5, 99.3), "fmnist": (2.5, 84.5, 88.2, 90.8)}
PAPER_NONPRIVATE = {  # keyed by (dataset, m): the paper has one row per m
    ("mnist", 1.0): (54.2, 89.0, 89.0, 91.0),
    ("mnist", 3.0): (43.4, 87.7, 87.3, 90.6),
    ("fmnist", 1.0): (65.8, 78.4, 79.1, 73.9),
    ("fmnist", 3.0): (63.8, 78.4, 78.4, 73.3),
}
PAPER_DP = {"mnist": (48.4, 82.8, 82.7, 83.2), "fmnist": (128.3, 75.1, 74.6, 71.1)}
PAPER_DP_EPSILON = 10.0  # under the paper's convention

# Baselines as reported in the paper's final Table 1, all at ε = 10. None = N/A.
REPORTED_BASELINES = {
    "G-PATE": {"mnist": (177.2, 26, 25, 51), "fmnist": (205.8, 42, 30, 50)},
    "DP-CGAN": {"mnist": (179.2, 60, 60, 63), "fmnist": (243.8, 51, 50, 46)},
    "DataLens": {"mnist": (173.5, None, None, 80.66), "fmnist": (167.7, None, None, 70.61)},
    "DP-MERF": {"mnist": (116.3, 79.4, 78.3, 82.1), "fmnist": (132.6, 75.5, 74.5, 75.4)},
    "GS-WGAN": {"mnist": (61.3, 79, 79, 80), "fmnist": (131.3, 68, 65, 65)},
}
BASELINE_EPSILON = 10.0
# The paper's footnote 3: CNN accuracy of G-PATE as reported by GS-WGAN (used above).
GPATE_NOTE = (
    "¹ G-PATE's CNN accuracy as reported by GS-WGAN, the first number of the paper's Table 1; "
    "the G-PATE authors report 80.9 (MNIST) / 69.3 (Fashion-MNIST)."
)


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


# ---------------------------------------------------------------------- collecting


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1) over seeds; std 0 for a single seed."""
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def _read_number(path: Path, key: str) -> float:
    data = fileio.read_json(path)
    if key not in data:
        raise ValueError(f"{path}: missing key {key!r} (found {sorted(data)})")
    value = data[key]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{path}: {key!r} must be a number, got {value!r}")
    return float(value)


def _accuracy_percent(path: Path) -> float:
    value = _read_number(path, "accuracy")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: 'accuracy' must be a fraction in [0, 1], got {value}")
    return 100.0 * value


def _epsilon(value: object) -> float:
    """privacy.json may store an infinite epsilon as null, "inf" or a number."""
    return math.inf if value is None else float(value)


def result_files(config: dict, results_dir: Path) -> list[Path]:
    """Every file Table 1 reads (results of each seed, privacy reports)."""
    files = []
    for (dataset, row), name in table1_experiments(config).items():
        exp_dir = results_dir / name
        for seed in config["seeds"]:
            files.append(exp_dir / f"fid_seed{seed}.json")
            for model in classifiers_of(config, dataset):
                files.append(exp_dir / f"acc_{model}_seed{seed}.json")
        if row in ("paper", "perrow", "sound10"):
            files.append(exp_dir / "privacy.json")
    return files


def _check_exist(paths: Iterable[Path]) -> None:
    missing = [p for p in paths if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(map(str, missing[1:6]))}...)"
        raise FileNotFoundError(
            f"missing result file: {missing[0]}" + (more if len(missing) > 1 else "")
        )


def measured_row(
    config: dict,
    results_dir: Path,
    name: str,
    label: str,
    paper: Sequence[float | None],
    metrics: Sequence[str] = METRICS,
) -> Row:
    """One row of this run: mean ± std over seeds of an experiment's result files.

    ε is read from privacy.json for DP experiments, ∞ otherwise (non-private, real data);
    ``paper`` holds the paper's values for ``metrics`` (None where it has none).
    """
    spec = experiment(config, name)
    dataset, exp_dir, seeds = spec["dataset"], results_dir / name, config["seeds"]
    row = Row(label, dataset, THIS_RUN, exp_name=name, seeds=len(seeds))
    per_metric = {"fid": [_read_number(exp_dir / f"fid_seed{s}.json", "fid") for s in seeds]}
    for model in classifiers_of(config, dataset):
        per_metric[f"acc_{model}"] = [
            _accuracy_percent(exp_dir / f"acc_{model}_seed{s}.json") for s in seeds
        ]
    for metric in metrics:
        values = per_metric.get(metric)
        row.mean[metric], row.std[metric] = mean_std(values) if values else (None, None)
    if spec["method"] != "dp_sinkhorn":
        row.epsilon = row.epsilon_paper = math.inf
    else:
        privacy = fileio.read_json(exp_dir / "privacy.json")
        for key in ("epsilon", "epsilon_paper_convention"):
            if key not in privacy:
                raise ValueError(f"{exp_dir / 'privacy.json'}: missing key {key!r}")
        row.epsilon = _epsilon(privacy["epsilon"])
        row.epsilon_paper = _epsilon(privacy["epsilon_paper_convention"])
        row.privacy = privacy
    row.paper = dict(zip(metrics, paper, strict=True))
    return row


def our_rows(config: dict, results_dir: Path) -> list[Row]:
    """Rows measured in this run, one per Table 1 experiment of the config."""
    _check_exist(result_files(config, results_dir))
    return [
        measured_row(
            config,
            results_dir,
            name,
            ROW_LABELS[kind],
            _paper_values(dataset, kind, experiment(config, name)),
        )
        for (dataset, kind), name in table1_experiments(config).items()
    ]


def _paper_values(dataset: str, kind: str, spec: dict) -> tuple:
    """The paper's numbers for the cells of one of our rows (None where it has none)."""
    if kind == "real":
        values = PAPER_REAL.get(dataset)
    elif kind == "nonprivate":
        values = PAPER_NONPRIVATE.get((dataset, float(spec["m"])))
    elif kind in PAPER_SETTING_ROWS:  # both mechanisms at the paper's σ and steps
        values = PAPER_DP.get(dataset)
    else:  # sound10: the paper has no sound-ε row
        values = None
    return values or (None,) * len(METRICS)


def reported_rows(datasets: Iterable[str]) -> list[Row]:
    """The paper's reported baselines for these datasets."""
    rows = []
    for dataset in datasets:
        for method, by_dataset in REPORTED_BASELINES.items():
            if dataset not in by_dataset:
                continue
            values = [None if v is None else float(v) for v in by_dataset[dataset]]
            rows.append(
                Row(
                    method,
                    dataset,
                    REPORTED,
                    epsilon=BASELINE_EPSILON,
                    mean=dict(zip(METRICS, values, strict=True)),
                    std=dict.fromkeys(METRICS),
                )
            )
    return rows


def table1_rows(config: dict, results_dir: Path) -> list[Row]:
    """Our rows then the reported baselines, grouped by dataset in config order."""
    ours = our_rows(config, results_dir)
    datasets = list(dict.fromkeys(r.dataset for r in ours))
    theirs = reported_rows(datasets)
    return [r for d in datasets for r in ours + theirs if r.dataset == d]


# ------------------------------------------------------------------------- writing


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "inf"
    return repr(round(value, digits))


def csv_columns(metrics: Sequence[str] = METRICS) -> tuple[str, ...]:
    """CSV header: method, dataset, both ε, then each metric and its std, then source."""
    cells = [c for m in metrics for c in (m, f"{m}_std")]
    return ("method", "dataset", "epsilon", "epsilon_paper_convention", *cells, "source")


def to_csv(rows: Sequence[Row], metrics: Sequence[str] = METRICS) -> str:
    """CSV with the columns of :func:`csv_columns` (empty cell = not available)."""
    buffer = _io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(csv_columns(metrics))
    for row in rows:
        cells = [row.method, row.dataset, _num(row.epsilon), _num(row.epsilon_paper)]
        for metric in metrics:
            cells += [_num(row.mean.get(metric)), _num(row.std.get(metric))]
        writer.writerow(cells + [row.source])
    return buffer.getvalue()


def _cell(row: Row, metric: str, pm: str = " ± ", latex: bool = False) -> str:
    mean = row.mean.get(metric)
    if mean is None:
        return "–" if not latex else "--"
    text = f"{mean:g}" if row.source == REPORTED else f"{mean:.1f}"  # reported: as printed
    if row.seeds > 1 and row.std.get(metric) is not None:
        text += f"{pm}{row.std[metric]:.1f}"
    if not latex and row.paper.get(metric) is not None:
        text += f" (paper {_paper_number(row.paper[metric])})"
    return text


def _paper_number(value: float) -> str:
    """A paper value as printed there: one decimal, or two where it has two (74.96)."""
    return f"{value:.2f}" if round(value, 1) != value else f"{value:.1f}"


def _eps(value: float | None, reported: bool, latex: bool = False) -> str:
    if value is None:
        return "–" if not latex else "--"
    if math.isinf(value):
        return "$\\infty$" if latex else "∞"
    return f"{value:g}" if reported else f"{value:.2f}"


def sound_epsilons(privacy: dict) -> dict[str, float]:
    """Sound ε of a ledger under both accountants: {"rdp": ε, "pld": ε} ({} if not DP).

    Recomputed from the ledger's noise_multiplier, q, steps and delta (Poisson-subsampled
    Gaussian mechanism, add/remove-one adjacency); the ledger's own accountant's value is
    taken as recorded. PLD at a small noise multiplier over 10^5 steps takes ~30 s on CPU.
    """
    from dpsinkhorn.privacy.accounting import compute_epsilon

    keys = ("noise_multiplier", "q", "steps", "delta")
    if not privacy or any(not isinstance(privacy.get(k), int | float) for k in keys):
        return {}
    found = {}
    for accountant in ("rdp", "pld"):
        if str(privacy.get("accountant", "")).startswith(accountant) and "epsilon" in privacy:
            found[accountant] = _epsilon(privacy["epsilon"])
        else:
            z, q, steps, delta = (privacy[k] for k in keys)
            found[accountant] = compute_epsilon(z, q, int(steps), delta, accountant)
    return found


def public_seed_experiments(rows: Sequence[Row]) -> list[str]:
    """Our rows whose ledger says the noise seed was public (``guarantee`` starts with none)."""
    return [
        r.exp_name or r.method
        for r in rows
        if str(r.privacy.get("guarantee", "")).startswith(NO_GUARANTEE_PREFIX)
    ]


def guarantee_note(rows: Sequence[Row]) -> str:
    """Caption warning when any row's noise seed was public; '' otherwise (old ledgers: '')."""
    public = public_seed_experiments(rows)
    if not public:
        return ""
    names = ", ".join(f"`{n}`" for n in public)
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
        z, sens = r.privacy.get("noise_multiplier"), r.privacy.get("sensitivity")
        if isinstance(z, int | float) and isinstance(sens, int | float):
            text += f", L2 sensitivity {sens:.3g}, Gaussian noise multiplier {z:.3g}"
        parts.append(text)
    if not parts:
        return ""
    return (
        "Mechanism of each DP row (Gaussian mechanism on the generated-image gradient, "
        "Poisson sampling, add/remove-one adjacency; from privacy.json): "
        + "; ".join(parts)
        + ". The paper-convention ε counts σ alone and ignores the clipping, so both "
        "paper-setting rows show the same paper-convention ε while their sound ε differ."
    )


def to_markdown(rows: Sequence[Row], config: dict, figures: dict[str, tuple[str, str]]) -> str:
    """Markdown: one table per dataset, the paper's value next to each reproduced cell.

    ``figures`` maps a dataset to (figure path relative to tables/, experiment name).
    """
    seeds = len(config["seeds"])
    specs = [experiment(config, r.exp_name) for r in rows if r.exp_name]
    deltas = {
        f"{s['delta']:.0e}".replace("e-0", "e-") for s in specs if s["method"] == "dp_sinkhorn"
    }
    deltas = ", ".join(sorted(deltas))
    deltas = f", δ = {deltas}" if deltas else ""
    lines = [
        f"# {TITLES['table1']}",
        "",
        f"Rows from *this run* are mean ± std over {seeds} seed(s) (sample std, ddof=1; "
        "no ± for one seed); each seed is one synthetic set of "
        f"{config['evaluation']['num_samples']} samples and one training of each classifier. "
        "`(paper X)` is the value in the paper's final Table 1. ε (sound) is the accountant's "
        "ε; ε (paper conv.) is the same run under the paper's accounting convention, which "
        f"the paper reports as ε = {PAPER_DP_EPSILON:g}. Accuracy in %{deltas}. "
        "Rows *reported in paper* are copied from the paper (– = N/A or not run).",
        "",
    ]
    lines += [note for note in (guarantee_note(rows), mechanism_note(rows)) if note]
    lines += [""] if lines[-1] else []
    paper_eps = {ROW_LABELS[k]: PAPER_DP_EPSILON for k in PAPER_SETTING_ROWS}
    for dataset in dict.fromkeys(r.dataset for r in rows):
        lines += [f"## {DATASET_TITLES.get(dataset, dataset)}", ""]
        in_dataset = [r for r in rows if r.dataset == dataset]
        lines += _markdown_table(in_dataset, METRICS, paper_eps, {"G-PATE": "¹"}) + [""]
    lines.append(GPATE_NOTE)
    lines += ["", "## Experiments", ""]
    lines += [
        "| Dataset | Row | Experiment | Method | clipping | σ | steps | B | m | lr | p "
        "| ε RDP | ε PLD |",
        "|" + "---|" * 13,
    ]
    for row in (r for r in rows if r.exp_name):
        spec = experiment(config, row.exp_name)
        sigma = "solved" if spec["sigma"] is None else f"{spec['sigma']:g}"
        sigma = "–" if spec["method"] != "dp_sinkhorn" else sigma
        train = [sigma, str(spec["steps"]), str(spec["batch_size"])]
        train += [f"{spec['m']:g}", f"{spec['lr']:g}", f"{spec['p']:g}"]
        clipping = spec["clipping"] if spec["method"] == "dp_sinkhorn" else "–"
        eps = sound_epsilons(row.privacy)
        train = [clipping, *train, *(_eps(eps.get(a), False) for a in ("rdp", "pld"))]
        if spec["method"] == "real_data":
            train = ["–"] * 9
        cells = [DATASET_TITLES.get(row.dataset, row.dataset), row.method, f"`{row.exp_name}`"]
        lines.append("| " + " | ".join(cells + [spec["method"]] + train) + " |")
    if figures:
        lines += ["", "## Samples", ""]
        for dataset, (rel_path, name) in figures.items():
            title = DATASET_TITLES.get(dataset, dataset)
            lines += [f"{title}, `{name}` (one row per class):", "", f"![{title}]({rel_path})", ""]
    return "\n".join(lines).rstrip() + "\n"


METRIC_TITLES = {"fid": "FID ↓", "acc_logreg": "Log Reg", "acc_mlp": "MLP", "acc_cnn": "CNN"}
METRIC_TITLES_TEX = {"fid": "FID", "acc_logreg": "Log Reg", "acc_mlp": "MLP", "acc_cnn": "CNN"}


def _markdown_table(
    rows: Sequence[Row],
    metrics: Sequence[str],
    paper_eps: dict[str, float],
    marks: dict[str, str] | None = None,
) -> list[str]:
    """Markdown lines of one table: ε columns, metrics, source.

    ``paper_eps`` maps a method of this run to the ε the paper reports for it (shown as
    ``(paper X)`` beside our paper-convention ε); ``marks`` adds footnote marks to methods.
    """
    header = ["Method", "ε (sound)", "ε (paper conv.)"] + [METRIC_TITLES[m] for m in metrics]
    lines = ["| " + " | ".join(header + ["Source"]) + " |", "|" + "---|" * (len(header) + 1)]
    for row in rows:
        method = row.method + (marks or {}).get(row.method, "")
        reported = row.source == REPORTED
        eps_paper = _eps(row.epsilon_paper, reported)
        if row.source == THIS_RUN and row.method in paper_eps:
            eps_paper += f" (paper {paper_eps[row.method]:g})"
        cells = [method, _eps(row.epsilon, reported), eps_paper]
        cells += [_cell(row, m) for m in metrics] + [row.source]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _latex_escape(text: str) -> str:
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
    title = f"Table {table.removeprefix('table')}"
    ncols = 3 + len(metrics)
    lines = [
        f"% {title}, written by `dpsinkhorn report {table}`. Needs \\usepackage{{booktabs}}.",
        "% Rows marked \\dag are reported in the paper; the others come from this run",
        "% (mean $\\pm$ std over seeds). Accuracy in %." + (f" {note}" if note else ""),
        "\\begin{tabular}{l" + "r" * (ncols - 1) + "}",
        "\\toprule",
        "Method & $\\varepsilon$ & $\\varepsilon_{\\mathrm{paper}}$ & "
        + " & ".join(METRIC_TITLES_TEX[m] for m in metrics)
        + " \\\\",
    ]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        title = DATASET_TITLES.get(dataset, dataset)
        lines += ["\\midrule", f"\\multicolumn{{{ncols}}}{{l}}{{\\textit{{{title}}}}} \\\\"]
        for row in (r for r in rows if r.dataset == dataset):
            method = _latex_escape(row.method) + (
                "\\textsuperscript{\\dag}" if row.source == REPORTED else ""
            )
            reported = row.source == REPORTED
            cells = [method, _eps(row.epsilon, reported, True)]
            cells.append(_eps(row.epsilon_paper, reported, True))
            cells += [_cell(row, m, " $\\pm$ ", latex=True) for m in metrics]
            lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def sample_grid(
    images: np.ndarray, labels: np.ndarray, num_classes: int, per_class: int
) -> np.ndarray:
    """Mosaic with one row per class (its first ``per_class`` samples), 2 px gaps.

    A class with fewer samples leaves its remaining cells blank (white).
    """
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    h, w = images.shape[1:3]
    pad = 2
    shape = (num_classes * (h + pad) - pad, per_class * (w + pad) - pad) + images.shape[3:]
    grid = np.full(shape, 255, dtype=np.uint8)  # white gaps, like the page
    for c in range(num_classes):
        for j, idx in enumerate(np.flatnonzero(labels == c)[:per_class]):
            y, x = c * (h + pad), j * (w + pad)
            grid[y : y + h, x : x + w] = images[idx]
    return grid


def save_sample_figure(
    samples: Path, out: Path, dataset: str, title: str, per_class: int = 10
) -> None:
    """PNG of a sample file: one row per class with the class name as label (atomic)."""
    images, labels = fileio.load_samples(samples)
    names = CLASS_NAMES.get(dataset) or [str(c) for c in range(int(labels.max()) + 1)]
    save_grid_figure([(images, labels, "")], names, out, title, per_class)


def save_grid_figure(
    panels: Sequence[tuple[np.ndarray, np.ndarray, str]],
    class_names: Sequence[str],
    out: Path,
    title: str,
    per_class: int = 10,
) -> None:
    """PNG of sample sets stacked top to bottom, one row per class of each (atomic).

    ``panels`` holds (images, labels, row-label prefix) per sample set, e.g. the DCGAN's
    then the BigGAN's samples for the paper's Figure 6.
    """
    from matplotlib.figure import Figure  # Agg via Figure.savefig; no pyplot state

    grids, names = [], []
    for images, labels, prefix in panels:
        grids.append(sample_grid(images, labels, len(class_names), per_class))
        names += [f"{prefix} {c}".strip() for c in class_names]
    blank = np.full((2, *grids[0].shape[1:]), 255, dtype=np.uint8)  # the 2 px gap
    grid = np.concatenate([g for grid in grids for g in (grid, blank)][:-1])
    h = panels[0][0].shape[1] + 2
    fig = Figure(figsize=(1.0 + 0.45 * per_class, 0.5 + 0.45 * len(names)), dpi=100)
    ax = fig.add_subplot()
    ax.imshow(grid, cmap="gray" if grid.ndim == 2 else None, vmin=0, vmax=255)
    ax.set_yticks([c * h + (h - 2) / 2 for c in range(len(names))], names)
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    with fileio.atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")


# ----------------------------------------------------------------------------- CLI


def table1(config_files: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Write Table 1 (md, csv, tex) and the sample figures; return the written paths."""
    config = load_config(config_files)
    out_dir = Path(out_dir)
    rows = table1_rows(config, out_dir)
    seed = config["seeds"][0]
    figures, written = {}, []
    for dataset in dict.fromkeys(r.dataset for r in rows):
        name = figure_experiment(config, dataset)
        if name is None:
            continue
        png = out_dir / "figures" / f"samples_{dataset}.png"
        samples = out_dir / name / f"samples_seed{seed}.npz"
        _check_exist([samples])
        title = f"{DATASET_TITLES.get(dataset, dataset)}: {name} (seed {seed})"
        save_sample_figure(samples, png, dataset, title)
        figures[dataset] = (f"../figures/{png.name}", name)
        written.append(png)
    md, tex = to_markdown(rows, config, figures), to_latex(rows)
    return written + _write_tables(out_dir, "table1", md, to_csv(rows), tex)


def _write_tables(out_dir: Path, table: str, md: str, csv_text: str, tex: str) -> list[Path]:
    written = []
    for suffix, text in [("md", md), ("csv", csv_text), ("tex", tex)]:
        fileio.write_text(out_dir / "tables" / f"{table}.{suffix}", text)
        written.append(out_dir / "tables" / f"{table}.{suffix}")
    return written


def _table1_cli(args: argparse.Namespace) -> int:
    for path in table1(args.config, args.out_dir):
        print(path)
    return 0


# ---------------------------------------------------------------- CelebA: Tables 3, 6

CELEBA_METRICS = ("fid", "acc_mlp", "acc_cnn")


@dataclass(frozen=True)
class CelebaTable:
    """What the paper's Table 3 or 6 shows: our rows, its numbers, reported baselines."""

    title: str
    labels: dict[str, str]  # row key (config ``rows:``) -> method label
    paper: dict[str, tuple[float | None, ...]]  # row key -> (FID, MLP, CNN) in the paper
    paper_epsilon: dict[str, float]  # row key -> ε the paper reports (DP rows)
    reported: dict[str, tuple[float, tuple[float | None, ...]]]  # method -> (ε, values)
    notes: tuple[str, ...]
    figure_caption: str


CELEBA_TABLES = {
    "table3": CelebaTable(
        title=TITLES["table3"],
        labels={"real": "Real data", "nonprivate": "Sinkhorn (non-private)", "dp": "DP-Sinkhorn"},
        paper={
            "real": (1.1, 91.9, 95.0),
            "nonprivate": (129.5, 80.8, 82.2),
            "dp": (189.5, 76.2, 76.3),
        },
        paper_epsilon={"dp": 10.0},
        reported={
            "DP-MERF": (10.0, (274.0, 64.8, 65.0)),
            "DataLens": (10.0, (320.8, None, 72.9)),
        },
        notes=(
            "DataLens is reported at (10, 1e-5)-DP and 64×64 resolution (the paper's earlier "
            "version, Table 3); DP-MERF was run by the paper's authors with the same generator.",
        ),
        figure_caption="DP-Sinkhorn samples (paper Fig. 3); rows: female, male",
    ),
    "table6": CelebaTable(
        title=TITLES["table6"],
        labels={"real": "Real data", "dcgan": "DCGAN+DP-Sinkhorn", "biggan": "BigGAN+DP-Sinkhorn"},
        paper={
            "real": (1.1, 91.9, 95.0),
            "dcgan": (156.7, 74.96, 74.62),
            "biggan": (168.4, 76.18, 75.79),
        },
        paper_epsilon={"dcgan": 10.0, "biggan": 10.0},
        reported={},
        notes=(),
        figure_caption="DCGAN rows, then BigGAN rows (paper Fig. 6)",
    ),
}


def celeba_rows(config: dict, table: str, results_dir: Path) -> list[Row]:
    """Our rows of Table 3 or 6 (config ``rows:``), then the paper's reported baselines."""
    spec = CELEBA_TABLES[table]
    files = table_files(config, table, results_dir)
    _check_exist(Path(f) for f in files["results"] + files["privacy"])
    rows = [
        measured_row(config, results_dir, name, spec.labels[kind], spec.paper[kind], CELEBA_METRICS)
        for (_, kind), name in table_experiments(config, table).items()
    ]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        if dataset != "celeba":
            continue
        for method, (eps, values) in spec.reported.items():
            mean = dict(zip(CELEBA_METRICS, values, strict=True))
            rows.append(Row(method, dataset, REPORTED, eps, mean=mean, std={}))
    return rows


def _fixture_note(config: dict) -> str:
    """The caption's warning when CelebA was prepared from the synthetic fixture."""
    from dpsinkhorn.data.celeba import is_fixture

    if not is_fixture(Path(config["data_dir"])):
        return ""
    return (
        "**Data: the SYNTHETIC CelebA FIXTURE (dpsinkhorn celeba-fixture), not CelebA. "
        "These numbers test the pipeline and say nothing about the paper.**"
    )


def celeba_table(table: str, config_files: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Write Table 3 or 6 (md, csv, tex) and its figure (fig3 / fig6); return the paths."""
    spec = CELEBA_TABLES[table]
    config, out_dir = load_config(config_files), Path(out_dir)
    rows = celeba_rows(config, table, out_dir)
    seed = config["seeds"][0]
    figure_name, _ = TABLE_FIGURES[table]
    png = out_dir / "figures" / f"{figure_name}.png"
    names = table_figure_experiments(config, table)
    labels = {n: r.method.removesuffix("+DP-Sinkhorn") for r in rows if (n := r.exp_name)}
    panels = []
    for name in names:
        samples = out_dir / name / f"samples_seed{seed}.npz"
        _check_exist([samples])
        images, sample_labels = fileio.load_samples(samples)
        panels.append((images, sample_labels, labels[name] if len(names) > 1 else ""))
    if panels:
        title = f"{spec.figure_caption}: {', '.join(names)} (seed {seed})"
        save_grid_figure(panels, CLASS_NAMES["celeba"], png, title)

    fixture = _fixture_note(config)
    seeds = len(config["seeds"])
    specs = [experiment(config, r.exp_name) for r in rows if r.exp_name]
    deltas = sorted({f"{e['delta']:g}" for e in specs if e["method"] == "dp_sinkhorn"})
    lines = [f"# {spec.title}", ""] + ([fixture, ""] if fixture else [])
    public = guarantee_note(rows)
    lines += [public, ""] if public else []
    lines += [
        f"Rows from *this run* are mean ± std over {seeds} seed(s) (sample std, ddof=1; no ± "
        f"for one seed); each seed is one synthetic set of {config['evaluation']['num_samples']} "
        "samples and one training of each classifier (MLP, CNN: the paper has no Log-Reg for "
        "CelebA), evaluated on the real test set; FID against the test set. `(paper X)` is the "
        "paper's value. ε (sound) is the accountant's ε; ε (paper conv.) is the same run under "
        "the paper's convention, which the paper reports as ε = 10"
        + (f" (δ = {', '.join(deltas)})" if deltas else "")
        + ". Accuracy in %. Rows *reported in paper* are copied from the paper (– = N/A).",
        "",
    ]
    paper_eps = {spec.labels[k]: v for k, v in spec.paper_epsilon.items()}
    lines += _markdown_table(rows, CELEBA_METRICS, paper_eps) + [""]
    lines += [f"Note: {n}" for n in spec.notes] + ([""] if spec.notes else [])
    lines += [
        "## Experiments",
        "",
        "| Row | Experiment | Method | generator | σ | steps | B | m | λ | lr |",
    ]
    lines.append("|" + "---|" * 10)
    for row in (r for r in rows if r.exp_name):
        exp = experiment(config, row.exp_name)
        if exp["method"] == "real_data":
            train = ["–"] * 7
        else:
            sigma = "solved" if exp["sigma"] is None else f"{exp['sigma']:g}"
            train = [exp.get("generator") or "dcgan"]
            train += [sigma if exp["method"] == "dp_sinkhorn" else "–", str(exp["steps"])]
            train += [str(exp["batch_size"]), f"{exp['m']:g}", f"{exp['entropy_reg']:g}"]
            train.append(f"{exp['lr']:g}")
        cells = [row.method, f"`{row.exp_name}`", exp["method"], *train]
        lines.append("| " + " | ".join(cells) + " |")
    if panels:
        lines += ["", "## Samples", "", f"{spec.figure_caption}:", ""]
        lines += [f"![{figure_name}](../figures/{png.name})"]
    md = "\n".join(lines).rstrip() + "\n"
    note = "SYNTHETIC CelebA FIXTURE, not CelebA." if fixture else ""
    tex = to_latex(rows, CELEBA_METRICS, table, note)
    written = _write_tables(out_dir, table, md, to_csv(rows, CELEBA_METRICS), tex)
    return written + ([png] if panels else [])


def _celeba_cli(args: argparse.Namespace) -> int:
    for path in celeba_table(args.report, args.config, args.out_dir):
        print(path)
    return 0


def register_tables(reports: argparse._SubParsersAction) -> None:
    """Add ``table1``, ``table3`` and ``table6`` to ``dpsinkhorn report`` (see
    :mod:`dpsinkhorn.report.cli`, which assembles that command)."""
    t1 = reports.add_parser(
        "table1", help="Table 1 (MNIST, Fashion-MNIST): tables/table1.{md,csv,tex} + figures"
    )
    t1.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
    t1.add_argument("--out-dir", required=True, help="the run's results folder (results/<run>)")
    t1.set_defaults(handler=_table1_cli)
    for table, what in [
        ("table3", "Table 3 (CelebA: DP-Sinkhorn, non-private, real data) + figures/fig3.png"),
        ("table6", "Table 6 (CelebA: BigGAN vs DCGAN generator) + figures/fig6.png"),
    ]:
        sub = reports.add_parser(table, help=f"{what}; tables/{table}.{{md,csv,tex}}")
        sub.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
        sub.add_argument("--out-dir", required=True, help="the run's results folder")
        sub.set_defaults(handler=_celeba_cli)
