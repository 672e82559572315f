"""The Python API for one experiment on your own images: train, sample, save PNGs, release.

    from dpsinkhorn import api
    api.train({"steps": 2000, "sigma": 1.0}, "runs/mine",
              train_data=(images, labels), classes=["cat", "dog"])
    images, labels = api.sample("runs/mine/generator.pt", num=100, seed=0)
    api.save_pngs(images, labels, api.class_names("runs/mine/generator.pt"),
                  out_dir="runs/mine/pngs", grid="runs/mine/grid.png")
    api.release("runs/mine", "publish/mine")  # generator.pt, privacy.json, train_log.csv

``images`` are uint8 [N,S,S] or [N,S,S,C] (S in 28, 32, 64; C in 1, 3), ``labels`` int64
[N] in 0..len(classes)-1. The run's folder receives what ``dpsinkhorn train`` publishes;
:func:`release` copies exactly those files. docs/OWN_DATA.md, "The Python API".
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
        settings: experiment keys (``config/schema.json``'s ``training_defaults``, e.g.
            ``steps``, ``sigma`` or ``target_epsilon`` with ``sigma: None``, ``batch_size``,
            ``delta``, ``conditional``; the schema fills the rest with the paper's MNIST
            setting), or a config file with ``name`` the experiment in it.
        out_dir: the run's folder (created; one writer at a time).
        train_data: (images, labels): images uint8 [N,S,S] (grayscale) or [N,S,S,3] (RGB),
            S = 28, 32 or 64 px, values 0..255; labels integer [N] in 0..len(classes)-1
            (never read when ``conditional`` is False). Without it, the prepared
            ``<data_dir>/<dataset>/train.npz`` of the experiment's dataset is read.
        classes: the class names (public; their count is the generator's, never counted
            from the labels); required with ``train_data`` unless ``conditional`` is False.
        device: ``auto`` (a free local GPU, else CPU), ``cpu``, ``cuda``, ``cuda:1``, ...
        progress: show a progress bar (steps/s and ε spent only).
        dataset: the name generator.pt and privacy.json give ``train_data`` (never a
            built-in's, e.g. "mnist", which names only its prepared data).
        retrain: train again into a folder whose secret-key DP training finished (refused
            otherwise); the training record counts it.
        record_dir: where the data's training record (``privacy.trainings``) is appended:
            default ``<data_dir>/trainings``, else ``<out_dir>/../trainings``.
        record_store: the per-user record store (``privacy.record_store``), where a DP
            training keeps a keyed fingerprint of each image: default the config file's
            ``record_store``, else ``$DPSINKHORN_RECORD_STORE``, else the XDG data folder.

    Writes ``out_dir/generator.pt``, ``privacy.json`` and ``train_log.csv``: the release,
    (ε, δ_total)-DP under add/remove-one adjacency with a secret noise key (the ledger's
    ``guarantee``). Checkpoints and anything else computed from the data stay in
    ``out_dir/private_workspace/``, deleted when training completes. Every training,
    finished or not, is appended to its data's training record, which
    ``privacy_summary.json`` composes.

    Returns:
        privacy.json as a dict: ``epsilon`` (sound ε), ``delta``, ``delta_total``,
        ``sigma``, ``noise_multiplier``, ``steps``, ``guarantee``, ...

    Raises:
        ValueError: a bad key or value (names it), ``classes`` missing, a label outside
            them, a built-in dataset's name for ``dataset``, a finished DP run without
            ``retrain``, images of another shape or dtype, too few records for
            ``batch_size``, a folder another process holds (``train.runlock.LockedError``),
            a ``batch_size`` that cannot fit in the device's memory
            (``train.memory.TooLargeError``).
        FileNotFoundError: no ``train_data`` and no prepared data under ``data_dir``.
        fileio.NoSpaceError: the disk filled up (nothing half-written is left).
        train.signals.Preempted: SIGTERM/SIGUSR1/SIGINT stopped training after a
            checkpoint; calling again with the same arguments resumes.
    """
    config: Mapping | None = None
    if isinstance(settings, Mapping):
        settings = dict(settings)
        spec = make_experiment(settings.pop("name", name or "custom"), **settings)
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
    elif data_dir is None:
        raise ValueError("data_dir: give data_dir (prepared data) or train_data (arrays)")
    # None: train.run takes $DPSINKHORN_RECORD_STORE, else the XDG default
    store = record_store if record_store is not None else (config or {}).get("record_store")
    return train_run(
        spec,
        Path(out_dir),
        Path(data_dir) if data_dir is not None else None,
        device=device,
        progress=progress,
        train_data=train_data,
        classes=classes,
        retrain=retrain,
        record_dir=Path(record_dir) if record_dir is not None else None,
        record_store=None if store is None else Path(store),
    )


