"""The Python API for one experiment on your own images: :func:`train`, :func:`sample`,
:func:`save_pngs`, :func:`release`. The run's folder receives what ``dpsinkhorn train``
publishes; :func:`release` copies exactly those files. An example: docs/OWN_DATA.md,
"The Python API".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn.config import experiment, load_config, make_experiment
from dpsinkhorn.data.catalog import DATASETS
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.pngs import save_png_dir, save_png_grid
from dpsinkhorn.evaluate.sample import (
    generator_classes,
    load_generator,
    read_generator_file,
    sample_generator,
)
from dpsinkhorn.publish import experiment_folder
from dpsinkhorn.publish import release as release_run
from dpsinkhorn.train.run import default_record_dir
from dpsinkhorn.train.run import train as train_run

PathLike = str | os.PathLike


def train(
    settings: Mapping | PathLike,
    out_dir: PathLike,
    *,
    name: str | None = None,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    data_dir: PathLike | None = None,
    classes: Sequence[str] | None = None,
    device: str = "auto",
    progress: bool = False,
    dataset: str = "arrays",
    retrain: bool = False,
    record_dir: PathLike | None = None,
    record_store: PathLike | None = None,
) -> dict:
    """Train one experiment with DP-Sinkhorn into ``out_dir``; return its privacy record.

    Args:
        settings: experiment keys (``config/schema.json``'s ``training_defaults``; the
            rest are the paper's MNIST setting), or a config file holding experiment ``name``.
        out_dir: the run's folder (created; one writer at a time).
        train_data: (images uint8 [N,S,S] or [N,S,S,3], S in 28, 32, 64; labels int [N] in
            0..len(classes)-1). Default: ``<data_dir>/<dataset>/train.npz``.
        classes: the public class names (their count is the generator's); required with
            ``train_data`` unless ``conditional`` is False.
        device: ``auto`` (a free local GPU, else CPU), ``cpu``, ``cuda``, ``cuda:1``, ...
        progress: show a progress bar (steps/s and ε spent only).
        dataset: the name the outputs give ``train_data`` (not a built-in dataset's).
        retrain: train again into a folder whose secret-key DP training finished.
        record_dir: the data's training record (``privacy.trainings``); default
            ``<data_dir>/trainings``, else ``<out_dir>/../trainings``.
        record_store: the per-user record store (``privacy.record_store``); default the
            config's ``record_store``, else ``$DPSINKHORN_RECORD_STORE``, else XDG data.

    Writes ``generator.pt``, ``privacy.json`` and ``train_log.csv`` into ``out_dir``:
    (ε, δ_total)-DP under add/remove-one adjacency with a secret noise key. Anything else
    computed from the data stays in ``out_dir/private_workspace/`` until training ends.
    Returns privacy.json as a dict (``epsilon``, ``delta_total``, ``guarantee``, ...).
    Raises ValueError (a bad key or value, a bad ``device``, missing ``classes``, a
    finished DP run without ``retrain``, a held folder, a batch too large for the device),
    FileNotFoundError (no data), ``train.signals.Preempted`` (a signal stopped training;
    calling again resumes).
    """
    config: Mapping | None = None
    if isinstance(settings, Mapping):  # its own "name" wins
        spec = make_experiment(**{"name": name or "custom", **settings})
    else:
        if name is None:
            raise ValueError(f"name: give the experiment of config file {settings} to train")
        config = load_config(settings)
        spec = experiment(config, name)
    if train_data is not None and classes is None and spec["conditional"]:
        raise ValueError(
            "classes: declare the class names of train_data (e.g. classes=['cat', 'dog']); "
            "the class count is never counted from the private labels"
        )
    if train_data is not None:  # the arrays' own name, never the schema's default "mnist"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(dataset)) or dataset in DATASETS:
            raise ValueError(
                f"dataset: {dataset!r} cannot name train_data (letters, digits, _ . -; not a "
                f"built-in dataset's name: {', '.join(DATASETS)})"
            )
        spec = {**spec, "dataset": dataset}
    # None: train.run takes $DPSINKHORN_RECORD_STORE, else the XDG default
    store = record_store if record_store is not None else (config or {}).get("record_store")
    return train_run(
        spec,
        Path(out_dir),
        Path(data_dir) if data_dir is not None else None,
        train_data=train_data,
        classes=classes,
        device=device,
        progress=progress,
        retrain=retrain,
        record_dir=Path(record_dir) if record_dir is not None else None,
        record_store=None if store is None else Path(store),
    )


def sample(
    generator: PathLike, num: int, seed: int, device: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``num`` ≥ 1 samples of generator.pt (``torch.load(weights_only=True)``), latent
    codes and labels from ``seed``, on ``device`` (as in :func:`train`).

    Returns (images uint8 [num,S,S] or [num,S,S,C]; labels int64 [num], balanced over
    the classes, -1 when unconditional).
    """
    if num < 1:
        raise ValueError(f"num must be positive, got {num}")
    model = load_generator(Path(generator), resolve_device(device))
    return sample_generator(model, num, seed)


def class_names(generator: PathLike) -> tuple[str, ...]:
    """The class names recorded in generator.pt, in label order (``("unconditional",)``
    for an unconditional generator)."""
    return generator_classes(read_generator_file(Path(generator)))[1]


def save_pngs(
    images: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    *,
    out_dir: PathLike | None = None,
    grid: PathLike | None = None,
    per_class: int = 10,
) -> list[Path]:
    """Write samples (``images, labels`` as :func:`sample` returns them, ``class_names`` by
    label) as PNG files: with ``out_dir``, one per sample, ``out_dir/<class name>/<i>.png``;
    with ``grid``, one with a row of ``per_class`` samples per class. Returns the paths
    written (atomic writes)."""
    written: list[Path] = []
    if out_dir is not None:
        written += save_png_dir(out_dir, images, labels, class_names)
    if grid is not None:
        save_png_grid(grid, images, labels, len(class_names), per_class)
        written.append(Path(grid))
    return written


def release(
    run_dir: PathLike,
    out: PathLike,
    accept_no_guarantee: bool = False,
    record_dir: PathLike | None = None,
) -> list[Path]:
    """Publish one trained experiment through the same door as ``dpsinkhorn release``.

    Checks generator.pt and train_log.csv against the hashes in ``run_dir/privacy.json``
    and that ledger against the training record in ``record_dir`` (default
    ``<run_dir>/../trainings``), then writes those bytes, the ledger and
    ``release_manifest.json`` into ``out`` (new or empty); returns the paths written.
    Raises ValueError (one line naming the file: a check failed, ``out`` not empty, or a
    ``none…`` guarantee without ``accept_no_guarantee``; nothing is written then) or
    FileNotFoundError (a missing ledger, covered file or training record).
    """
    records = default_record_dir(Path(run_dir), None, record_dir)
    if not list(records.glob("*.jsonl")):
        raise FileNotFoundError(
            f"{records}: no training record there; pass record_dir= where api.train kept it "
            "(its record_dir, or <data_dir>/trainings)"
        )
    folders = experiment_folder(records)
    flag = "accept_no_guarantee=True"
    return release_run(run_dir, out, folders, None, accept_no_guarantee, flag=flag)
