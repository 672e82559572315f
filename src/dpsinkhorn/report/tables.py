"""Tables 1, 3 and 6: ``dpsinkhorn report {table1,table3,table6} --config FILES --out-dir``.
Our rows (``this run``: mean ± std over seeds) beside the paper's baselines (``reported in
paper``), and their sample figures (files: docs/CONTRACTS.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    FIGURES_DIR,
    PRIVATE_METHODS,
    TABLE_FIGURES,
    experiment,
    experiment_dir,
    figure_experiment,
    prepared_folder_of,
    table_experiments,
    table_figure_experiments,
    table_files,
)
from dpsinkhorn.config.targets import TITLES, sample_name
from dpsinkhorn.data.catalog import own_layout, resize_statement
from dpsinkhorn.report.common import (
    ACCOUNTING_NOTE,
    CLASS_NAMES,
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
    md_table,
    measured_row,
    mechanism_note,
    settings_cells,
    sound_epsilons,
    to_csv,
    to_latex,
    write_tables,
)
from dpsinkhorn.report.grids import grid_classes, save_grid_figure
from dpsinkhorn.report.paper import (
    CELEBA_METRICS,
    CELEBA_PAPER,
    CELEBA_PAPER_EPSILON,
    CELEBA_REPORTED,
    CELEBA_REPORTED_NOTES,
    GPATE_NOTE,
    PAPER_EPSILON,
    PAPER_SETTING_ROWS,
    REPORTED_BASELINES,
    sok_note,
    table1_paper_values,
)

#: Each table's row labels: row kind (``table1_row`` / config ``rows:``) -> method.
TABLE_ROW_LABELS = {
    "table1": ROW_LABELS,
    "table3": {
        "real": "Real data",
        "nonprivate": "Sinkhorn (non-private)",
        "dp": "DP-Sinkhorn",
        "dpmerf": "DP-MERF (computed)",
    },
    "table6": {"real": "Real data", "dcgan": "DCGAN+DP-Sinkhorn", "biggan": "BigGAN+DP-Sinkhorn"},
}
#: The caption of the CelebA tables' figures.
CELEBA_FIGURE_CAPTIONS = {
    "table3": "DP-Sinkhorn samples (paper Fig. 3); rows: female, male",
    "table6": "DCGAN rows, then BigGAN rows (paper Fig. 6)",
}

#: The caption's warning when CelebA was prepared from the synthetic fixture.
FIXTURE_NOTE = (
    "**Data: the SYNTHETIC CelebA FIXTURE (dpsinkhorn celeba-fixture), not CelebA. "
    "These numbers test the pipeline and say nothing about the paper.**"
)


def table_metrics(table: str) -> tuple[str, ...]:
    """The metric columns of Table 1 (FID, Log Reg, MLP, CNN) or a CelebA table (no Log Reg)."""
    return METRICS if table == "table1" else CELEBA_METRICS


def paper_epsilons(table: str) -> dict[str, float]:
    """Method -> the ε the paper reports for that row of ours (its convention)."""
    if table == "table1":
        return {ROW_LABELS[k]: PAPER_EPSILON for k in PAPER_SETTING_ROWS}
    labels = TABLE_ROW_LABELS[table]
    return {labels[k]: v for k, v in CELEBA_PAPER_EPSILON[table].items()}


def our_rows(config: dict, table: str, results_dir: Path) -> list[Row]:
    """Rows measured in this run, one per experiment of the table in the config."""
    files = table_files(config, table, results_dir)  # what the workflow's table rule reads
    check_exist(Path(f) for f in files["results"] + files["privacy"])
    rows = []
    for (dataset, kind), name in table_experiments(config, table).items():
        if table == "table1":
            paper = table1_paper_values(dataset, kind, experiment(config, name))
        else:
            paper = CELEBA_PAPER[table][kind]
        label = TABLE_ROW_LABELS[table][kind]
        rows.append(measured_row(config, results_dir, name, label, paper, table_metrics(table)))
    return rows


def table_rows(config: dict, table: str, results_dir: Path) -> list[Row]:
    """Our rows, then the paper's baselines (Table 1: per dataset, in config order)."""
    ours = our_rows(config, table, results_dir)
    datasets = list(dict.fromkeys(r.dataset for r in ours))
    if table != "table1":
        reported = CELEBA_REPORTED[table] if "celeba" in datasets else {}
        for method, (eps, values) in reported.items():
            mean = dict(zip(CELEBA_METRICS, values, strict=True))
            ours.append(Row(method, "celeba", REPORTED, eps, mean=mean, std={}))
        return ours
    rows = []
    for dataset in datasets:
        rows += [r for r in ours if r.dataset == dataset]
        for method, by_dataset in REPORTED_BASELINES.items():
            if dataset in by_dataset:
                values = [None if v is None else float(v) for v in by_dataset[dataset]]
                mean, std = dict(zip(METRICS, values, strict=True)), dict.fromkeys(METRICS)
                rows.append(Row(method, dataset, REPORTED, PAPER_EPSILON, mean=mean, std=std))
    return rows


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
    """ "Table 1: DP image generation on <the datasets' titles>"."""
    titles = [DATASET_TITLES.get(d, d) for d in dict.fromkeys(datasets)]
    names = " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 2 else titles)
    return f"{TITLES['table1'].split(' on ', 1)[0]} on {names}"


