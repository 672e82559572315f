"""``dpsinkhorn report <name>``: one sub-command per table, figure set or results set.

The reporting modules build on each other (ablations and resultset use report's
formatting), so the command that gathers all of them lives above them all, here.
"""

from __future__ import annotations

import argparse

from dpsinkhorn.report import ablations, resultset
from dpsinkhorn.report import core as report


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dpsinkhorn report`` with Tables 1/3/6 (report), the studies' tables and
    figures and reproduction.md (ablations), and committed results sets (resultset)."""
    parser = subparsers.add_parser("report", help="build result tables and figures of a run")
    reports = parser.add_subparsers(dest="report", required=True, metavar="TABLE")
    report.register_tables(reports)
    ablations.register_reports(reports)
    resultset.register(reports)
