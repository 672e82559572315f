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

Several seeds (each with its own training file) are trained by one call
(:func:`train_and_evaluate_seeds`, ``dpsinkhorn classify --train A B --seed 0 1 --out
a.json b.json``): the test set is moved to the device once, each training set once,
and no DataLoader is involved (batches are index slices of device tensors). Each seed
gives exactly the result it gives alone. The class count comes from the dataset
definition (``--dataset``, ``data.DATASETS[name].num_classes``) or ``--num-classes``;
a label outside it is refused.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import numpy as np
import torch
from torch import nn

from dpsinkhorn import fileio
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
    """Fraction of correct predictions on (x [N,C,H,W], y [N]), in eval mode.

    The count stays on the device until the end: one host synchronisation per call.
    """
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for start in range(0, len(x), EVAL_BATCH):
        logits = model(x[start : start + EVAL_BATCH])
        correct += (logits.argmax(1) == y[start : start + EVAL_BATCH]).sum()
    return int(correct.item()) / len(x)


def _train_torch(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    seed: int,
    max_epochs: int,
    patience: int,
    batch_size: int,
) -> dict:
    """Adam + early stopping on a 10% hold-out of (x, y); returns the result fields.

    ``x`` float32 [N,C,H,W], ``y`` int64 [N] and the test pair are tensors already on
    the training device.
    """
    if len(x) < 2:
        raise ValueError(f"{name} needs at least 2 training images, got {len(x)}")
    if max_epochs < 1 or patience < 1 or batch_size < 1:
        raise ValueError("max_epochs, patience and batch_size must be >= 1")
    device = x.device
    torch.manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(x))
    n_hold = max(1, int(round(HOLDOUT_FRACTION * len(x))))
    hold = torch.from_numpy(order[:n_hold]).to(device)
    fit = torch.from_numpy(order[n_hold:]).to(device)
    x_fit, y_fit, x_hold, y_hold = x[fit], y[fit], x[hold], y[hold]
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
        "accuracy": _accuracy(model, x_test, y_test),
        "holdout_accuracy": best_acc,
        "epochs": epoch,
        "best_epoch": best_epoch,
        "num_holdout": int(n_hold),
        "max_epochs": max_epochs,
        "patience": patience,
        "batch_size": batch_size,
    }


def _train_torch_batched(
    name: str,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    seeds: list[int],
    max_epochs: int,
    patience: int,
    batch_size: int,
) -> list[dict]:
    """:func:`_train_torch` for K seeds at once: the K models' parameters stacked [K, ...]
    (``torch.func.stack_module_state``), every step one ``vmap``-ed forward/backward and one
    Adam step (elementwise, so the same as K separate Adams).

    Per seed as in :func:`_train_torch`: initialisation (``torch.manual_seed(seed)``),
    hold-out split, batch order, early stopping and the best hold-out weights; only the
    dropout masks come from another stream (``vmap(randomness="different")``), so the CNN's
    results differ from the sequential ones like another seed's would. The training sets
    ``xs`` [N,C,H,W] (float32) / ``ys`` [N] must have the same N; all tensors on one device.
    """
    from torch.func import functional_call, stack_module_state, vmap

    k, n = len(seeds), len(xs[0])
    if any(len(x) != n for x in xs):
        raise ValueError(
            f"batched seeds need training sets of one size, got {[len(x) for x in xs]}"
        )
    if n < 2:
        raise ValueError(f"{name} needs at least 2 training images, got {n}")
    if max_epochs < 1 or patience < 1 or batch_size < 1:
        raise ValueError("max_epochs, patience and batch_size must be >= 1")
    device = xs[0].device
    n_hold = max(1, int(round(HOLDOUT_FRACTION * n)))
    models, x_fit, y_fit, x_hold, y_hold, shuffles = [], [], [], [], [], []
    for seed, x, y in zip(seeds, xs, ys, strict=True):
        torch.manual_seed(seed)
        order = np.random.default_rng(seed).permutation(n)
        hold = torch.from_numpy(order[:n_hold]).to(device)
        fit = torch.from_numpy(order[n_hold:]).to(device)
        x_fit.append(x[fit])
        y_fit.append(y[fit])
        x_hold.append(x[hold])
        y_hold.append(y[hold])
        models.append(make_model(name, tuple(x.shape[1:]), num_classes).to(device))
        shuffles.append(torch.Generator().manual_seed(seed))
    x_fit, y_fit = torch.stack(x_fit), torch.stack(y_fit)  # [K, n_fit, C, H, W], [K, n_fit]
    x_hold, y_hold = torch.stack(x_hold), torch.stack(y_hold)
    params, buffers = stack_module_state(models)  # leaves [K, ...]
    base = copy.deepcopy(models[0]).to("meta")

    def forward(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (x,))

    train_fn = vmap(forward, randomness="different")
    optimizer = torch.optim.Adam(list(params.values()))
    rows = torch.arange(k, device=device)[:, None]

    @torch.no_grad()
    def accuracy(x: torch.Tensor, y: torch.Tensor, shared: bool) -> torch.Tensor:
        """Fraction correct per seed [K]; ``x`` [K,N,...] or, ``shared``, [N,...] for all."""
        base.eval()
        fn = vmap(forward, in_dims=(0, 0, None) if shared else (0, 0, 0))
        correct = torch.zeros(k, dtype=torch.int64, device=device)
        for start in range(0, y.shape[-1], EVAL_BATCH):
            xb = x[start : start + EVAL_BATCH] if shared else x[:, start : start + EVAL_BATCH]
            yb = y[start : start + EVAL_BATCH] if shared else y[:, start : start + EVAL_BATCH]
            correct += (fn(params, buffers, xb).argmax(-1) == yb).sum(-1)
        return correct.double() / y.shape[-1]

    best_acc, best_epoch, epochs = [-1.0] * k, [0] * k, [0] * k
    best_state: list[dict | None] = [None] * k
    done = [False] * k
    n_fit = x_fit.shape[1]
    for epoch in range(1, max_epochs + 1):
        base.train()
        perms = torch.stack([torch.randperm(n_fit, generator=g) for g in shuffles]).to(device)
        for start in range(0, n_fit, batch_size):
            idx = perms[:, start : start + batch_size]  # [K, b]
            logits = train_fn(params, buffers, x_fit[rows, idx])  # [K, b, classes]
            loss = (
                nn.functional.cross_entropy(
                    logits.flatten(0, 1), y_fit[rows, idx].flatten(), reduction="sum"
                )
                / idx.shape[1]
            )  # sum over seeds of each seed's mean loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        accs = accuracy(x_hold, y_hold, shared=False).tolist()
        for j in range(k):
            if done[j]:
                continue
            epochs[j] = epoch
            if accs[j] > best_acc[j]:
                best_acc[j], best_epoch[j] = accs[j], epoch
                best_state[j] = {key: v[j].detach().clone() for key, v in params.items()}
            elif epoch - best_epoch[j] >= patience:
                done[j] = True
        if all(done):
            break
    with torch.no_grad():
        for j in range(k):
            for key, v in params.items():
                v[j].copy_(best_state[j][key])
    test_acc = accuracy(x_test, y_test, shared=True).tolist()
    return [
        {
            "accuracy": test_acc[j],
            "holdout_accuracy": best_acc[j],
            "epochs": epochs[j],
            "best_epoch": best_epoch[j],
            "num_holdout": int(n_hold),
            "max_epochs": max_epochs,
            "patience": patience,
            "batch_size": batch_size,
            "batched_seeds": k,
        }
        for j in range(k)
    ]


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


