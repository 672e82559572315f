"""Sweeps: K independent training runs in one process on one device (``dpsinkhorn train-sweep``).

Each run writes exactly the files, checkpoints and ledger of ``dpsinkhorn train`` and keeps
its own ``Trainer`` and mechanism (``privacy.factory.make_private_stack``: own key, sampler,
sanitiser, accountant). The generators run as one ``torch.func.vmap`` call (padded rows are
never sanitised or released), the losses as one batched solve. Runs may differ in anything
``config.identity.sweep_key`` allows; ``precision`` fp32 or tf32, not bf16.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.identity import SWEEP_SHARED_KEYS, sweep_key
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.privacy.factory import PrivateRun, make_private_stack
from dpsinkhorn.privacy.record_store import RecordStore, store_root
from dpsinkhorn.train.cli import add_training_arguments, run_training_cli
from dpsinkhorn.train.run import default_record_dir, load_train_data
from dpsinkhorn.train.signals import StopSignal
from dpsinkhorn.train.step import TrainingStep
from dpsinkhorn.train.trainer import Trainer, check_batch_size, data_fingerprint
from dpsinkhorn.train.workspace import RunFiles, WorkspaceRemovalError, released_on_error


class SweepTrainer:
    """K ``train.trainer.Trainer`` runs advanced together by the one training step
    (``train.step.TrainingStep``), their mechanisms built as one stack
    (``privacy.factory.make_private_stack``)."""

    def __init__(
        self,
        specs: Sequence[dict],
        train_images,
        train_labels,
        device: torch.device,
        cuda_graphs: bool = False,
        compile_solver: bool = False,
        precision: str = "fp32",
        private_runs: Sequence[PrivateRun] | None = None,
    ):
        """``private_runs``: the members' mechanisms, by default
        ``make_private_stack(specs, ...)`` (the audit passes its own stack)."""
        if not specs:
            raise ValueError("a sweep needs at least one experiment")
        if precision == "bf16":
            raise ValueError(config_lib.SWEEP_BF16_ERROR)
        keys = {sweep_key(spec) for spec in specs}
        if len(keys) > 1:
            differing = [
                k for k in SWEEP_SHARED_KEYS if len({json.dumps(s.get(k)) for s in specs}) > 1
            ]
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
            trainer = Trainer(
                spec,
                train_images,
                train_labels,
                device,
                cuda_graphs,
                compile_solver,
                precision,
                fingerprint,
                # one copy of the real features on the device
                real_features=self.trainers[0].real if self.trainers else None,
                private_run=private_run,
            )
            self.trainers.append(trainer)
        self.stepper = TrainingStep(self.trainers, device, cuda_graphs)

    def step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """One training step of each trainer in ``runs``; returns their losses (device)."""
        return self.stepper(runs)


def train_sweep(
    specs: Sequence[dict],
    out_dirs: Sequence[Path],
    data_dir: Path | None = None,
    device: str = "auto",
    stop_after: int | None = None,
    progress: bool = True,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    precision: str = "fp32",
    retrain: bool = False,
    record_dir: Path | None = None,
    record_store: Path | None = None,
) -> list[dict]:
    """Train ``specs`` together, run k into ``out_dirs[k]``; returns their privacy records.

    Options and behaviour as ``train.run.train``; each run's outputs are written when
    that run finishes.
    """
    if len(specs) != len(out_dirs):
        raise ValueError(f"{len(specs)} experiments but {len(out_dirs)} output folders")
    datasets = {spec["dataset"] for spec in specs}
    if len(datasets) > 1:
        raise ValueError(f"a sweep trains on one dataset, got {sorted(datasets)}")
    images, labels = load_train_data(specs[0], data_dir, train_data)
    sweep = SweepTrainer(
        specs, images, labels, resolve_device(device), cuda_graphs, compile_solver, precision
    )
    runs: list[RunFiles] = []
    store = RecordStore(record_store or store_root())
    with released_on_error(runs):  # one folder refused: give back those already taken
        for t, out in zip(sweep.trainers, out_dirs, strict=True):
            records_at = default_record_dir(out, data_dir, record_dir)
            runs.append(RunFiles(t, out, records_at, retrain, store, images))
    # Workspaces go when the whole sweep is done: until then, a finished member's final
    # checkpoint tells a rerun (after preemption) that it needs no more steps.
    records = {i: run.finish(remove_workspace=False) for i, run in enumerate(runs) if run.done}
    bar = tqdm(
        total=sum(t.total_steps for t in sweep.trainers),
        initial=sum(run.start_step for run in runs),
        desc=f"sweep of {len(runs)}",
        disable=not progress,
        mininterval=1.0,
    )
    taken = 0
    with StopSignal() as stop, released_on_error(runs):
        while len(records) < len(runs):
            active = [i for i in range(len(runs)) if i not in records]
            losses = sweep.step([sweep.trainers[i] for i in active])
            taken += 1
            bar.update(len(active))
            epsilons = []  # the bar shows ε only: nothing computed on the private data
            for i, loss in zip(active, losses, strict=True):
                row = runs[i].after_step(loss)
                if row is not None:
                    epsilons.append(row["epsilon"])
                if runs[i].done:
                    records[i] = runs[i].finish(remove_workspace=False)
            if epsilons:
                bar.set_postfix(runs=len(active), eps_max=f"{max(epsilons):.3g}")
            unfinished = [runs[i] for i in active if i not in records]
            if unfinished and stop.should_stop(taken, stop_after):
                for run in unfinished:
                    run.checkpoint()
                bar.close()
                paths = ", ".join(str(run.ckpt_path) for run in unfinished)
                raise stop.preempted(stop_after, f"checkpoints after {taken} steps in {paths}")
    bar.close()
    # Every member's workspace is tried; one that stays fails the sweep, naming each.
    failures = []
    for run in runs:
        try:
            run.remove_workspace()
        except WorkspaceRemovalError as err:
            failures.append(str(err))
    if failures:
        raise WorkspaceRemovalError("; ".join(failures))
    return [records[i] for i in range(len(runs))]


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
