"""Downstream utility: classifiers trained on synthetic samples, tested on real data.

Paper appendix D.2. Inputs are pixels scaled to [0,1] (uint8 / 255; no
standardisation), images [N,H,W] (grayscale) or [N,H,W,C] with C in (1, 3).

- ``logreg``: scikit-learn ``LogisticRegression`` (L-BFGS, ``max_iter`` 5000) on
  flattened pixels, fitted on the whole training set (no model selection).
- ``mlp``: flatten - linear(100) - ReLU - linear(classes).
- ``cnn``: conv3x3(32) - ReLU - maxpool2 - dropout(0.5) - conv3x3(64) - ReLU -
  maxpool2 - dropout(0.5) - flatten - linear(classes); any H, W >= 4.

The MLP and CNN are trained with Adam (default parameters) on 90% of the
training set; the other 10% is a hold-out for early stopping: training stops
after ``patience`` epochs without a better hold-out accuracy (or at
``max_epochs``) and the best hold-out weights are kept. The test set is only
used for the final accuracy. Everything is seeded: the same seed gives the
same accuracy on CPU.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import numpy as np
import torch
from torch import nn

from dpsinkhorn import io
from dpsinkhorn.devices import resolve_device

MODELS = ("logreg", "mlp", "cnn")
HOLDOUT_FRACTION = 0.1
EVAL_BATCH = 1024


def to_float(images: np.ndarray, where: str = "images") -> np.ndarray:
    """uint8 [N,H,W] or [N,H,W,C] -> float32 [N,C,H,W] in [0,1]."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"{where}: images must be uint8, got {images.dtype}")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"{where}: images must be [N,H,W] or [N,H,W,C] with C in (1, 3)")
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0


def _check_labels(labels: np.ndarray, n: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(f"{where}: labels must be {n} non-negative integers")
    return labels.astype(np.int64)


def make_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The ``mlp`` or ``cnn`` of appendix D.2 for inputs [C,H,W]."""
    c, h, w = in_shape
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(c * h * w, 100), nn.ReLU(), nn.Linear(100, num_classes)
        )
    if name == "cnn":
        if h < 4 or w < 4:
            raise ValueError(f"cnn needs images of at least 4x4 pixels, got {h}x{w}")
        return nn.Sequential(
            nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.5),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.5),
            nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), num_classes),
        )  # fmt: skip
    raise ValueError(f"unknown torch model {name!r}; choose from mlp, cnn")


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of correct predictions on (x [N,C,H,W], y [N]), in eval mode."""
    model.eval()
    correct = 0
    for start in range(0, len(x), EVAL_BATCH):
        logits = model(x[start : start + EVAL_BATCH])
        correct += (logits.argmax(1) == y[start : start + EVAL_BATCH]).sum().item()
    return correct / len(x)


def _train_torch(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    seed: int,
    device: torch.device,
    max_epochs: int,
    patience: int,
    batch_size: int,
) -> dict:
    """Adam + early stopping on a 10% hold-out of (x, y); returns the result fields."""
    if len(x) < 2:
        raise ValueError(f"{name} needs at least 2 training images, got {len(x)}")
    if max_epochs < 1 or patience < 1 or batch_size < 1:
        raise ValueError("max_epochs, patience and batch_size must be >= 1")
    torch.manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(x))
    n_hold = max(1, int(round(HOLDOUT_FRACTION * len(x))))
    hold, fit = order[:n_hold], order[n_hold:]

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    x_fit, y_fit, x_hold, y_hold = tensor(x[fit]), tensor(y[fit]), tensor(x[hold]), tensor(y[hold])
    model = make_model(name, x.shape[1:], num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed)

    best_acc, best_epoch, best_state, epoch = -1.0, 0, None, 0
    for epoch in range(1, max_epochs + 1):
        model.train()
        for batch in torch.randperm(len(x_fit), generator=shuffle).to(device).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x_fit[batch]), y_fit[batch]).backward()
            optimizer.step()
        acc = _accuracy(model, x_hold, y_hold)
        if acc > best_acc:
            best_acc, best_epoch, best_state = acc, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= patience:
            break
    model.load_state_dict(best_state)
    return {
        "accuracy": _accuracy(model, tensor(x_test), tensor(y_test)),
        "holdout_accuracy": best_acc,
        "epochs": epoch,
        "best_epoch": best_epoch,
        "num_holdout": int(n_hold),
        "max_epochs": max_epochs,
        "patience": patience,
        "batch_size": batch_size,
    }


