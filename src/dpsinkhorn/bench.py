"""Throughput of the training step: ``dpsinkhorn bench --config ... --experiment ...``.

Builds the real trainer (same data, model, loss, privacy hook), runs warm-up
steps, then times ``--steps`` steps with the device synchronised at both ends.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn import data
from dpsinkhorn.train import Trainer, resolve_device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def benchmark(spec: dict, data_dir: Path, device: str, steps: int, warmup: int) -> dict:
    """Steps per second of ``Trainer.step`` after ``warmup`` untimed steps."""
    images, labels = data.load_split(Path(data_dir), spec["dataset"], "train")
    trainer = Trainer(spec, images, labels, resolve_device(device))
    for _ in range(warmup):
        trainer.step()
    _sync(trainer.device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    _sync(trainer.device)
    seconds = time.perf_counter() - start
    return {
        "experiment": spec["name"],
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "device": str(trainer.device)
        + (
            f" ({torch.cuda.get_device_name(trainer.device)})"
            if trainer.device.type == "cuda"
            else ""
        ),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="time the training step (steps/s)")
    p.add_argument("--config", nargs="+", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", help="override the config's device")
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)
    spec = config_lib.experiment(cfg, args.experiment)
    print(
        json.dumps(
            benchmark(spec, cfg["data_dir"], args.device or cfg["device"], args.steps, args.warmup)
        )
    )
    return 0
