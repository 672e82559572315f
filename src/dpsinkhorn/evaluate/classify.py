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


def _check_labels(labels: np.ndarray, n: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(f"{where}: labels must be {n} non-negative integers")
    return labels.astype(np.int64)


def resolve_num_classes(dataset: str | None, test_file: str | None = None) -> int | None:
    """The class count of ``dataset``: ``data.catalog.DATASETS[dataset].num_classes`` (an own
    dataset: the ``dataset.json`` beside ``test_file``); None without a dataset (then the
    largest label + 1)."""
    if dataset is None:
        return None
    if dataset not in DATASETS and test_file is not None:
        return prepared_dataset_info(Path(test_file).parent).num_classes
    return dataset_info(dataset).num_classes


def _check_sets(
    x: torch.Tensor,
    x_test: torch.Tensor,
    y: np.ndarray,
    y_test: np.ndarray,
    num_classes: int | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate one training set against the test set; (labels, test labels, num_classes)."""
    if x.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"training images [C,H,W]={list(x.shape[1:])} differ from test images "
            f"{list(x_test.shape[1:])}"
        )
    if len(x) == 0 or len(x_test) == 0:
        raise ValueError("training and test sets must not be empty")
    y = _check_labels(y, len(x), "training set")
    y_test = _check_labels(y_test, len(x_test), "test set")
    largest = int(max(y.max(), y_test.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif num_classes <= largest:
        where = "training" if y.max() >= num_classes else "test"
        raise ValueError(
            f"{where} labels go up to {largest}, outside the {num_classes} classes "
            f"(num_classes={num_classes})"
        )
    return y, y_test, num_classes


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
    validated first. ``seconds``: the wall time split evenly over the seeds.
    """
    if model not in MODELS:
        raise ValueError(f"unknown classifier {model!r}; choose from {', '.join(MODELS)}")
    if len(train_sets) != len(seeds) or not seeds:
        raise ValueError(f"need one seed per training set, got {len(seeds)} and {len(train_sets)}")
    start = time.perf_counter()
    dev = resolve_device(device)
    x_test = to_float(test_images, "test set", dev)
    xs, ys, classes = [], [], num_classes
    for k, (images, labels) in enumerate(train_sets):
        x = to_float(images, "training set" if len(seeds) == 1 else f"training set {k}", dev)
        y, y_test, n = _check_sets(x, x_test, labels, test_labels, num_classes)
        xs.append(x)
        ys.append(torch.from_numpy(y).to(dev))
        classes = max(classes or 0, n)  # one model shape for all seeds
    y_test = torch.from_numpy(y_test).to(dev)
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
