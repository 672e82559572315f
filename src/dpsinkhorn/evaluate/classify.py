"""Downstream utility: classifiers trained on synthetic samples, tested on real data.

Paper appendix D.2; the models and their training are in
:mod:`dpsinkhorn.evaluate.classifiers`. Images are uint8 [N,H,W] (grayscale) or
[N,H,W,C] with C in (1, 3), scaled to [0,1] here.

Several seeds (each with its own training file) are trained by one call
(:func:`train_and_evaluate_seeds`, ``dpsinkhorn classify --train A B --seed 0 1 --out
a.json b.json``): the test set is moved to the device once, each training set once,
and no DataLoader is involved (batches are index slices of device tensors). Each seed
gives exactly the result it gives alone. The class count comes from the dataset
definition (``--dataset``, ``data.catalog.DATASETS[name].num_classes``) or
``--num-classes``; a label outside it is refused.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.data.catalog import DATASETS, dataset_info
from dpsinkhorn.data.owndata import prepared_dataset_info
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.classifiers import (
    MODELS,
    train_logreg,
    train_logreg_torch,
    train_torch,
    train_torch_batched,
)
from dpsinkhorn.evaluate.fastfit import train_torch_batched_fast

#: Every key an accuracy score file holds (``evaluate.classifiers``' results, the fast loop's
#: ``fast_loop``, and what :func:`write_results` adds); ``dpsinkhorn release`` publishes no
#: score file holding another.
RECORD_KEYS = frozenset(
    {
        "accuracy",
        "model",
        "seed",
        "holdout_accuracy",
        "epochs",
        "best_epoch",
        "num_holdout",
        "max_epochs",
        "patience",
        "batch_size",
        "iterations",
        "converged",
        "max_iter",
        "num_train",
        "num_test",
        "num_classes",
        "device",
        "seconds",
        "train",
        "test",
        "train_sha256",
        "test_sha256",
        "dataset",
        "batched_seeds",
        "solver",
        "fast_loop",
    }
)


def to_float(images: np.ndarray, where: str = "images") -> np.ndarray:
    """uint8 [N,H,W] or [N,H,W,C] -> float32 [N,C,H,W] in [0,1]."""
    images = fileio.channels_last(images, where)
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0


def _check_labels(labels: np.ndarray, n: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(f"{where}: labels must be {n} non-negative integers")
    return labels.astype(np.int64)


def resolve_num_classes(
    num_classes: int | None, dataset: str | None, test_file: str | None = None
) -> int | None:
    """The class count: ``data.catalog.DATASETS[dataset].num_classes`` (an own dataset: the
    ``dataset.json`` beside ``test_file``), or ``num_classes`` (both must agree when both
    are given), or None (then the largest label + 1)."""
    if dataset is None:
        return num_classes
    if dataset not in DATASETS and test_file is not None:
        defined = prepared_dataset_info(Path(test_file).parent).num_classes
    else:
        defined = dataset_info(dataset).num_classes
    if num_classes is not None and num_classes != defined:
        raise ValueError(f"num_classes={num_classes} but dataset {dataset!r} has {defined} classes")
    return defined


def _check_sets(
    x: np.ndarray, x_test: np.ndarray, y: np.ndarray, y_test: np.ndarray, num_classes: int | None
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
    batched: bool = False,
    fast: bool = False,
) -> list[dict]:
    """Train ``model`` once per (training set, seed) pair, in this process; one result each.

    ``batched``: all seeds trained together on the device: mlp/cnn in one vmapped training
    (:func:`classifiers.train_torch_batched`; the CNN's dropout masks then differ from the
    sequential run's), logreg by torch's L-BFGS (:func:`classifiers.train_logreg_torch`,
    scikit-learn's objective); otherwise one after another (logreg: scikit-learn on the
    host). ``fast`` (with ``batched``): mlp/cnn by :func:`fastfit.train_torch_batched_fast`
    (early stopping on the device; CUDA graphs on CUDA; on a CPU the same results).

    ``train_sets``: (images uint8 [N,H,W(,C)], labels int [N]) per seed. The test set
    is converted and moved to the device once; every set is validated before any
    training. Each result equals :func:`train_and_evaluate` of that pair alone
    (``seconds`` is that seed's own time, its data transfer included).
    """
    if model not in MODELS:
        raise ValueError(f"unknown classifier {model!r}; choose from {', '.join(MODELS)}")
    if fast and not batched:
        raise ValueError("the fast classifier loop trains seeds batched (batched=True)")
    if len(train_sets) != len(seeds) or not seeds:
        raise ValueError(f"need one seed per training set, got {len(seeds)} and {len(train_sets)}")
    start = time.perf_counter()
    x_test = to_float(test_images, "test set")
    checked = []
    for k, (images, labels) in enumerate(train_sets):
        x = to_float(images, "training set" if len(seeds) == 1 else f"training set {k}")
        checked.append((x, *_check_sets(x, x_test, labels, test_labels, num_classes)))
    on_host = model == "logreg" and not batched  # scikit-learn
    dev = torch.device("cpu") if on_host else resolve_device(device)
    if not on_host:
        x_test_dev = torch.from_numpy(x_test).to(dev)
        y_test_dev = torch.from_numpy(checked[0][2]).to(dev)
    shared = time.perf_counter() - start  # test set conversion and transfer, counted once
    if batched:
        classes = max(c[3] for c in checked)  # one model shape for all seeds
        xs = [torch.from_numpy(x).to(dev) for x, *_ in checked]
        ys = [torch.from_numpy(y).to(dev) for _, y, *_ in checked]
        if model == "logreg":
            trained = train_logreg_torch(xs, ys, x_test_dev, y_test_dev, classes, max_iter)
        else:
            train = train_torch_batched_fast if fast else train_torch_batched
            trained = train(
                model,
                xs,
                ys,
                x_test_dev,
                y_test_dev,
                classes,
                seeds,
                max_epochs,
                patience,
                batch_size,
            )
        seconds = (time.perf_counter() - start) / len(seeds)  # the shared run, split evenly
        return [
            _record(model, seed, result, len(x), len(x_test), classes, dev, seconds)
            for seed, result, (x, *_) in zip(seeds, trained, checked, strict=True)
        ]
    results = []
    for seed, (x, y, y_test, classes) in zip(seeds, checked, strict=True):
        begin = time.perf_counter()
        if model == "logreg":
            result = train_logreg(x, y, x_test, y_test, seed, max_iter)
        else:
            result = train_torch(
                model,
                torch.from_numpy(x).to(dev),
                torch.from_numpy(y).to(dev),
                x_test_dev,
                y_test_dev,
                classes,
                seed,
                max_epochs,
                patience,
                batch_size,
            )
        seconds = time.perf_counter() - begin + (shared if not results else 0.0)
        results.append(_record(model, seed, result, len(x), len(x_test), classes, dev, seconds))
    return results


def _record(
    model: str,
    seed: int,
    result: dict,
    num_train: int,
    num_test: int,
    num_classes: int,
    device: torch.device,
    seconds: float,
) -> dict:
    """One seed's result file: accuracy first, then the model, seed, training details
    (``result``), sizes, device and wall seconds."""
    return {
        "accuracy": result.pop("accuracy"),
        "model": model,
        "seed": seed,
        **result,
        "num_train": num_train,
        "num_test": num_test,
        "num_classes": num_classes,
        "device": str(device),
        "seconds": seconds,
    }


def train_and_evaluate(
    model: str,
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    seed: int,
    *,
    num_classes: int | None = None,
    device: str = "auto",
    max_epochs: int = 1000,
    patience: int = 30,
    batch_size: int = 128,
    max_iter: int = 5000,
) -> dict:
    """Train ``model`` (logreg, mlp, cnn) on the training set; accuracy on the test set.

    Images uint8 [N,H,W] or [N,H,W,C] (same H, W, C for both sets); labels ints [N].
    ``num_classes`` (the dataset's class count) defaults to the largest label in either
    set + 1; a label >= ``num_classes`` is refused. Returns a JSON-ready dict with
    ``accuracy`` (fraction in [0,1]), ``holdout_accuracy`` (None for logreg), ``epochs``
    (None for logreg), ``model``, ``seed``, ``num_train``, ``num_test``, ``num_classes``,
    ``seconds`` and model details.
    """
    return train_and_evaluate_seeds(
        model,
        [(train_images, train_labels)],
        test_images,
        test_labels,
        [seed],
        num_classes=num_classes,
        device=device,
        max_epochs=max_epochs,
        patience=patience,
        batch_size=batch_size,
        max_iter=max_iter,
    )[0]


# ----------------------------------------------------------------------------- CLI


def _cmd_classify(args: argparse.Namespace) -> int:
    if args.model not in MODELS:  # before reading any data
        raise ValueError(f"unknown classifier {args.model!r}; choose from {', '.join(MODELS)}")
    if not len(args.train) == len(args.seed) == len(args.out):
        raise ValueError(
            f"--train, --seed and --out need one value per seed, got {len(args.train)}, "
            f"{len(args.seed)} and {len(args.out)}"
        )
    num_classes = resolve_num_classes(args.num_classes, args.dataset, args.test)
    train_sets = [fileio.load_samples(path) for path in args.train]
    test_images, test_labels = fileio.load_samples(args.test)
    results = train_and_evaluate_seeds(
        args.model,
        train_sets,
        test_images,
        test_labels,
        args.seed,
        num_classes=num_classes,
        device=args.device,
        max_epochs=args.max_epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        max_iter=args.max_iter,
        batched=args.batched,
    )
    write_results(results, args.train, args.test, args.dataset, args.out)
    return 0


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


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``classify``."""
    p = subparsers.add_parser(
        "classify", help="train a classifier on a sample file, test it on real data"
    )
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument(
        "--train", required=True, nargs="+", help="training sample file(s) (synthetic), one a seed"
    )
    p.add_argument("--test", required=True, help="test sample file (real)")
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="one seed per --train file")
    p.add_argument(
        "--out", required=True, nargs="+", help="output JSON {'accuracy', ...}, one a seed"
    )
    p.add_argument("--max-epochs", type=int, default=1000, help="mlp/cnn epoch cap")
    p.add_argument("--patience", type=int, default=30, help="mlp/cnn early-stopping epochs")
    p.add_argument("--batch-size", type=int, default=128, help="mlp/cnn batch size")
    p.add_argument("--max-iter", type=int, default=5000, help="logreg L-BFGS iterations")
    p.add_argument(
        "--dataset",
        default=None,
        help="dataset whose class count applies (mnist, fmnist, celeba); labels outside it "
        "are refused",
    )
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="class count (default: that of --dataset, else largest label + 1)",
    )
    p.add_argument(
        "--batched",
        action="store_true",
        help="mlp/cnn: train all seeds in one vmapped run (training sets of one size; the "
        "CNN's dropout masks differ from one seed at a time)",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    p.set_defaults(handler=_cmd_classify)
