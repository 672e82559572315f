"""Downstream utility (paper appendix D.2): the classifiers of each seed's samples, all
seeds together (:mod:`dpsinkhorn.evaluate.classifiers`), tested on the real test set; a
label outside the dataset's classes is refused."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.data.catalog import DATASETS, dataset_info
from dpsinkhorn.data.owndata import prepared_dataset_info
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.classifiers import MODELS, train_batched, train_logreg
from dpsinkhorn.evaluate.sample import channels_last

#: Every key an accuracy score file holds (``evaluate.classifiers``' results and what
#: :func:`write_results` adds; ``fast_loop``: the loop's options in committed results sets);
#: ``dpsinkhorn release`` publishes no score file holding another.
RECORD_KEYS = frozenset(
    "accuracy model seed holdout_accuracy epochs best_epoch num_holdout max_epochs "
    "patience batch_size iterations converged max_iter num_train num_test num_classes "
    "device seconds train test train_sha256 test_sha256 dataset batched_seeds solver "
    "fast_loop training_loop".split()
)


def to_float(
    images: np.ndarray | torch.Tensor, where: str = "images", device: torch.device | None = None
) -> torch.Tensor:
    """uint8 [N,H,W] or [N,H,W,C] (host or device) -> float32 [N,C,H,W] in [0,1] on
    ``device`` (default: where the images are)."""
    x = channels_last(images, where)
    x = x if torch.is_tensor(x) else torch.from_numpy(np.ascontiguousarray(x))
    return x.to(device).permute(0, 3, 1, 2).contiguous().float() / 255.0


def resolve_num_classes(dataset: str | None, test_file: str | None = None) -> int | None:
    """The class count of ``dataset``: ``data.catalog.DATASETS[dataset].num_classes`` (an own
    dataset: the ``dataset.json`` beside ``test_file``); None without a dataset (then the
    largest label + 1)."""
    if dataset is None:
        return None
    if dataset not in DATASETS and test_file is not None:
        return prepared_dataset_info(Path(test_file).parent).num_classes
    return dataset_info(dataset).num_classes


def check_sets(
    train_sets: list[tuple[np.ndarray | torch.Tensor, np.ndarray]],
    test_images: np.ndarray | torch.Tensor,
    test_labels: np.ndarray,
    num_classes: int | None,
    test: str = "test set",
) -> int:
    """Refuse training images [H,W,C] of another shape than the test images', an empty set
    and a label that is negative or outside ``num_classes``; returns the class count (for
    ``num_classes`` None the largest label + 1)."""
    test_shape = list(channels_last(test_images, test).shape[1:])
    sets = [(test, test_images, test_labels)]
    for k, (images, labels) in enumerate(train_sets):
        where = "training set" if len(train_sets) == 1 else f"training set {k}"
        shape = list(channels_last(images, where).shape[1:])
        if shape != test_shape:
            raise ValueError(
                f"{where}: images [H,W,C]={shape} differ from the test images' {test_shape}"
            )
        sets.append((where, images, labels))
    largest = -1
    for where, images, labels in sets:
        labels, n = np.asarray(labels), len(images)
        if n == 0:
            raise ValueError(f"{where}: the set must not be empty")
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
            raise ValueError(f"{where}: labels must be {n} non-negative integers")
        largest = max(largest, int(labels.max()))
    if num_classes is not None and largest >= num_classes:
        raise ValueError(
            f"labels go up to {largest}, outside the {num_classes} classes "
            f"(num_classes={num_classes}; {test} and training sets)"
        )
    return largest + 1 if num_classes is None else num_classes


def train_and_evaluate_seeds(
    model: str,
    train_sets: list[tuple[np.ndarray, np.ndarray]],
    test_images: np.ndarray,
    test_labels: np.ndarray,
    seeds: list[int],
    *,
    num_classes: int | None = None,
    device: str = "auto",
    max_epochs: int = 1000,
    patience: int = 30,
    batch_size: int = 128,
    max_iter: int = 5000,
) -> list[dict]:
    """Train ``model`` once per (training set, seed) pair, all seeds together on ``device``
    (:func:`classifiers.train_batched`, Log-Reg :func:`classifiers.train_logreg`); one
    result each, with the test accuracy.

    ``train_sets``: (images uint8 [N,H,W(,C)], labels int [N]) per seed, all of one N,
    validated first (:func:`check_sets`). ``seconds``: the wall time split evenly over the seeds.
    """
    if model not in MODELS:
        raise ValueError(f"unknown classifier {model!r}; choose from {', '.join(MODELS)}")
    if len(train_sets) != len(seeds) or not seeds:
        raise ValueError(f"need one seed per training set, got {len(seeds)} and {len(train_sets)}")
    start = time.perf_counter()
    dev = resolve_device(device)
    classes = check_sets(train_sets, test_images, test_labels, num_classes)
    x_test = to_float(test_images, "test set", dev)
    y_test = torch.as_tensor(np.asarray(test_labels, np.int64), device=dev)
    xs = [to_float(images, "training set", dev) for images, _ in train_sets]
    ys = [torch.as_tensor(np.asarray(labels, np.int64), device=dev) for _, labels in train_sets]
    if model == "logreg":
        trained = train_logreg(xs, ys, x_test, y_test, classes, max_iter)
    else:
        trained = train_batched(
            model, xs, ys, x_test, y_test, classes, seeds, max_epochs, patience, batch_size
        )
    seconds = (time.perf_counter() - start) / len(seeds)
    sizes = {"num_test": len(x_test), "num_classes": classes, "device": str(dev)}
    return [  # accuracy first, then the model, seed, training details, sizes, device, seconds
        {"accuracy": r.pop("accuracy"), "model": model, "seed": seed, **r, "num_train": len(x)}
        | sizes
        | {"seconds": seconds}
        for seed, r, x in zip(seeds, trained, xs, strict=True)
    ]


def write_results(
    results: list[dict], train_files: list, test: str | Path, dataset: str | None, outs: list
) -> None:
    """Each seed's result file (``acc_<model>_seed<k>.json``) with the files it was trained
    and tested on, by path and content (``dpsinkhorn release`` binds a score to its
    inputs), and the dataset."""
    test_sha256 = fileio.sha256_of(test)
    for result, train, out in zip(results, train_files, outs, strict=True):
        result.update(train=str(train), test=str(test))
        result.update(train_sha256=fileio.sha256_of(train), test_sha256=test_sha256)
        if dataset is not None:
            result["dataset"] = dataset
        fileio.write_json(out, result)
        print(
            f"{result['model']} accuracy {result['accuracy']:.4f} (seed {result['seed']}) -> {out}"
        )
