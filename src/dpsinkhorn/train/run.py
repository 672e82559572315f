"""The training loop: one run from its settings and private data to its release.

:func:`train` trains one experiment into its output folder, step by step
(``train.trainer``), logging and checkpointing through ``train.workspace.RunFiles`` and
stopping with a checkpoint on a signal or ``stop_after`` (``train.signals``); the
finished run publishes ``train.release``'s files. A ``dpmerf`` experiment runs the same
loop with ``train.merf.MerfTrainer`` in place of ``Trainer``. :func:`train_runs` trains several,
one after another (``dpsinkhorn train``, ``train.cli``); K runs advanced together by one
batched step: ``train.sweep``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.fileio import check_samples
from dpsinkhorn.privacy.record_store import RecordStore, store_root
from dpsinkhorn.privacy.trainings import RECORD_DIR
from dpsinkhorn.train.merf import MerfTrainer
from dpsinkhorn.train.signals import StopSignal
from dpsinkhorn.train.trainer import Trainer
from dpsinkhorn.train.workspace import RunFiles, released_on_error


def train(
    spec: dict,
    out_dir: Path,
    data_dir: Path | None = None,
    device: str = "auto",
    stop_after: int | None = None,
    progress: bool = True,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    precision: str = "fp32",
    classes: Sequence[str] | None = None,
    retrain: bool = False,
    record_dir: Path | None = None,
    record_store: Path | None = None,
) -> dict:
    """Train one experiment into ``out_dir``; returns the privacy record.

    Data: ``<data_dir>/<dataset>/train.npz``, or ``train_data`` (images uint8 [N,S,S] or
    [N,S,S,C]; labels int64 [N]) with its declared ``classes`` (None: the catalogue's).
    Writes generator.pt, privacy.json and train_log.csv; checkpoints go to
    ``out_dir/private_workspace/``. ``stop_after``: stop (checkpoint, ``Preempted``)
    after that many new steps. ``cuda_graphs``: ``GraphedStep``; ``compile_solver``:
    ``torch.compile`` the Sinkhorn iterations; ``precision``: ``GeneratorPrecision``.
    The training is appended to the training record in ``record_dir`` (default
    :func:`default_record_dir`; a finished secret-key DP run is retrained only with
    ``retrain``) and, when DP, to the record store ``record_store``.
    """
    images, labels = load_train_data(spec, data_dir, train_data)
    device = resolve_device(device)
    trainer: Trainer | MerfTrainer
    if spec["method"] == "dpmerf":  # one release, then post-processing (train.merf)
        trainer = MerfTrainer(spec, images, labels, device, classes=classes)
    else:
        trainer = Trainer(
            spec, images, labels, device, cuda_graphs, compile_solver, precision, classes=classes
        )
    run = RunFiles(
        trainer,
        out_dir,
        default_record_dir(out_dir, data_dir, record_dir),
        retrain,
        RecordStore(record_store or store_root()),
        images,
    )
    bar = tqdm(
        total=trainer.total_steps,
        initial=run.start_step,
        desc=spec["name"],
        disable=not progress,
        mininterval=1.0,
    )
    with StopSignal() as stop, released_on_error([run]):
        while not run.done:
            loss = trainer.step()
            bar.update(1)
            row = run.after_step(loss)
            if row is not None:  # ε only: nothing computed on the private data
                bar.set_postfix(eps=f"{row['epsilon']:.3g}")
            new_steps = trainer.step_count - run.start_step
            if not run.done and stop.should_stop(new_steps, stop_after):
                run.checkpoint()
                bar.close()
                where = f"checkpoint at step {trainer.step_count} in {run.ckpt_path}"
                raise stop.preempted(stop_after, where)
    bar.close()
    return run.finish()


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
            raise ValueError("give data_dir (prepared datasets) or train_data (arrays)")
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


def train_runs(
    specs: Sequence[dict], out_dirs: Sequence[Path], data_dir: Path | None = None, **options
) -> list[dict]:
    """:func:`train` each of ``specs`` into ``out_dirs[k]``, one after another; returns
    their privacy records (``options``: those of :func:`train`)."""
    if len(specs) != len(out_dirs):
        raise ValueError(f"{len(specs)} experiments but {len(out_dirs)} output folders")
    return [
        train(spec, out, data_dir, **options) for spec, out in zip(specs, out_dirs, strict=True)
    ]
