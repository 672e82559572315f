"""Result tables and figures: ``dpsinkhorn report table1 --config FILES --out-dir results/<run>``.

Table 1 of the paper, rebuilt from the per-seed result files of a run:

* our rows (source ``this run``): Real data, Non-private Sinkhorn, DP-Sinkhorn (paper
  setting) and DP-Sinkhorn (sound ε=10), for each dataset of the config;
* the baselines as reported in the paper's final Table 1 (source ``reported in paper``).

Units are the paper's: accuracy in % (the json files hold fractions), ε = inf for the
non-private rows. Each cell is mean ± std over the seeds; std is the sample standard
deviation (ddof=1), and 0 for a single seed. Writes ``tables/table1.{md,csv,tex}`` and
``figures/samples_<dataset>.png`` (one row of samples per class) under ``--out-dir``.

Another table is one more ``reports.add_parser(...)`` in :func:`register_cli`.
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

from dpsinkhorn import io
from dpsinkhorn.config import experiment, figure_experiment, load_config, table1_experiments

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

DATASET_TITLES = {"mnist": "MNIST", "fmnist": "Fashion-MNIST"}
CLASS_NAMES = {
    "mnist": [str(i) for i in range(10)],
    "fmnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
}
ROW_LABELS = {
    "real": "Real data",
    "nonprivate": "Non-private Sinkhorn",
    "paper": "DP-Sinkhorn (paper setting)",
    "sound10": "DP-Sinkhorn (sound ε=10)",
}

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


# ---------------------------------------------------------------------- collecting


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1) over seeds; std 0 for a single seed."""
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def _read_number(path: Path, key: str) -> float:
    data = io.read_json(path)
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
    for (_, row), name in table1_experiments(config).items():
        exp_dir = results_dir / name
        for seed in config["seeds"]:
            files.append(exp_dir / f"fid_seed{seed}.json")
            for model in config["evaluation"]["classifiers"]:
                files.append(exp_dir / f"acc_{model}_seed{seed}.json")
        if row in ("paper", "sound10"):
            files.append(exp_dir / "privacy.json")
    return files


def _check_exist(paths: Iterable[Path]) -> None:
    missing = [p for p in paths if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(map(str, missing[1:6]))}...)"
        raise FileNotFoundError(
            f"missing result file: {missing[0]}" + (more if len(missing) > 1 else "")
        )


def our_rows(config: dict, results_dir: Path) -> list[Row]:
    """Rows measured in this run, one per Table 1 experiment of the config."""
    _check_exist(result_files(config, results_dir))
    rows = []
    for (dataset, kind), name in table1_experiments(config).items():
        spec = experiment(config, name)
        exp_dir = results_dir / name
        row = Row(ROW_LABELS[kind], dataset, THIS_RUN, exp_name=name)
        row.seeds = len(config["seeds"])
        per_metric = {
            "fid": [_read_number(exp_dir / f"fid_seed{s}.json", "fid") for s in config["seeds"]]
        }
        for model in config["evaluation"]["classifiers"]:
            per_metric[f"acc_{model}"] = [
                _accuracy_percent(exp_dir / f"acc_{model}_seed{s}.json") for s in config["seeds"]
            ]
        for metric in METRICS:
            values = per_metric.get(metric)
            row.mean[metric], row.std[metric] = mean_std(values) if values else (None, None)
        if kind in ("real", "nonprivate"):
            row.epsilon = row.epsilon_paper = math.inf
        else:
            privacy = io.read_json(exp_dir / "privacy.json")
            for key in ("epsilon", "epsilon_paper_convention"):
                if key not in privacy:
                    raise ValueError(f"{exp_dir / 'privacy.json'}: missing key {key!r}")
            row.epsilon = _epsilon(privacy["epsilon"])
            row.epsilon_paper = _epsilon(privacy["epsilon_paper_convention"])
        row.paper = dict(zip(METRICS, _paper_values(dataset, kind, spec), strict=True))
        rows.append(row)
    return rows


def _paper_values(dataset: str, kind: str, spec: dict) -> tuple:
    """The paper's numbers for the cells of one of our rows (None where it has none)."""
    if kind == "real":
        values = PAPER_REAL.get(dataset)
    elif kind == "nonprivate":
        values = PAPER_NONPRIVATE.get((dataset, float(spec["m"])))
    elif kind == "paper":
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


def to_csv(rows: Sequence[Row]) -> str:
    """CSV with the columns of :data:`CSV_COLUMNS` (empty cell = not available)."""
    buffer = _io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cells = [row.method, row.dataset, _num(row.epsilon), _num(row.epsilon_paper)]
        for metric in METRICS:
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
        text += f" (paper {row.paper[metric]:.1f})"
    return text


