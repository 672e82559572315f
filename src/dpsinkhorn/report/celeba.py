"""Tables 3 and 6 (CelebA): ``dpsinkhorn report {table3,table6} --config FILES --out-dir``.
Table 1's conventions with columns FID, MLP, CNN; rows from the experiments' ``rows:``;
writes ``tables/table{3,6}.{md,csv,tex}`` and ``figures/fig{3,6}.png``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import (
    FIGURES_DIR,
    PRIVATE_METHODS,
    TABLE_FIGURES,
    experiment,
    experiment_dir,
    prepared_folder_of,
    table_experiments,
    table_figure_experiments,
    table_files,
)
from dpsinkhorn.config.targets import TITLES, sample_name
from dpsinkhorn.report.common import (
    CLASS_NAMES,
    REPORTED,
    ConfigLike,
    PathLike,
    Row,
    check_exist,
    guarantee_note,
    load_config_like,
    markdown_table,
    measured_row,
    settings_cells,
    to_csv,
    to_latex,
    write_tables,
)
from dpsinkhorn.report.grids import save_grid_figure
from dpsinkhorn.report.paper import (
    CELEBA_METRICS,
    CELEBA_PAPER,
    CELEBA_PAPER_EPSILON,
    CELEBA_REPORTED,
    CELEBA_REPORTED_NOTES,
)

#: Tables 3 and 6: our row labels (row key, config ``rows:`` -> method) and figure caption.
CELEBA_TABLES = {
    "table3": (
        {
            "real": "Real data",
            "nonprivate": "Sinkhorn (non-private)",
            "dp": "DP-Sinkhorn",
            "dpmerf": "DP-MERF (computed)",
        },
        "DP-Sinkhorn samples (paper Fig. 3); rows: female, male",
    ),
    "table6": (
        {"real": "Real data", "dcgan": "DCGAN+DP-Sinkhorn", "biggan": "BigGAN+DP-Sinkhorn"},
        "DCGAN rows, then BigGAN rows (paper Fig. 6)",
    ),
}

#: The caption's warning when CelebA was prepared from the synthetic fixture.
FIXTURE_NOTE = (
    "**Data: the SYNTHETIC CelebA FIXTURE (dpsinkhorn celeba-fixture), not CelebA. "
    "These numbers test the pipeline and say nothing about the paper.**"
)


def celeba_rows(config: dict, table: str, results_dir: Path) -> list[Row]:
    """Our rows of Table 3 or 6 (config ``rows:``), then the paper's reported baselines."""
    labels, paper = CELEBA_TABLES[table][0], CELEBA_PAPER[table]
    files = table_files(config, table, results_dir)
    check_exist(Path(f) for f in files["results"] + files["privacy"])
    rows = [
        measured_row(config, results_dir, name, labels[kind], paper[kind], CELEBA_METRICS)
        for (_, kind), name in table_experiments(config, table).items()
    ]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        if dataset != "celeba":
            continue
        for method, (eps, values) in CELEBA_REPORTED[table].items():
            mean = dict(zip(CELEBA_METRICS, values, strict=True))
            rows.append(Row(method, dataset, REPORTED, eps, mean=mean, std={}))
    return rows


def fixture_data(config: Mapping) -> bool:
    """Whether CelebA was prepared from the synthetic fixture (``dpsinkhorn celeba-fixture``)."""
    from dpsinkhorn.data.celeba import is_fixture

    return is_fixture(Path(config["data_dir"]) / prepared_folder_of(config, "celeba"))


def celeba_table(table: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write Table 3 or 6 (md, csv, tex) and its figure (fig3 / fig6); return the paths."""
    row_labels, caption = CELEBA_TABLES[table]
    (config, _), out_dir = load_config_like(config), Path(out_dir)
    rows = celeba_rows(config, table, out_dir)
    seed = config["seeds"][0]
    figure_name, _ = TABLE_FIGURES[table]
    png = out_dir / FIGURES_DIR / f"{figure_name}.png"
    names = table_figure_experiments(config, table)
    labels = {n: r.method.removesuffix("+DP-Sinkhorn") for r in rows if (n := r.exp_name)}
    panels = []
    for name in names:
        samples = experiment_dir(config, out_dir, name) / sample_name(seed)
        check_exist([samples])
        images, sample_labels = fileio.load_samples(samples)
        panels.append((images, sample_labels, labels[name] if len(names) > 1 else ""))
    if panels:
        title = f"{caption}: {', '.join(names)} (seed {seed})"
        save_grid_figure(panels, CLASS_NAMES["celeba"], png, title)

    fixture = FIXTURE_NOTE if fixture_data(config) else ""
    seeds = len(config["seeds"])
    specs = [experiment(config, r.exp_name) for r in rows if r.exp_name]
    deltas = sorted({f"{e['delta']:g}" for e in specs if e["method"] in PRIVATE_METHODS})
    lines = [f"# {TITLES[table]}", ""] + ([fixture, ""] if fixture else [])
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
    paper_eps = {row_labels[k]: v for k, v in CELEBA_PAPER_EPSILON[table].items()}
    lines += markdown_table(rows, CELEBA_METRICS, paper_eps) + [""]
    notes = CELEBA_REPORTED_NOTES[table]
    lines += [f"Note: {n}" for n in notes] + ([""] if notes else [])
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
            keys = ("sigma", "steps", "batch_size", "m", "entropy_reg", "lr")
            train = [exp.get("generator") or "dcgan", *settings_cells(exp, keys)]
        cells = [row.method, f"`{row.exp_name}`", exp["method"], *train]
        lines.append("| " + " | ".join(cells) + " |")
    if panels:
        lines += ["", "## Samples", "", f"{caption}:", ""]
        lines += [f"![{figure_name}](../figures/{png.name})"]
    md = "\n".join(lines).rstrip() + "\n"
    note = "SYNTHETIC CelebA FIXTURE, not CelebA." if fixture else ""
    tex = to_latex(rows, CELEBA_METRICS, table, note)
    written = write_tables(out_dir, table, md, to_csv(rows, CELEBA_METRICS), tex)
    return written + ([png] if panels else [])