def resolve_num_classes(num_classes: int | None, dataset: str | None) -> int | None:
    """The class count: ``data.DATASETS[dataset].num_classes``, or ``num_classes`` (both must
    agree when both are given), or None (then the largest label + 1)."""
    if dataset is None:
        return num_classes
    from dpsinkhorn.data import datasets as data

    defined = data.dataset_info(dataset).num_classes
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
) -> list[dict]:
    """Train ``model`` once per (training set, seed) pair, in this process; one result each.

    ``batched`` (mlp/cnn): all seeds in one vmapped training (:func:`_train_torch_batched`;
    the CNN's dropout masks then differ from the sequential run's); otherwise one after
    another.

    ``train_sets``: (images uint8 [N,H,W(,C)], labels int [N]) per seed. The test set
    is converted and moved to the device once; every set is validated before any
    training. Each result equals :func:`train_and_evaluate` of that pair alone
    (``seconds`` is that seed's own time, its data transfer included).
    """
    if model not in MODELS:
        raise ValueError(f"unknown classifier {model!r}; choose from {', '.join(MODELS)}")
    if len(train_sets) != len(seeds) or not seeds:
        raise ValueError(f"need one seed per training set, got {len(seeds)} and {len(train_sets)}")
    start = time.perf_counter()
    x_test = to_float(test_images, "test set")
    checked = []
    for k, (images, labels) in enumerate(train_sets):
        x = to_float(images, "training set" if len(seeds) == 1 else f"training set {k}")
        checked.append((x, *_check_sets(x, x_test, labels, test_labels, num_classes)))
    dev = torch.device("cpu") if model == "logreg" else resolve_device(device)
    if model != "logreg":
        x_test_dev = torch.from_numpy(x_test).to(dev)
        y_test_dev = torch.from_numpy(checked[0][2]).to(dev)
    shared = time.perf_counter() - start  # test set conversion and transfer, counted once
    if batched and model != "logreg":
        classes = max(c[3] for c in checked)  # one model shape for all seeds
        trained = _train_torch_batched(
            model,
            [torch.from_numpy(x).to(dev) for x, *_ in checked],
            [torch.from_numpy(y).to(dev) for _, y, *_ in checked],
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
            result = _train_logreg(x, y, x_test, y_test, seed, max_iter)
        else:
            result = _train_torch(
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
    num_classes = resolve_num_classes(args.num_classes, args.dataset)
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
    for result, train, out in zip(results, args.train, args.out, strict=True):
        result.update(train=str(train), test=str(args.test))
        if args.dataset is not None:
            result["dataset"] = args.dataset
        fileio.write_json(out, result)
        print(f"{args.model} accuracy {result['accuracy']:.4f} (seed {result['seed']}) -> {out}")
    return 0


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
