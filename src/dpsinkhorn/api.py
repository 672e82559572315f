"""The Python API for one experiment on your own images: train, sample, save PNGs, release.

    from dpsinkhorn import api
    api.train({"steps": 2000, "sigma": 1.0}, "runs/mine",
              train_data=(images, labels), classes=["cat", "dog"])
    images, labels = api.sample("runs/mine/generator.pt", num=100, seed=0)
    api.save_pngs(images, labels, api.class_names("runs/mine/generator.pt"),
                  out_dir="runs/mine/pngs", grid="runs/mine/grid.png")
    api.release("runs/mine", "publish/mine")  # generator.pt, privacy.json, train_log.csv

``images`` are uint8 [N,S,S] or [N,S,S,C] with S in 28, 32, 64 and C in 1, 3; ``labels``
int64 [N] in 0..len(classes)-1. The class count is the declared ``classes``', never
counted from the labels; with ``conditional: False`` the labels are not read at all.
The run's folder receives what ``dpsinkhorn train`` publishes (generator.pt,
privacy.json, train_log.csv; ``train.release``); :func:`release` copies exactly those,
with their manifest, and refuses what they do not cover. docs/OWN_DATA.md, "The Python API", is
this module's example (``tests/test_api.py`` runs it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn.config import experiment, load_config, make_experiment
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.pngs import save_png_dir, save_png_grid
from dpsinkhorn.evaluate.sample import (
    generator_classes,
    load_generator,
    read_generator_file,
    sample_generator,
)
from dpsinkhorn.train.publish import release as release_run
from dpsinkhorn.train.publish import write_experiment_manifest
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
) -> dict:
    """Train one experiment into ``out_dir``; returns its privacy record (privacy.json).

    ``settings``: experiment keys (``config/schema.json``'s ``training_defaults``; the
    schema fills the rest, i.e. the paper's MNIST setting) or a config file, with
    ``name`` the experiment in it. The data: ``train_data`` = (images, labels) with
    ``classes`` (the class names, required unless ``conditional`` is False), or the
    prepared ``<data_dir>/<dataset>/train.npz`` of the experiment's dataset.
    """
    if isinstance(settings, Mapping):
        settings = dict(settings)
        spec = make_experiment(settings.pop("name", name or "custom"), **settings)
    else:
        if name is None:
            raise ValueError(f"name: give the experiment of config file {settings} to train")
        spec = experiment(load_config(settings), name)
    if train_data is not None and classes is None and spec["conditional"]:
        raise ValueError(
            "classes: declare the class names of train_data (e.g. classes=['cat', 'dog']); "
            "the class count is never counted from the private labels"
        )
    return train_run(
        spec,
        Path(out_dir),
        Path(data_dir) if data_dir is not None else None,
        device=device,
        progress=progress,
        train_data=train_data,
        classes=classes,
    )


def sample(
    generator: PathLike, num: int, seed: int, device: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """``num`` samples of generator.pt: images uint8 [N,S,S] or [N,S,S,C], labels int64 [N]
    (balanced over the classes; -1 for an unconditional generator). Loaded with
    ``torch.load(weights_only=True)``: a generator.pt from elsewhere runs no code."""
    if num < 1:
        raise ValueError(f"num must be positive, got {num}")
    model = load_generator(Path(generator), resolve_device(device))
    return sample_generator(model, num, seed)


def class_names(generator: PathLike) -> tuple[str, ...]:
    """The class names of generator.pt (``("unconditional",)`` for an unconditional one)."""
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
    """Write ``out_dir/<class name>/<i>.png`` and/or a grid PNG ``grid`` (a row of
    ``per_class`` samples per class); returns the files written (atomic writes)."""
    written: list[Path] = []
    if out_dir is not None:
        written += save_png_dir(out_dir, images, labels, class_names)
    if grid is not None:
        save_png_grid(grid, images, labels, len(class_names), per_class)
        written.append(Path(grid))
    return written


def release(run_dir: PathLike, out: PathLike, accept_no_guarantee: bool = False) -> list[Path]:
    """Publish one trained experiment: write its manifest (``release_manifest.json``: the
    files its ledger covers, with their sha256) and copy exactly those into ``out`` (new or
    empty), as ``dpsinkhorn release`` does for a workflow run. Refuses (one-line error) a
    folder with a private workspace left, a missing or changed file, a non-private run, and
    a ledger whose guarantee is ``none…`` (public noise seed) unless ``accept_no_guarantee``.
    Samples and PNGs you drew are post-processing of the generator: publish them yourself.
    """
    write_experiment_manifest(run_dir)
    return release_run(run_dir, out, accept_no_guarantee)
