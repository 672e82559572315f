"""Sweeps: K independent training runs in one process on one device (``dpsinkhorn train-sweep``).

Each run writes exactly what ``dpsinkhorn train`` writes and keeps its own ``Trainer`` and
mechanism (own key, sampler, sanitiser, accountant); one step advances all
(``train.step``). Runs may differ in what ``config.identity.sweep_key`` allows; not bf16.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.identity import SWEEP_SHARED_KEYS, sweep_key
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.privacy.factory import PrivateRun, make_private_stack
from dpsinkhorn.train.cli import add_training_arguments, run_training_cli
from dpsinkhorn.train.run import TrainOptions, load_train_data, run_loop
from dpsinkhorn.train.step import TrainingStep
from dpsinkhorn.train.trainer import (
    StepOptions,
    Trainer,
    check_batch_size,
    data_fingerprint,
)


class SweepTrainer:
    """K ``train.trainer.Trainer`` runs advanced together by the one training step
    (``train.step.TrainingStep``), their mechanisms ``private_runs`` built as one stack
    (by default ``privacy.factory.make_private_stack``; the audit passes its own)."""

    def __init__(
        self,
        specs: Sequence[dict],
        train_images,
        train_labels,
        device: torch.device,
        options: StepOptions | None = None,
        private_runs: Sequence[PrivateRun] | None = None,
    ):
        if not specs:
            raise ValueError("a sweep needs at least one experiment")
        options = options or StepOptions()
        if options.precision == "bf16":
            raise ValueError(config_lib.SWEEP_BF16_ERROR)
        keys = [sweep_key(spec) for spec in specs]
        differing = [k for i, k in enumerate(SWEEP_SHARED_KEYS) if len({v[i] for v in keys}) > 1]
        if differing:
            raise ValueError(
                f"experiments {[s['name'] for s in specs]} cannot share a sweep: "
                f"they differ in {differing}"
            )
        # Each run keys its own generator (a fresh secret, or in reproducible mode one
        # from its seed and name): no two members share noise or Poisson draws.
        check_batch_size(specs[0], len(train_labels))
        if private_runs is None:
            private_runs = make_private_stack(specs, len(train_labels), device)
        fingerprint = data_fingerprint(train_images, train_labels)  # hashed once
        self.trainers: list[Trainer] = []
        for spec, private_run in zip(specs, private_runs, strict=True):
            real = self.trainers[0].real if self.trainers else None  # one copy on the device
            shared = {"fingerprint": fingerprint, "real_features": real, "private_run": private_run}
            run = Trainer(spec, train_images, train_labels, device, options, **shared)
            self.trainers.append(run)
        self.stepper = TrainingStep(self.trainers, device, options.cuda_graphs)

    def step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """One training step of each trainer in ``runs``; returns their losses (device)."""
        return self.stepper(runs)


def train_sweep(
    specs: Sequence[dict],
    out_dirs: Sequence[Path],
    data_dir: Path | None = None,
    *,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    **options,
) -> list[dict]:
    """Train ``specs`` together, run k into ``out_dirs[k]``; returns their privacy records.

    Data and ``options`` (:class:`train.run.TrainOptions`' fields) as ``train.run.train``'s;
    each run's outputs are written when that run finishes.
    """
    opts = TrainOptions(**options)
    if len(specs) != len(out_dirs):
        raise ValueError(f"{len(specs)} experiments but {len(out_dirs)} output folders")
    images, labels = load_train_data(specs[0], data_dir, train_data)
    device = resolve_device(opts.device)
    sweep = SweepTrainer(specs, images, labels, device, opts)
    desc = f"sweep of {len(specs)}"
    return run_loop(sweep.trainers, out_dirs, sweep.step, images, data_dir, opts, desc)


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-sweep", help="train several experiments together in one process (one device)"
    )
    p.add_argument("--experiments", nargs="+", required=True)
    p.add_argument(
        "--out-root", required=True, help="run folder: <out-root>/[nonprivate/]<experiment>/"
    )
    add_training_arguments(p)
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)  # loaded and validated once per command
    specs = [config_lib.trained_experiment(cfg, e, "nothing to train") for e in args.experiments]
    outs = [config_lib.experiment_dir(cfg, args.out_root, spec["name"]) for spec in specs]
    return run_training_cli("train-sweep", args, cfg, train_sweep, specs, outs)
