"""Table 1: ``dpsinkhorn report table1 --config FILES --out-dir``.

Our rows (``this run``: mean ± std over seeds, DP-MERF computed here) and the paper's
baselines (``reported in paper``), per dataset. Writes ``tables/table1.{md,csv,tex}`` and
``figures/samples_<dataset>.png``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dpsinkhorn.config import (
    FIGURES_DIR,
    PRIVATE_METHODS,
    experiment,
    experiment_dir,
    figure_experiment,
    table1_experiments,
)
from dpsinkhorn.config.targets import TITLES, sample_name, table1_files
from dpsinkhorn.data.catalog import own_layout, resize_statement
from dpsinkhorn.report.common import (
    DATASET_TITLES,
    METRICS,
    REPORTED,
    ROW_LABELS,
    ConfigLike,
    PathLike,
    Row,
    check_exist,
    epsilon_text,
    guarantee_note,
    load_config_like,
    markdown_table,
    measured_row,
    mechanism_note,
    settings_cells,
    sound_epsilons,
    to_csv,
    to_latex,
    write_tables,
)
from dpsinkhorn.report.grids import save_sample_figure
from dpsinkhorn.report.paper import (
    GPATE_NOTE,
    PAPER_EPSILON,
    PAPER_SETTING_ROWS,
    REPORTED_BASELINES,
    sok_note,
    table1_paper_values,
)


def our_rows(config: dict, results_dir: Path) -> list[Row]:
    """Rows measured in this run, one per Table 1 experiment of the config."""
    inputs = table1_files(config, results_dir)  # what the workflow's table1 rule reads
    check_exist(Path(f) for f in [*inputs["results"], *inputs["privacy"]])
    return [
        measured_row(
            config,
            results_dir,
            name,
            ROW_LABELS[kind],
            table1_paper_values(dataset, kind, experiment(config, name)),
        )
        for (dataset, kind), name in table1_experiments(config).items()
    ]


def reported_rows(datasets: Iterable[str]) -> list[Row]:
    """The paper's reported baselines for these datasets."""
    rows = []
    for dataset in datasets:
        for method, by_dataset in REPORTED_BASELINES.items():
            if dataset in by_dataset:
                values = [None if v is None else float(v) for v in by_dataset[dataset]]
                mean, std = dict(zip(METRICS, values, strict=True)), dict.fromkeys(METRICS)
                rows.append(Row(method, dataset, REPORTED, PAPER_EPSILON, mean=mean, std=std))
    return rows


def table1_rows(config: dict, results_dir: Path) -> list[Row]:
    """Our rows then the reported baselines, grouped by dataset in config order."""
    ours = our_rows(config, results_dir)
    datasets = list(dict.fromkeys(r.dataset for r in ours))
    theirs = reported_rows(datasets)
    return [r for d in datasets for r in ours + theirs if r.dataset == d]


def own_dataset_note(config: Mapping, dataset: str) -> list[str]:
    """An own dataset's source and preparation, and that scores against its (private) test
    split are not covered by the guarantee; nothing for a built-in dataset."""
    definition = (config.get("datasets") or {}).get(dataset)
    if definition is None:
        return []
    return [
        f"Own dataset ({own_layout(definition['path'])}): {resize_statement(definition)}. "
        "Its test split is private data: the FID and accuracies below are computed against "
        "it and are not covered by the privacy guarantee (they are kept under `nonprivate/`, "
        "out of the release).",
        "",
    ]


def table1_title(datasets: Iterable[str]) -> str:
    """ "Table 1: DP image generation on <the datasets of the rows>" (the paper's title for
    MNIST and Fashion-MNIST; an own dataset by its title)."""
    titles = [DATASET_TITLES.get(d, d) for d in dict.fromkeys(datasets)]
    names = (
        " and ".join(titles) if len(titles) < 3 else ", ".join(titles[:-1]) + " and " + titles[-1]
    )
    return f"{TITLES['table1'].split(' on ', 1)[0]} on {names}"


