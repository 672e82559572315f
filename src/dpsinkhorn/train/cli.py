"""``dpsinkhorn train`` and what it shares with ``train-sweep``: options and one path.

Exit codes: 0 done; 75 (SIGTERM, SIGUSR1, ``--stop-after``) and 130 (SIGINT), each with a
checkpoint (``train.signals``); 2 on bad input. After 130 or 2 a note in the output folder
(:data:`STOPPED_NAME`) makes a workflow retry (``--attempt`` > 1) end at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.workflow import STOPPED_NAME
from dpsinkhorn.fileio import NoSpaceError, write_text
from dpsinkhorn.models import PRECISIONS
from dpsinkhorn.privacy.record_store import store_root
from dpsinkhorn.train import memory
from dpsinkhorn.train.run import train
from dpsinkhorn.train.signals import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted
from dpsinkhorn.train.trainer import StepOptions


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train one experiment of a config")
    p.add_argument("--experiment", required=True)
    p.add_argument("--out", required=True, help="output folder (results/<run>/<experiment>)")
    add_training_arguments(p)
    p.set_defaults(handler=_cli)


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``dpsinkhorn train`` and ``dpsinkhorn train-sweep``."""
    p.add_argument("--config", nargs="+", required=True, help="config YAML file(s)")
    p.add_argument(
        "--device",
        type=config_lib.device_option,
        help="override the config's device (auto, cpu, cuda, cuda:N)",
    )
    p.add_argument("--data-dir", help="override the config's data_dir")
    p.add_argument(
        "--stop-after",
        type=config_lib.at_least(1),
        help="checkpoint and exit after this many steps",
    )
    add_step_arguments(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--retrain",
        action="store_true",
        help="train again an experiment whose secret-key DP training finished (refused "
        "otherwise; the training record counts it). Workflow: DPSINKHORN_RETRAIN=<exp,...|all>",
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=1,
        help="Snakemake's attempt number: a retry (> 1) after a stop that a retry cannot "
        "fix (SIGINT, exit 130; bad input, exit 2) ends at once with the same code",
    )


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """``--cuda-graphs``, ``--compile-solver``, ``--precision`` (``train.trainer.StepOptions``)."""
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="replay the training step from a CUDA graph (CUDA only; default: config key "
        "cuda_graphs)",
    )
    p.add_argument(
        "--compile-solver",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the Sinkhorn iterations (default: config key compile_solver)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the generator's arithmetic while training (fp32, tf32, bf16; config key precision)",
    )


def step_options(args: argparse.Namespace, cfg: dict) -> dict:
    """``StepOptions``' fields (config keys) from the command line, else from the config."""
    keys = [f.name for f in fields(StepOptions)]
    return {key: config_lib.cli_or_config(getattr(args, key), cfg, key) for key in keys}


def run_training_cli(
    command: str,
    args: argparse.Namespace,
    cfg: dict,
    train_fn: Callable[..., list[dict]],
    specs: Sequence[dict],
    outs: Sequence[Path],
) -> int:
    """Call ``train_fn(specs, outs, data_dir, **options)`` (``train.run.TrainOptions``) with
    the CLI options over the config ``cfg``; print each privacy record; return the exit code."""
    markers = [Path(d) / STOPPED_NAME for d in outs]
    if args.attempt > 1:  # a workflow retry: repeat a final stop instead of running again
        for marker in markers:
            if marker.is_file():
                note = json.loads(marker.read_text())
                print(f"dpsinkhorn {command}: not retried: {note['message']}", file=sys.stderr)
                return int(note["exit_code"])
    for marker in markers:
        marker.unlink(missing_ok=True)
    try:
        records = train_fn(
            specs,
            outs,
            data_dir=Path(args.data_dir or cfg["data_dir"]),
            device=args.device or cfg["device"],
            stop_after=args.stop_after,
            progress=not args.no_progress,
            **step_options(args, cfg),
            retrain=args.retrain,
            record_store=store_root(cfg),
        )
    except Preempted as stop:
        print(f"dpsinkhorn {command}: {stop}")
        if not stop.interrupted:
            return PREEMPTED_EXIT_CODE  # a scheduler's stop: resubmit and resume
        _final_stop(markers, INTERRUPTED_EXIT_CODE, f"stopped by the user ({stop})")
        return INTERRUPTED_EXIT_CODE
    except (ValueError, FileNotFoundError, KeyError, NoSpaceError) as err:
        if isinstance(err, memory.TooLargeError):  # name the file that set the key
            names = [s["name"] for s in specs]
            where = config_lib.setting_source(args.config, names, err.key)
            err = memory.TooLargeError(err.key, f"{where}: {err}")
        _final_stop(markers, 2, str(err))  # cli.main prints it as one line, exit 2
        raise err
    for record in records:  # a DP run's guarantee beside its ε (none: a public noise seed)
        said = ("experiment", "steps", "epsilon") + ("guarantee",) * ("guarantee" in record)
        print(json.dumps({k: record.get(k) for k in said}))
    return 0


def _final_stop(markers: list[Path], exit_code: int, message: str) -> None:
    """Note in each output folder that this run ended in a way a retry cannot fix."""
    for marker in markers:
        write_text(marker, json.dumps({"exit_code": exit_code, "message": message}) + "\n")


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)  # loaded and validated once per command
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to train")
    train_one = lambda specs, outs, **options: [train(specs[0], outs[0], **options)]  # noqa: E731
    return run_training_cli("train", args, cfg, train_one, [spec], [Path(args.out)])
