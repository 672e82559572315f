"""``dpsinkhorn report <name>``: one sub-command per table, figure set or results set."""

from __future__ import annotations

import argparse
from pathlib import Path

from dpsinkhorn.config.studies import FIGURE_STUDIES, TABLE_STUDIES
from dpsinkhorn.config.targets import MAIN_TABLES, NAMES, SAMPLE_FIGURES
from dpsinkhorn.report import resultset
from dpsinkhorn.report.common import ConfigLike, PathLike
from dpsinkhorn.report.figures import figure
from dpsinkhorn.report.reproduction import reproduction
from dpsinkhorn.report.studies import study_table
from dpsinkhorn.report.tables import main_table

#: The ``dpsinkhorn report`` sub-commands of the studies' outputs, in the paper's order.
REPORTS = tuple(n for n in NAMES if n not in MAIN_TABLES)


def render(name: str, config: ConfigLike, out_dir: PathLike) -> list[Path]:
    """Write output ``name`` (a main table or one of :data:`REPORTS`); return the paths."""
    if name in MAIN_TABLES:
        return main_table(name, config, out_dir)
    if name in TABLE_STUDIES:
        return study_table(name, config, out_dir)
    if name == "reproduction":
        return reproduction(config, out_dir)
    if name in FIGURE_STUDIES or name in SAMPLE_FIGURES:
        return figure(name, config, out_dir)
    raise ValueError(f"unknown report {name!r} (one of {', '.join(REPORTS)})")


REPORT_HELP = {
    "table1": "Table 1 (MNIST, Fashion-MNIST): tables/table1.{md,csv,tex} + figures",
    "table3": "Table 3 (CelebA: DP-Sinkhorn, non-private, real data) + figures/fig3.png; "
    "tables/table3.{md,csv,tex}",
    "table6": "Table 6 (CelebA: BigGAN vs DCGAN generator) + figures/fig6.png; "
    "tables/table6.{md,csv,tex}",
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


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dpsinkhorn report`` with Tables 1/3/6, the studies' tables and figures,
    reproduction.md and committed results sets."""
    parser = subparsers.add_parser("report", help="build result tables and figures of a run")
    reports = parser.add_subparsers(dest="report", required=True, metavar="TABLE")
    for name in (*MAIN_TABLES, *REPORTS):
        sub = reports.add_parser(name, help=REPORT_HELP[name].replace("%", "%%"))
        sub.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
        sub.add_argument(
            "--out-dir", required=True, help="the run's results folder (results/<run>)"
        )
        sub.set_defaults(handler=_cli)
    resultset.register(reports)