def to_markdown(rows: Sequence[Row], config: dict, figures: dict[str, tuple[str, str]]) -> str:
    """Markdown: one table per dataset, the paper's value next to each reproduced cell;
    ``figures``: dataset -> (figure path relative to tables/, experiment name)."""
    seeds = len(config["seeds"])
    specs = [experiment(config, r.exp_name) for r in rows if r.exp_name]
    deltas = {
        f"{s['delta']:.0e}".replace("e-0", "e-") for s in specs if s["method"] in PRIVATE_METHODS
    }
    deltas = ", ".join(sorted(deltas))
    deltas = f", δ = {deltas}" if deltas else ""
    lines = [
        f"# {table1_title(r.dataset for r in rows)}",
        "",
        f"Rows from *this run* are mean ± std over {seeds} seed(s) (sample std, ddof=1; "
        "no ± for one seed); each seed is one synthetic set of "
        f"{config['evaluation']['num_samples']} samples and one training of each classifier. "
        "`(paper X)` is the value in the paper's final Table 1. ε (sound) is the accountant's "
        "ε; ε (paper conv.) is the same run under the paper's accounting convention, which "
        f"the paper reports as ε = {PAPER_EPSILON:g}. Accuracy in %{deltas}. "
        "Rows *reported in paper* are copied from the paper (– = N/A or not run).",
        "",
    ]
    official = [r.dataset for r in rows if r.method == ROW_LABELS["sound_official"]]
    notes = (guarantee_note(rows), mechanism_note(rows), sok_note(official))
    lines += [note for note in notes if note]
    lines += [""] if lines[-1] else []
    paper_eps = {ROW_LABELS[k]: PAPER_EPSILON for k in PAPER_SETTING_ROWS}
    for dataset in dict.fromkeys(r.dataset for r in rows):
        lines += [f"## {DATASET_TITLES.get(dataset, dataset)}", ""]
        lines += own_dataset_note(config, dataset)
        in_dataset = [r for r in rows if r.dataset == dataset]
        lines += markdown_table(in_dataset, METRICS, paper_eps, {"G-PATE": "¹"}) + [""]
    if any(r.method == "G-PATE" for r in rows):
        lines.append(GPATE_NOTE)
    lines += ["", "## Experiments", ""]
    lines += [
        "| Dataset | Row | Experiment | Method | clipping | σ | steps | B | m | lr | p "
        "| ε RDP | ε PLD |",
        "|" + "---|" * 13,
    ]
    for row in (r for r in rows if r.exp_name):
        spec = experiment(config, row.exp_name)
        train = settings_cells(spec, ("sigma", "steps", "batch_size", "m", "lr", "p"))
        if spec["method"] == "dpmerf":  # no Sinkhorn cost, no debiasing
            train[3], train[5] = "–", "–"
        clipping = spec["clipping"] if spec["method"] == "dp_sinkhorn" else "–"
        eps = sound_epsilons(row.privacy)
        train = [clipping, *train, *(epsilon_text(eps.get(a), False) for a in ("rdp", "pld"))]
        if spec["method"] == "real_data":
            train = ["–"] * 9
        cells = [DATASET_TITLES.get(row.dataset, row.dataset), row.method, f"`{row.exp_name}`"]
        lines.append("| " + " | ".join(cells + [spec["method"]] + train) + " |")
    if figures:
        lines += ["", "## Samples", ""]
        for dataset, (rel_path, name) in figures.items():
            title = DATASET_TITLES.get(dataset, dataset)
            unconditional = experiment(config, name).get("conditional", True) is False
            layout = "unconditional: one row of samples" if unconditional else "one row per class"
            lines += [f"{title}, `{name}` ({layout}):", "", f"![{title}]({rel_path})", ""]
    return "\n".join(lines).rstrip() + "\n"


def table1(config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write Table 1 (md, csv, tex) and the sample figures; return the written paths."""
    config, _ = load_config_like(config)
    out_dir = Path(out_dir)
    rows = table1_rows(config, out_dir)
    seed = config["seeds"][0]
    figures, written = {}, []
    for dataset in dict.fromkeys(r.dataset for r in rows):
        name = figure_experiment(config, dataset)
        if name is None:
            continue
        png = out_dir / FIGURES_DIR / f"samples_{dataset}.png"
        samples = experiment_dir(config, out_dir, name) / sample_name(seed)
        check_exist([samples])
        title = f"{DATASET_TITLES.get(dataset, dataset)}: {name} (seed {seed})"
        save_sample_figure(samples, png, dataset, title)
        figures[dataset] = (f"../figures/{png.name}", name)
        written.append(png)
    md, tex = to_markdown(rows, config, figures), to_latex(rows)
    return written + write_tables(out_dir, "table1", md, to_csv(rows), tex)