def _seeds_sentence(config: Mapping) -> str:
    """How a cell of ours is measured (Tables 1, 3, 6 captions)."""
    return (
        f"Rows from *this run* are mean ± std over {len(config['seeds'])} seed(s) (sample std, "
        "ddof=1; no ± for one seed); each seed is one synthetic set of "
        f"{config['evaluation']['num_samples']} samples and one training of each classifier"
    )


def _deltas(config: Mapping, rows: Sequence[Row], fmt: str = "g") -> list[str]:
    """The distinct δ of the DP experiments of ``rows``, sorted."""
    specs = [experiment(config, r.exp_name) for r in rows if r.exp_name]
    return sorted({format(s["delta"], fmt) for s in specs if s["method"] in PRIVATE_METHODS})


def table1_markdown(rows: Sequence[Row], config: dict, figures: dict[str, tuple[str, str]]):
    """Table 1's Markdown lines; ``figures``: dataset -> (figure path from tables/, experiment)."""
    deltas = ", ".join(sorted(d.replace("e-0", "e-") for d in _deltas(config, rows, ".0e")))
    deltas = f", δ = {deltas}" if deltas else ""
    lines = [
        f"# {table1_title(r.dataset for r in rows)}",
        "",
        f"{_seeds_sentence(config)}. `(paper X)` is the value in the paper's final Table 1. "
        f"{ACCOUNTING_NOTE} Accuracy in %{deltas}. "
        "Rows *reported in paper* are copied from the paper (– = N/A or not run).",
        "",
    ]
    official = [r.dataset for r in rows if r.method == ROW_LABELS["sound_official"]]
    notes = (guarantee_note(rows), mechanism_note(rows), sok_note(official))
    lines += [note for note in notes if note]
    lines += [""] if lines[-1] else []
    for dataset in dict.fromkeys(r.dataset for r in rows):
        lines += [f"## {DATASET_TITLES.get(dataset, dataset)}", ""]
        lines += own_dataset_note(config, dataset)
        in_dataset = [r for r in rows if r.dataset == dataset]
        lines += markdown_table(in_dataset, METRICS, paper_epsilons("table1"), {"G-PATE": "¹"})
        lines += [""]
    if any(r.method == "G-PATE" for r in rows):
        lines.append(GPATE_NOTE)
    lines += ["", "## Experiments", ""]
    header = "Dataset Row Experiment Method clipping σ steps B m lr p".split() + ["ε RDP", "ε PLD"]
    experiments = []
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
        experiments.append([*cells, spec["method"], *train])
    lines += md_table(header, experiments)
    if figures:
        lines += ["", "## Samples", ""]
        for dataset, (rel_path, name) in figures.items():
            title = DATASET_TITLES.get(dataset, dataset)
            unconditional = experiment(config, name).get("conditional", True) is False
            layout = "unconditional: one row of samples" if unconditional else "one row per class"
            lines += [f"{title}, `{name}` ({layout}):", "", f"![{title}]({rel_path})", ""]
    return lines


def fixture_data(config: Mapping) -> bool:
    """Whether CelebA was prepared from the synthetic fixture (``dpsinkhorn celeba-fixture``)."""
    from dpsinkhorn.data.celeba import is_fixture

    return is_fixture(Path(config["data_dir"]) / prepared_folder_of(config, "celeba"))


