"""The reference implementations the product is tested against (not product code):
pytorch-fid's own feature path and statistics, scikit-learn's LogisticRegression, a
plain per-seed torch training loop of appendix D.2, and the semi-debiased Sinkhorn loss
by geomloss with autograd (the ``geomloss_*`` functions)."""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import torch
from geomloss import SamplesLoss
from torch import nn

from dpsinkhorn.evaluate.classifiers import HOLDOUT_FRACTION, accuracy_of, make_model
from dpsinkhorn.evaluate.inception import load_inception
from dpsinkhorn.fileio import channels_last
from dpsinkhorn.ot.loss import _check_run_shapes, _real_batch_weights, debias_size
from dpsinkhorn.ot.solver import check_cost, mixed_cost


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


def _geomloss_solver(
    entropy_reg: float,
    m: float | torch.Tensor,
    scaling: float,
    diameter: float | None,
    cost: str = "mixed",
) -> SamplesLoss:
    check_cost(cost)
    return SamplesLoss(
        "sinkhorn",
        p=1,
        blur=entropy_reg,  # geomloss's blur is the temperature λ for p = 1
        debias=False,
        scaling=scaling,
        diameter=diameter,
        backend="tensorized",
        cost=lambda a, b: mixed_cost(a, b, m, cost),
    )


def geomloss_entropic_ot(
    x: torch.Tensor,
    y: torch.Tensor,
    entropy_reg: float,
    m: float,
    *,
    x_weights: torch.Tensor | None = None,
    y_weights: torch.Tensor | None = None,
    scaling: float = 0.5,
    diameter: float | None = None,
    cost: str = "mixed",
) -> torch.Tensor:
    """W_λ (scalar) between the empirical measures of the rows of x [N,D] and y [M,D], by
    geomloss with autograd (reference path). Weights: non-negative, summing to 1 (default
    uniform). ``diameter`` starts geomloss's ε-scaling (None: estimated from the points).
    """
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must be [N,D] and [M,D], got {tuple(x.shape)}, {tuple(y.shape)}")
    if x_weights is None:
        x_weights = torch.full((x.shape[0],), 1.0 / x.shape[0], dtype=x.dtype, device=x.device)
    if y_weights is None:
        y_weights = torch.full((y.shape[0],), 1.0 / y.shape[0], dtype=y.dtype, device=y.device)
    return _geomloss_solver(entropy_reg, m, scaling, diameter, cost)(x_weights, x, y_weights, y)


def geomloss_semi_debiased_sinkhorn(
    x: torch.Tensor,
    y: torch.Tensor,
    n: int,
    p: float,
    entropy_reg: float,
    m: float,
    *,
    y_weights: torch.Tensor | None = None,
    scaling: float = 0.5,
    diameter: float | None = None,
    cost: str = "mixed",
) -> torch.Tensor:
    """S = 2 W_λ(X[0:n], Y) − W_λ(X[0:n], X[n':n+n']) for x [n+n', D], y [M, D], by
    geomloss with autograd (reference path): :func:`geomloss_semi_debiased_sinkhorn_runs`
    with K = 1. ``y_weights`` [M] (default: all 1) marks the real rows drawn; all zero is
    an empty real batch, whose data term is 0. p = 0 gives the biased loss
    2W(X,Y) − W(X,X); p = 1 the fully debiased one with independent X'.
    """
    n_prime = debias_size(n, p)
    if x.shape[0] != n + n_prime:
        raise ValueError(f"x must have n + n' = {n + n_prime} rows, got {x.shape[0]}")
    if y_weights is None:
        y_weights = torch.ones(len(y), dtype=y.dtype, device=y.device)
    solve = {"scaling": scaling, "diameter": diameter, "cost": cost}
    x_cross, x_self = x[None, :n], x[None, n_prime : n + n_prime]
    return geomloss_semi_debiased_sinkhorn_runs(
        x_cross, x_self, y[None], y_weights[None], entropy_reg, m, **solve
    )[0]


def geomloss_semi_debiased_sinkhorn_runs(
    x_cross: torch.Tensor,
    x_self: torch.Tensor,
    y: torch.Tensor,
    y_weights: torch.Tensor,
    entropy_reg: float,
    m: float | torch.Tensor,
    *,
    scaling: float = 0.5,
    diameter: float | None = None,
    cost: str = "mixed",
) -> torch.Tensor:
    """S_k = 2 W_λ(x_cross[k], Y_k) − W_λ(x_cross[k], x_self[k]) of K independent runs
    -> [K], by geomloss with autograd (reference path), one batched solve per term.

    x_cross [K,n,D] = X_k[0:n], x_self [K,n,D] = X_k[n'_k:n'_k+n] (n'_k may differ between
    runs), Y_k = the rows of y [K,M,D] of weight y_weights [K,M] (0/1; an empty batch
    gives a zero data term), m [K] each run's L1 weight.
    """
    k, n = x_cross.shape[:2]
    _check_run_shapes(x_cross, x_self, y, y_weights)
    solver = _geomloss_solver(entropy_reg, m, scaling, diameter, cost)
    uniform = torch.full((k, n), 1.0 / n, dtype=x_cross.dtype, device=x_cross.device)
    self_term = solver(uniform, x_cross, uniform, x_self)
    weights, has_data = _real_batch_weights(y_weights)
    data_term = solver(uniform, x_cross, weights, y)
    return 2 * has_data * data_term - self_term