def sample(
    generator: PathLike, num: int, seed: int, device: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``num`` samples of a trained generator.

    Args:
        generator: path of generator.pt (loaded with ``torch.load(weights_only=True)``: a
            file from elsewhere runs no code).
        num: how many samples (≥ 1).
        seed: seed of the latent codes and labels (the same seed gives the same samples).
        device: as in :func:`train`.

    Returns:
        (images, labels): images uint8 [num,S,S] (grayscale) or [num,S,S,C], values 0..255;
        labels int64 [num], balanced over the classes (-1 for an unconditional generator).
        Samples are post-processing of the released generator: covered by its ledger.

    Raises:
        ValueError: ``num`` < 1, or a generator.pt whose pickle would run anything but
            tensors and plain values (names the file).
        FileNotFoundError: no such file.
    """
    if num < 1:
        raise ValueError(f"num must be positive, got {num}")
    model = load_generator(Path(generator), resolve_device(device))
    return sample_generator(model, num, seed)


def class_names(generator: PathLike) -> tuple[str, ...]:
    """The class names recorded in generator.pt, in label order: the declared ``classes``,
    the dataset's for MNIST-like datasets, ``("unconditional",)`` for an unconditional
    generator. Raises ``FileNotFoundError`` / ``ValueError`` as :func:`sample`."""
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
    """Write samples as PNG files; return the paths written (atomic writes).

    Args:
        images, labels: as :func:`sample` returns them ([N,S,S] or [N,S,S,C] uint8; [N]).
        class_names: names by label (:func:`class_names`); folder names under ``out_dir``.
        out_dir: if given, one PNG per sample, ``out_dir/<class name>/<i>.png``
            (``unconditional/`` for label -1).
        grid: if given, one PNG with a row of ``per_class`` samples per class (2 px gaps).
        per_class: samples per row of the grid.

    Raises:
        ValueError: a label outside ``class_names``, or ``per_class`` < 1.
    """
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

    Proves each file from the ledger ``run_dir/privacy.json`` (``dpsinkhorn.publish``):
    generator.pt and train_log.csv hash to its ``content_sha256`` and
    ``train_log_sha256``, and the ledger is the one its training wrote, by the training
    record in ``record_dir`` (where :func:`train` appended it; default
    ``<run_dir>/../trainings``, as :func:`train` without ``data_dir`` or ``record_dir``);
    then writes exactly those bytes, the ledger and ``release_manifest.json`` (the report
    of that decision) into ``out`` (new or empty).
    Samples and PNGs you drew are post-processing of the generator: publish them yourself.
    Returns the paths written under ``out``.

    Raises:
        ValueError: (one line naming the file) a private workspace left in ``run_dir``, a
            file whose bytes are not those training recorded in privacy.json
            (``content_sha256``, ``train_log_sha256``), a non-private run, ``out`` not
            empty, or a ledger whose ``guarantee`` is ``none…`` (public noise seed) unless
            ``accept_no_guarantee``, or a ledger no finished training in the record wrote.
            Nothing is written then.
        FileNotFoundError: ``run_dir`` lacks its ledger or a file it covers, or
            ``record_dir`` holds no training record.
    """
    flag = "accept_no_guarantee=True"
    records = default_record_dir(Path(run_dir), None, record_dir)
    if not list(records.glob("*.jsonl")):
        raise FileNotFoundError(
            f"{records}: no training record there; pass record_dir= where api.train kept it "
            "(its record_dir, or <data_dir>/trainings)"
        )
    folders = experiment_folder(records)
    return release_run(run_dir, out, folders, None, accept_no_guarantee, flag=flag)