def _train_logreg(
    x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, seed: int, max_iter: int
) -> dict:
    """L-BFGS logistic regression on flattened pixels of the whole training set."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(y)) < 2:
        raise ValueError("logreg needs training samples of at least 2 classes")
    clf = LogisticRegression(solver="lbfgs", max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x.reshape(len(x), -1), y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return {
        "accuracy": float(clf.score(x_test.reshape(len(x_test), -1), y_test)),
        "holdout_accuracy": None,  # no model selection for logreg
        "epochs": None,
        "iterations": int(np.max(clf.n_iter_)),
        "converged": converged,
        "max_iter": max_iter,
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
    ``num_classes`` defaults to the largest label in either set + 1. Returns a
    JSON-ready dict with ``accuracy`` (fraction in [0,1]), ``holdout_accuracy``
    (None for logreg), ``epochs`` (None for logreg), ``model``, ``seed``,
    ``num_train``, ``num_test``, ``num_classes``, ``seconds`` and model details.
    """
    if model not in MODELS:
        raise ValueError(f"unknown classifier {model!r}; choose from {', '.join(MODELS)}")
    start = time.perf_counter()
    x, x_test = to_float(train_images, "training set"), to_float(test_images, "test set")
    if x.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"training images [C,H,W]={list(x.shape[1:])} differ from test images "
            f"{list(x_test.shape[1:])}"
        )
    if len(x) == 0 or len(x_test) == 0:
        raise ValueError("training and test sets must not be empty")
    y = _check_labels(train_labels, len(x), "training set")
    y_test = _check_labels(test_labels, len(x_test), "test set")
    largest = int(max(y.max(), y_test.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif num_classes <= largest:
        raise ValueError(f"num_classes={num_classes} but labels go up to {largest}")

    if model == "logreg":
        result = _train_logreg(x, y, x_test, y_test, seed, max_iter)
        used = "cpu"
    else:
        dev = resolve_device(device)
        result = _train_torch(
            model, x, y, x_test, y_test, num_classes, seed, dev, max_epochs, patience, batch_size
        )
        used = str(dev)
    return {
        "accuracy": result.pop("accuracy"),
        "model": model,
        "seed": seed,
        **result,
        "num_train": len(x),
        "num_test": len(x_test),
        "num_classes": num_classes,
        "device": used,
        "seconds": time.perf_counter() - start,
    }


# ----------------------------------------------------------------------------- CLI


def _cmd_classify(args: argparse.Namespace) -> int:
    if args.model not in MODELS:  # before reading any data
        raise ValueError(f"unknown classifier {args.model!r}; choose from {', '.join(MODELS)}")
    train_images, train_labels = io.load_samples(args.train)
    test_images, test_labels = io.load_samples(args.test)
    result = train_and_evaluate(
        args.model,
        train_images,
        train_labels,
        test_images,
        test_labels,
        args.seed,
        num_classes=args.num_classes,
        device=args.device,
        max_epochs=args.max_epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        max_iter=args.max_iter,
    )
    result.update(train=str(args.train), test=str(args.test))
    io.write_json(args.out, result)
    print(f"{args.model} accuracy {result['accuracy']:.4f} (seed {args.seed}) -> {args.out}")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``classify``."""
    p = subparsers.add_parser(
        "classify", help="train a classifier on a sample file, test it on real data"
    )
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--train", required=True, help="training sample file (synthetic)")
    p.add_argument("--test", required=True, help="test sample file (real)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output JSON {'accuracy', ...}")
    p.add_argument("--max-epochs", type=int, default=1000, help="mlp/cnn epoch cap")
    p.add_argument("--patience", type=int, default=30, help="mlp/cnn early-stopping epochs")
    p.add_argument("--batch-size", type=int, default=128, help="mlp/cnn batch size")
    p.add_argument("--max-iter", type=int, default=5000, help="logreg L-BFGS iterations")
    p.add_argument("--num-classes", type=int, default=None, help="default: largest label + 1")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    p.set_defaults(handler=_cmd_classify)