def celeba_markdown(table: str, rows: Sequence[Row], config: dict, figure: str) -> list[str]:
    """Table 3's or 6's Markdown lines; ``figure``: its figure's path from tables/ (or '')."""
    fixture = FIXTURE_NOTE if fixture_data(config) else ""
    deltas = _deltas(config, rows)
    lines = [f"# {TITLES[table]}", ""] + ([fixture, ""] if fixture else [])
    public = guarantee_note(rows)
    lines += [public, ""] if public else []
    lines += [
        f"{_seeds_sentence(config)} (MLP, CNN: the paper has no Log-Reg for CelebA), evaluated "
        "on the real test set; FID against the test set. `(paper X)` is the paper's value. "
        "ε (sound) is the accountant's ε; ε (paper conv.) is the same run under the paper's "
        "convention, which the paper reports as ε = 10"
        + (f" (δ = {', '.join(deltas)})" if deltas else "")
        + ". Accuracy in %. Rows *reported in paper* are copied from the paper (– = N/A).",
        "",
    ]
    lines += markdown_table(rows, CELEBA_METRICS, paper_epsilons(table)) + [""]
    notes = CELEBA_REPORTED_NOTES[table]
    lines += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    lines += ["## Experiments", ""]
    experiments = []
    for row in (r for r in rows if r.exp_name):
        exp = experiment(config, row.exp_name)
        if exp["method"] == "real_data":
            train = ["–"] * 7
        else:
            keys = ("sigma", "steps", "batch_size", "m", "entropy_reg", "lr")
            train = [exp.get("generator") or "dcgan", *settings_cells(exp, keys)]
        experiments.append([row.method, f"`{row.exp_name}`", exp["method"], *train])
    header = "Row Experiment Method generator σ steps B m λ lr".split()
    lines += md_table(header, experiments)
    if figure:
        lines += ["", "## Samples", "", f"{CELEBA_FIGURE_CAPTIONS[table]}:", ""]
        lines += [f"![{Path(figure).stem}]({figure})"]
    return lines


def _table1_figures(config: dict, rows: Sequence[Row], out_dir: Path) -> dict[str, tuple]:
    """Write ``figures/samples_<dataset>.png``; dataset -> (its path from tables/, experiment)."""
    seed, figures = config["seeds"][0], {}
    for dataset in dict.fromkeys(r.dataset for r in rows):
        name = figure_experiment(config, dataset)
        if name is None:
            continue
        png = out_dir / FIGURES_DIR / f"samples_{dataset}.png"
        samples = experiment_dir(config, out_dir, name) / sample_name(seed)
        check_exist([samples])
        title = f"{DATASET_TITLES.get(dataset, dataset)}: {name} (seed {seed})"
        images, labels, names = grid_classes(*fileio.load_samples(samples), dataset)
        save_grid_figure([(images, labels, "")], names, png, title)
        figures[dataset] = (f"../figures/{png.name}", name)
    return figures


def _celeba_figure(config: dict, table: str, rows: Sequence[Row], out_dir: Path) -> Path | None:
    """Write the table's figure (fig3 / fig6) of the first seed's samples; its path or None."""
    seed = config["seeds"][0]
    names = table_figure_experiments(config, table)
    labels = {n: r.method.removesuffix("+DP-Sinkhorn") for r in rows if (n := r.exp_name)}
    panels = []
    for name in names:
        samples = experiment_dir(config, out_dir, name) / sample_name(seed)
        check_exist([samples])
        images, sample_labels = fileio.load_samples(samples)
        panels.append((images, sample_labels, labels[name] if len(names) > 1 else ""))
    if not panels:
        return None
    png = out_dir / FIGURES_DIR / f"{TABLE_FIGURES[table][0]}.png"
    title = f"{CELEBA_FIGURE_CAPTIONS[table]}: {', '.join(names)} (seed {seed})"
    save_grid_figure(panels, CLASS_NAMES["celeba"], png, title)
    return png


def main_table(table: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write Table 1, 3 or 6 (md, csv, tex) and its figures; return the written paths."""
    (config, _), out_dir = load_config_like(config), Path(out_dir)
    rows, metrics = table_rows(config, table, out_dir), table_metrics(table)
    if table == "table1":
        figures = _table1_figures(config, rows, out_dir)
        written = [out_dir / FIGURES_DIR / f"samples_{d}.png" for d in figures]
        lines, note = table1_markdown(rows, config, figures), ""
    else:
        png = _celeba_figure(config, table, rows, out_dir)
        written = [png] if png else []
        lines = celeba_markdown(table, rows, config, f"../figures/{png.name}" if png else "")
        note = "SYNTHETIC CelebA FIXTURE, not CelebA." if fixture_data(config) else ""
    md = "\n".join(lines).rstrip() + "\n"
    tex = to_latex(rows, metrics, table, note)
    tables = write_tables(out_dir, table, md, to_csv(rows, metrics), tex)
    return written + tables if table == "table1" else tables + written


def table1(config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """:func:`main_table` of Table 1."""
    return main_table("table1", config, out_dir)
