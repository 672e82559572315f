"""The reference implementations the evaluation is tested against (not product code):
pytorch-fid's own feature path and statistics, scikit-learn's LogisticRegression, and a
plain per-seed torch training loop of appendix D.2."""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import torch
from torch import nn

from dpsinkhorn.evaluate.classifiers import HOLDOUT_FRACTION, accuracy_of, make_model
from dpsinkhorn.evaluate.inception import load_inception
from dpsinkhorn.fileio import channels_last


def pytorch_fid_activations(
    images: np.ndarray,
    weights: str | os.PathLike | None = None,
    device: str = "cpu",
    batch_size: int = 50,
    model: nn.Module | None = None,
) -> np.ndarray:
    """Pool3 features float64 [N,2048] of uint8 images [N,H,W(,C)] by pytorch-fid's own
    ``InceptionV3.forward`` (resize, normalise, unfolded batch norm, NCHW, fp32), as its
    ``get_activations`` feeds it: [0,1] float batches, grayscale repeated to 3 channels."""
    from dpsinkhorn.models import cudnn_tf32

    images = channels_last(images, "images")
    model = load_inception(weights, device) if model is None else model
    out = []
    with torch.inference_mode(), cudnn_tf32(False):
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size]))
            x = batch.permute(0, 3, 1, 2).contiguous().float() / 255.0
            x = x.repeat(1, 3, 1, 1) if x.shape[1] == 1 else x
            out.append(model(x.to(next(model.parameters()).device))[0][:, :, 0, 0].double())
    return torch.cat(out).cpu().numpy()


def pytorch_fid_statistics(acts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pytorch-fid's ``calculate_activation_statistics`` of features [N,D]: mean and
    ``np.cov(rowvar=False)``."""
    return np.mean(acts, axis=0), np.cov(acts, rowvar=False)


def sklearn_logreg(
    x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, max_iter: int
) -> dict:
    """scikit-learn's LogisticRegression (lbfgs, C = 1) on flattened pixels: test accuracy,
    iterations and whether it converged."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(solver="lbfgs", max_iter=max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x.reshape(len(x), -1), y)
    return {
        "accuracy": float(clf.score(x_test.reshape(len(x_test), -1), y_test)),
        "iterations": int(np.max(clf.n_iter_)),
        "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught),
    }


def train_one_seed(
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
    """Appendix D.2 for one seed, step by step: the seed's initialisation, 10% hold-out and
    batch order as ``classifiers.BatchedRun`` draws them, Adam, the hold-out accuracy after
    every epoch, stop after ``patience`` epochs without a better one, best weights tested."""
    torch.manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(x))
    n_hold = max(1, int(round(HOLDOUT_FRACTION * len(x))))
    hold, fit = torch.from_numpy(order[:n_hold]), torch.from_numpy(order[n_hold:])
    x_fit, y_fit, x_hold, y_hold = x[fit], y[fit], x[hold], y[hold]
    model = make_model(name, tuple(x.shape[1:]), num_classes)
    optimizer = torch.optim.Adam(model.parameters())
    shuffle = torch.Generator().manual_seed(seed)
    best_acc, best_epoch, best_state, epoch = -1.0, 0, None, 0
    for epoch in range(1, max_epochs + 1):
        model.train()
        for batch in torch.randperm(len(x_fit), generator=shuffle).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x_fit[batch]), y_fit[batch]).backward()
            optimizer.step()
        acc = accuracy_of(model, x_hold, y_hold)
        if acc > best_acc:
            best_acc, best_epoch, best_state = acc, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= patience:
            break
    model.load_state_dict(best_state)
    return {
        "accuracy": accuracy_of(model, x_test, y_test),
        "holdout_accuracy": best_acc,
        "epochs": epoch,
        "best_epoch": best_epoch,
    }
