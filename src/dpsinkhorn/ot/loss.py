"""The semi-debiased Sinkhorn loss (paper Eq. 6) and its gradient, as training computes it.

S = 2 W_λ(X[0:n], Y) − W_λ(X[0:n], X[n':n+n']), n' = floor(n · p), on features
[image, α_c · onehot(label)], with cost ``cost`` (``ot.solver.mixed_cost``); λ is the
Sinkhorn temperature (``entropy_reg``), unrelated to the privacy budget ε. ``ot.solver``'s
fixed schedule gives ∇_X S in closed form, so the step sanitises it before the generator's
backward. The tests' oracle is geomloss with autograd (tests/oracles.py). docs/PAPER.md,
"The loss".
"""

from __future__ import annotations

import torch

from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.solver import check_cost as _check_cost


def feature_diameter(image_numel: int, alpha_c: float, cost: str = "mixed") -> float:
    """Data-independent ``diameter``: a bound on the distances between features, which
    fixes the temperature schedule and so the number of Sinkhorn iterations in advance
    (no host synchronisation). Both paths take it (docs/PAPER.md, "The Sinkhorn schedule").

    mixed, l2: the largest Euclidean distance, sqrt(4 · image_numel + 2 · alpha_c²)
    (pixels in [-1, 1], two one-hot codes differ in two entries; 59.88 for MNIST at
    α_c = 15). l1: the L1 diameter 2 · image_numel + 2 · alpha_c, the cost's own scale.
    """
    _check_cost(cost)
    if cost == "l1":
        return 2.0 * image_numel + 2.0 * alpha_c
    return (4.0 * image_numel + 2.0 * alpha_c**2) ** 0.5


def conditional_features(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, alpha_c: float
) -> torch.Tensor:
    """Flatten images [N,...] and append α_c · onehot(label) -> [N, numel + num_classes]."""
    # A comparison rather than F.one_hot, whose range check reads the labels on the host.
    classes = torch.arange(num_classes, device=labels.device)
    onehot = (labels[:, None] == classes).to(images.dtype)
    return torch.cat([images.flatten(1), alpha_c * onehot], dim=1)


def debias_size(n: int, p: float) -> int:
    """n' = floor(n · p): the number of extra generated rows used only for debiasing."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"debiasing fraction p must be in [0, 1], got {p}")
    return int(n * p)


def _real_batch_weights(y_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise 0/1 real-row weights [..., M] -> (weights, has_data [...]). An empty real
    batch gets uniform dummy weights (the solver stays finite, no host synchronisation)
    and has_data = 0, which multiplies its data term away."""
    total = y_weights.sum(-1, keepdim=True)
    uniform = torch.full_like(y_weights, 1.0 / y_weights.shape[-1])
    weights = torch.where(total > 0, y_weights / total.clamp_min(1e-30), uniform)
    return weights, (total[..., 0] > 0).to(y_weights.dtype)


def _check_run_shapes(x_cross, x_self, y, y_weights) -> None:
    k = x_cross.shape[0]
    if x_self.shape != x_cross.shape or y.shape[0] != k or y_weights.shape != y.shape[:2]:
        raise ValueError(
            f"expected x_cross and x_self [K,n,D], y [K,M,D], y_weights [K,M]; got "
            f"{tuple(x_cross.shape)}, {tuple(x_self.shape)}, {tuple(y.shape)}, "
            f"{tuple(y_weights.shape)}"
        )


