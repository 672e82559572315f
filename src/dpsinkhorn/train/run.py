"""The training loop: runs from their settings and private data to their release.

:func:`train` trains one experiment (``train.trainer``, or ``train.merf`` for DP-MERF) by
:func:`run_loop`, the loop of one run or of K runs stepped together (``train.sweep``):
files through ``train.workspace.RunFiles``, stops with a checkpoint (``train.signals``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.fileio import check_samples
from dpsinkhorn.privacy.record_store import RecordStore, store_root
from dpsinkhorn.privacy.trainings import RECORD_DIR
from dpsinkhorn.train.merf import MerfTrainer
from dpsinkhorn.train.signals import StopSignal
from dpsinkhorn.train.trainer import GeneratorRun, StepOptions, Trainer
from dpsinkhorn.train.workspace import RunFiles, WorkspaceRemovalError, released_on_error


@dataclass(frozen=True)
class TrainOptions(StepOptions):
    """How runs train, beside their settings and data (``train``, ``train_sweep``)."""

    device: str = "auto"  # auto, cpu, cuda, cuda:N
    stop_after: int | None = None  # checkpoint and raise Preempted after this many steps
    progress: bool = True  # a progress bar (ε only)
    retrain: bool = False  # train again where a secret-key DP training finished
    record_dir: Path | None = None  # the training record (default: default_record_dir)
    record_store: Path | None = None  # of DP runs (default: record_store.store_root())


def train(
    spec: dict,
    out_dir: Path,
    data_dir: Path | None = None,
    *,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    classes: Sequence[str] | None = None,
    **options,
) -> dict:
    """Train one experiment into ``out_dir`` (``options``: :class:`TrainOptions`' fields);
    returns the privacy record. Data: ``<data_dir>/<dataset>/train.npz``, or ``train_data``
    (images uint8 [N,S,S] or [N,S,S,C]; labels int64 [N]) with its declared ``classes``
    (None: the catalogue's)."""
    opts = TrainOptions(**options)
    images, labels = load_train_data(spec, data_dir, train_data)
    device = resolve_device(opts.device)
    if spec["method"] == "dpmerf":  # one release, then post-processing (train.merf)
        trainer: GeneratorRun = MerfTrainer(spec, images, labels, device, classes=classes)
    else:
        trainer = Trainer(spec, images, labels, device, opts, classes=classes)
    one_step = lambda runs: [run.step() for run in runs]  # noqa: E731
    return run_loop([trainer], [out_dir], one_step, images, data_dir, opts, spec["name"])[0]


def run_loop(
    trainers: Sequence[GeneratorRun],
    out_dirs: Sequence[Path],
    step: Callable[[list], list[torch.Tensor]],
    images: np.ndarray,
    data_dir: Path | None,
    opts: TrainOptions,
    desc: str,
) -> list[dict]:
    """Train ``trainers[k]`` into ``out_dirs[k]`` until each is done; returns their privacy
    records. ``step(active)``: one step of each active trainer, their losses (device).
    With K > 1, workspaces go when all are done: until then a finished member's final
    checkpoint tells a rerun (after preemption) that it needs no more steps."""
    runs: list[RunFiles] = []
    store = RecordStore(opts.record_store or store_root())
    with released_on_error(runs):  # one folder refused: give back those already taken
        for t, out in zip(trainers, out_dirs, strict=True):
            records_at = default_record_dir(out, data_dir, opts.record_dir)
            runs.append(RunFiles(t, out, records_at, opts.retrain, store, images))
    at_once = len(runs) == 1
    records = {i: run.finish(remove_workspace=at_once) for i, run in enumerate(runs) if run.done}
    bar = tqdm(
        total=sum(t.total_steps for t in trainers),
        initial=sum(run.start_step for run in runs),
        desc=desc,
        disable=not opts.progress,
        mininterval=1.0,
    )
    taken = 0
    with StopSignal() as stop, released_on_error(runs):
        while len(records) < len(runs):
            active = [i for i in range(len(runs)) if i not in records]
            losses = step([trainers[i] for i in active])
            taken += 1
            bar.update(len(active))
            epsilons = []  # the bar shows ε only: nothing computed on the private data
            for i, loss in zip(active, losses, strict=True):
                row = runs[i].after_step(loss)
                if row is not None:
                    epsilons.append(row["epsilon"])
                if runs[i].done:
                    records[i] = runs[i].finish(remove_workspace=at_once)
            if epsilons:
                bar.set_postfix(eps=f"{max(epsilons):.3g}")
            unfinished = [runs[i] for i in active if i not in records]
            if unfinished and stop.should_stop(taken, opts.stop_after):
                for run in unfinished:
                    run.checkpoint()
                bar.close()
                where = "; ".join(
                    f"checkpoint at step {run.trainer.step_count} in {run.ckpt_path}"
                    for run in unfinished
                )
                raise stop.preempted(opts.stop_after, where)
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


def default_record_dir(
    out_dir: Path, data_dir: Path | None, record_dir: Path | None = None
) -> Path:
    """Where the training record goes: ``record_dir`` if given, else
    ``<data_dir>/trainings`` (beside the prepared data), else ``<out_dir>/../trainings``."""
    if record_dir is not None:
        return Path(record_dir)
    base = Path(data_dir) if data_dir is not None else Path(out_dir).resolve().parent
    return base / RECORD_DIR


def load_train_data(
    spec: dict, data_dir: Path | None, train_data: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The experiment's private training split (prepared npz or given arrays), checked."""
    if train_data is None:
        if data_dir is None:
            raise ValueError("data_dir: give data_dir (prepared data) or train_data (arrays)")
        train_data = data.load_split(
            Path(data_dir),
            spec["dataset"],
            "train",
            spec.get("dataset_definition"),
            spec.get("prepared_folder"),
        )
    images, labels = train_data
    check_samples(np.asarray(images), np.asarray(labels), "train_data")
    shape = np.shape(images)
    if shape[1] != shape[2]:  # refused before the training record counts a training
        raise ValueError(
            f"train_data: images must be square, [N,S,S] or [N,S,S,C] (S = 28, 32 or 64), "
            f"got {tuple(shape)}"
        )
    return images, labels