def _eps(value: float | None, reported: bool, latex: bool = False) -> str:
    if value is None:
        return "–" if not latex else "--"
    if math.isinf(value):
        return "$\\infty$" if latex else "∞"
    return f"{value:g}" if reported else f"{value:.2f}"


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
        "# Table 1: DP image generation on MNIST and Fashion-MNIST",
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
    header = "| Method | ε (sound) | ε (paper conv.) | FID ↓ | Log Reg | MLP | CNN | Source |"
    for dataset in dict.fromkeys(r.dataset for r in rows):
        lines += [f"## {DATASET_TITLES.get(dataset, dataset)}", "", header, "|" + "---|" * 8]
        for row in (r for r in rows if r.dataset == dataset):
            method = row.method + ("¹" if row.method == "G-PATE" else "")
            reported = row.source == REPORTED
            eps_paper = _eps(row.epsilon_paper, reported)
            if row.source == THIS_RUN and row.method == ROW_LABELS["paper"]:
                eps_paper += f" (paper {PAPER_DP_EPSILON:g})"
            cells = [method, _eps(row.epsilon, reported), eps_paper]
            cells += [_cell(row, m) for m in METRICS] + [row.source]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(GPATE_NOTE)
    lines += ["", "## Experiments", ""]
    lines += [
        "| Dataset | Row | Experiment | Method | σ | steps | B | m | lr | p |",
        "|" + "---|" * 10,
    ]
    for row in (r for r in rows if r.exp_name):
        spec = experiment(config, row.exp_name)
        sigma = "solved" if spec["sigma"] is None else f"{spec['sigma']:g}"
        sigma = "–" if spec["method"] != "dp_sinkhorn" else sigma
        train = [sigma, str(spec["steps"]), str(spec["batch_size"])]
        train += [f"{spec['m']:g}", f"{spec['lr']:g}", f"{spec['p']:g}"]
        if spec["method"] == "real_data":
            train = ["–"] * 6
        cells = [DATASET_TITLES.get(row.dataset, row.dataset), row.method, f"`{row.exp_name}`"]
        lines.append("| " + " | ".join(cells + [spec["method"]] + train) + " |")
    if figures:
        lines += ["", "## Samples", ""]
        for dataset, (rel_path, name) in figures.items():
            title = DATASET_TITLES.get(dataset, dataset)
            lines += [f"{title}, `{name}` (one row per class):", "", f"![{title}]({rel_path})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _latex_escape(text: str) -> str:
    for char, repl in [("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$")]:
        text = text.replace(char, repl)
    for char in "#_{}":
        text = text.replace(char, "\\" + char)
    return text.replace("ε", "$\\varepsilon$")


def to_latex(rows: Sequence[Row]) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs}); reported rows marked with †."""
    lines = [
        "% Table 1, written by `dpsinkhorn report table1`. Needs \\usepackage{booktabs}.",
        "% Rows marked \\dag are reported in the paper; the others come from this run",
        "% (mean $\\pm$ std over seeds). Accuracy in %.",
        "\\begin{tabular}{lrrrrrr}",
        "\\toprule",
        "Method & $\\varepsilon$ & $\\varepsilon_{\\mathrm{paper}}$ & FID & Log Reg & MLP & CNN"
        " \\\\",
    ]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        title = DATASET_TITLES.get(dataset, dataset)
        lines += ["\\midrule", f"\\multicolumn{{7}}{{l}}{{\\textit{{{title}}}}} \\\\"]
        for row in (r for r in rows if r.dataset == dataset):
            method = _latex_escape(row.method) + (
                "\\textsuperscript{\\dag}" if row.source == REPORTED else ""
            )
            reported = row.source == REPORTED
            cells = [method, _eps(row.epsilon, reported, True)]
            cells.append(_eps(row.epsilon_paper, reported, True))
            cells += [_cell(row, m, " $\\pm$ ", latex=True) for m in METRICS]
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
    from matplotlib.figure import Figure  # Agg via Figure.savefig; no pyplot state

    images, labels = io.load_samples(samples)
    names = CLASS_NAMES.get(dataset) or [str(c) for c in range(int(labels.max()) + 1)]
    grid = sample_grid(images, labels, len(names), per_class)
    h = images.shape[1] + 2
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
    with io.atomic_path(out) as tmp:
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
    tables = out_dir / "tables"
    for suffix, text in [
        ("md", to_markdown(rows, config, figures)),
        ("csv", to_csv(rows)),
        ("tex", to_latex(rows)),
    ]:
        io.write_text(tables / f"table1.{suffix}", text)
        written.append(tables / f"table1.{suffix}")
    return written


def _table1_cli(args: argparse.Namespace) -> int:
    for path in table1(args.config, args.out_dir):
        print(path)
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``dpsinkhorn report <table> ...``: one sub-command per table of the paper."""
    parser = subparsers.add_parser("report", help="build result tables and figures of a run")
    reports = parser.add_subparsers(dest="report", required=True, metavar="TABLE")
    t1 = reports.add_parser(
        "table1", help="Table 1 (MNIST, Fashion-MNIST): tables/table1.{md,csv,tex} + figures"
    )
    t1.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
    t1.add_argument("--out-dir", required=True, help="the run's results folder (results/<run>)")
    t1.set_defaults(handler=_table1_cli)
