"""``dpsinkhorn <command> ...``: each module that offers a command defines
``register_cli(subparsers)``, which adds its sub-parser with a ``handler`` (parsed
arguments -> exit code); this file only wires them together."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

# command -> the module that offers it. Only the invoked command's module is imported (a
# job's start skips the others' imports); `dpsinkhorn --help` imports them all.
COMMANDS = {
    "data": "data.datasets",
    "celeba-fixture": "data.celeba",
    "privacy": "privacy.cli",
    "train": "train.cli",
    "train-sweep": "train.sweep",
    "release": "publish.decision",
    "release-manifest": "publish.decision",
    "fid-stats": "evaluate.fid",
    "evaluate": "evaluate.job",
    "report": "report.cli",
    "privacy-summary": "report.privacy_summary",
    "records": "privacy.record_store",
    "bench": "bench.cli",
    "grad-study": "evaluate.gradstudy",
    "targets": "config.targets",
    "plan": "plan",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))
# Commands that stop between training steps (train.signals.StopSignal: checkpoint, exit 75).
# A scheduler's SIGTERM / SIGUSR1 while they start is held pending until the training loop's
# handler takes it, so the job checkpoints instead of dying with nothing saved. SIGINT (the
# user's Ctrl-C) is never held.
HOLDS_STOP_SIGNALS = {"train", "train-sweep"}
STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone when it is one of COMMANDS."""
    parser = argparse.ArgumentParser(
        prog="dpsinkhorn",
        description="DP-Sinkhorn: differentially private generators trained with Sinkhorn loss.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in names:
        module = importlib.import_module(f"dpsinkhorn.{name}")
        module.register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HOLDS_STOP_SIGNALS:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, OSError, KeyError) as err:
        # Bad input, a path that cannot be used (missing, not a folder, no permission) or a
        # full disk (fileio.NoSpaceError): one line naming the key, file or value (a line
        # break in a file's name escaped), no traceback; exit 2 (train.smk retries exit 75 only).
        text = str(err).replace("\r", "\\r").replace("\n", "\\n")
        print(f"dpsinkhorn {args.command}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
