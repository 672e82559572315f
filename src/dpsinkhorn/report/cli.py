"""``dpsinkhorn report <name>``: one sub-command per table, figure set or results set."""

from __future__ import annotations

import argparse
from pathlib import Path

from dpsinkhorn.config import load_config
from dpsinkhorn.config.studies import FIGURE_STUDIES, TABLE_STUDIES
from dpsinkhorn.config.targets import MAIN_TABLES, NAMES, SAMPLE_FIGURES, TITLES, available
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


def _help(name: str) -> str:
    """A sub-command's help: its output's title and the files it writes."""
    files = f"tables/{name}.{{md,csv,tex}}"
    if name in MAIN_TABLES:
        files += " and figures"
    elif name == "reproduction":
        files = "reproduction.md"
    elif name not in TABLE_STUDIES:
        files = f"figures/{name}.{{png,pdf,csv}}"
    return f"{TITLES[name]} ({files})"


def _cli(args: argparse.Namespace) -> int:
    # A main table or sample figure of a config without its experiments would be written
    # with no rows (a study's output names the study the config lacks itself).
    produced = available(load_config(args.config))
    if args.report in (*MAIN_TABLES, *SAMPLE_FIGURES) and args.report not in produced:
        raise ValueError(
            f"this config does not produce {args.report!r} (it produces: {', '.join(produced)})"
        )
    for path in render(args.report, args.config, args.out_dir):
        print(path)
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dpsinkhorn report`` and a sub-command per output and for results sets."""
    parser = subparsers.add_parser("report", help="build result tables and figures of a run")
    reports = parser.add_subparsers(dest="report", required=True, metavar="TABLE")
    for name in (*MAIN_TABLES, *REPORTS):
        sub = reports.add_parser(name, help=_help(name))
        sub.add_argument("--config", nargs="+", required=True, help="the run's config file(s)")
        sub.add_argument(
            "--out-dir", required=True, help="the run's results folder (results/<run>)"
        )
        sub.set_defaults(handler=_cli)
    resultset.register(reports)