def semi_debiased_sinkhorn_with_grad_runs(
    x_cross: torch.Tensor,
    x_self: torch.Tensor,
    y: torch.Tensor,
    y_weights: torch.Tensor,
    entropy_reg: float,
    m: float | torch.Tensor,
    *,
    scaling: float,
    diameter: float,
    cost: str = "mixed",
    compile: bool = False,
    fused_cost: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S_k = 2 W_λ(x_cross[k], Y_k) − W_λ(x_cross[k], x_self[k]) of K independent runs and
    its gradients by ``ot.solver``'s fixed schedule; equal to geomloss up to rounding.

    x_cross [K,n,D] = X_k[0:n], x_self [K,n,D] = X_k[n'_k:n'_k+n] (n'_k may differ between
    runs), Y_k = the rows of y [K,M,D] of weight y_weights [K,M] (0/1; an empty batch gives
    a zero data term), m a number or [K] (each run's L1 weight); ``diameter`` fixes the
    schedule; ``compile`` and ``fused_cost`` as in ``ot.solver.entropic_ot_with_grad``. Both terms
    of all K runs are one solve of 2K problems (the shorter cloud padded with weight-0
    rows). Returns (S [K], ∇_{x_cross} S [K,n,D], ∇_{x_self} S [K,n,D]), no autograd history.
    """
    _check_cost(cost)
    k, n, d = x_cross.shape
    _check_run_shapes(x_cross, x_self, y, y_weights)
    rows = max(y.shape[1], n)
    weights, has_data = _real_batch_weights(y_weights)
    uniform = torch.full((k, n), 1.0 / n, dtype=x_cross.dtype, device=x_cross.device)

    def pad(t: torch.Tensor) -> torch.Tensor:  # [K, r, ...] -> [K, rows, ...], zeros appended
        extra = rows - t.shape[1]
        return torch.nn.functional.pad(t, (0, 0, 0, extra) if t.ndim == 3 else (0, extra))

    if not torch.is_tensor(m):
        m = torch.full((k,), float(m), dtype=x_cross.dtype, device=x_cross.device)
    value, grad_x, grad_y = ot.entropic_ot_with_grad(
        torch.cat([x_cross, x_cross]),  # problems 0..K-1: data terms; K..2K-1: self terms
        torch.cat([pad(y), pad(x_self)]),
        torch.cat([uniform, uniform]),
        torch.cat([pad(weights), pad(uniform)]),
        ot.temperature_schedule(diameter, entropy_reg, scaling),
        torch.cat([m, m]),
        cost,
        compile,
        fused_cost,
    )
    data_scale = 2 * has_data
    loss = data_scale * value[:k] - value[k:]
    grad_cross = data_scale[:, None, None] * grad_x[:k] - grad_x[k:]
    return loss, grad_cross, -grad_y[k:, :n]


def semi_debiased_sinkhorn_with_grad(
    x: torch.Tensor,
    y: torch.Tensor,
    y_weights: torch.Tensor,
    n: int,
    p: float,
    entropy_reg: float,
    m: float | torch.Tensor,
    *,
    scaling: float,
    diameter: float,
    cost: str = "mixed",
    compile: bool = False,
    fused_cost: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S = 2 W_λ(X[0:n], Y) − W_λ(X[0:n], X[n':n+n']) and ∇_x S [n + n', D] by the fixed
    solver (``train.trainer``, ``train.audit``); λ = ``entropy_reg``.

    x [n + n', D], y [M, D], y_weights [M] (0/1; all zero: empty real batch); ``compile``
    and ``fused_cost`` as in ``ot.solver.entropic_ot_with_grad``. Returns (S scalar, ∇_x S);
    nothing is recorded for autograd.
    """
    n_prime = debias_size(n, p)
    if x.shape[0] != n + n_prime:
        raise ValueError(f"x must have n + n' = {n + n_prime} rows, got {x.shape[0]}")
    loss, grad_cross, grad_self = semi_debiased_sinkhorn_with_grad_runs(
        x[None, :n],
        x[None, n_prime : n + n_prime],
        y[None],
        y_weights[None],
        entropy_reg,
        m,
        scaling=scaling,
        diameter=diameter,
        cost=cost,
        compile=compile,
        fused_cost=fused_cost,
    )
    return loss[0], debiased_gradient(grad_cross[0], grad_self[0], n_prime)


def debiased_gradient(
    grad_cross: torch.Tensor, grad_self: torch.Tensor, n_prime: int
) -> torch.Tensor:
    """∇_X S [n + n', D] from its two blocks [n, D]: rows 0..n-1 get ∇_{X[0:n]} S and
    rows n'..n'+n-1 add ∇_{X[n':n+n']} S (the blocks overlap where n' < n)."""
    n = grad_cross.shape[0]
    grad = grad_cross.new_zeros((n + n_prime, *grad_cross.shape[1:]))
    grad[:n] = grad_cross
    grad[n_prime : n_prime + n] += grad_self
    return grad
