"""Command line interface: ``dpsinkhorn <command> ...``.

Each module that offers a command defines ``register_cli(subparsers)``, which
adds its sub-parser and sets ``handler`` to a function taking the parsed
arguments and returning an exit code. This file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dpsinkhorn.fileio import NoSpaceError

# module name -> offers one or more sub-commands through register_cli()
COMMAND_MODULES = [
    "data.datasets",
    "data.celeba",
    "privacy.cli",
    "train.cli",
    "train.sweep",
    "train.publish",
    "evaluate.sample",
    "evaluate.fid",
    "evaluate.classify",
    "evaluate.job",
    "window_setup",
    "report.cli",
    "report.privacy_summary",
    "bench.cli",
    "evaluate.gradstudy",
    "config.targets",
    "plan",
    "window",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsinkhorn",
        description="DP-Sinkhorn: differentially private generators trained with Sinkhorn loss.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"dpsinkhorn.{name}")
        module.register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, KeyError, NoSpaceError) as err:
        # Bad input (or a full disk): one clear line naming the key, file or value; no
        # traceback. Retrying cannot help (workflow/rules/train.smk retries exit 75 only).
        print(f"dpsinkhorn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
