"""The semi-debiased Sinkhorn loss (paper Eq. 6), by two solvers: one trains, one checks.

Notation (per training step):
    X  generated samples, [n + n', D] rows, features = [image, α_c · onehot(label)]
    Y  Poisson-sampled real samples, [M, D] (M random; padded rows carry weight 0)
    W_λ(A, B) = min_P <C, P> + λ KL(P | a ⊗ b)  over couplings P of the uniform
                empirical measures a, b, with cost (``cost``, paper Table 2 ablation)
                  mixed: C_ij = ||a_i − b_j||² + m ||a_i − b_j||₁   (default, the paper's)
                  l2:    C_ij = ||a_i − b_j||²                       (m ignored)
                  l1:    C_ij = ||a_i − b_j||₁                       (m ignored)
    S = 2 W_λ(X[0:n], Y) − W_λ(X[0:n], X[n':n+n']),   n' = floor(n · p)

λ is the Sinkhorn temperature (entropic regularisation; config key ``entropy_reg``),
unrelated to the privacy budget ε.

**Training path** (``train.trainer``, ``train.sweep``, ``train.audit``):
:func:`semi_debiased_sinkhorn_with_grad` and :func:`semi_debiased_sinkhorn_with_grad_runs`.
They solve with ``ot.solver``'s fixed-schedule Sinkhorn and return S together with ∇_X S
in closed form, outside autograd, so the step can clip and noise ∇_X S before it enters
the generator's backward pass.

**Reference path** (the cross-check in ``tests/test_ot.py`` and ``tests/test_loss.py``;
never used by training):
:func:`geomloss_entropic_ot`, :func:`geomloss_semi_debiased_sinkhorn` and
:func:`geomloss_semi_debiased_sinkhorn_runs`. They call geomloss
(``SamplesLoss("sinkhorn", p=1, blur=λ, debias=False, backend="tensorized")`` with our
cost), whose returned value <a, f> + <b, g> equals the primal objective above at
convergence; gradients come from autograd. ``tests/test_ot.py`` checks that both paths
agree (to 1e-12 in float64).
"""

from __future__ import annotations

import torch
from geomloss import SamplesLoss

from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.solver import check_cost as _check_cost
from dpsinkhorn.ot.solver import mixed_cost


def _geomloss_solver(
    entropy_reg: float,
    m: float | torch.Tensor,
    scaling: float,
    diameter: float | None,
    cost: str = "mixed",
) -> SamplesLoss:
    _check_cost(cost)
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


def feature_diameter(image_numel: int, alpha_c: float, cost: str = "mixed") -> float:
    """Data-independent ``diameter``: a bound on the distances between features.

    It fixes the temperature schedule (geomloss's "ε-scaling"; ``ot.temperature_schedule``)
    and so the number of Sinkhorn iterations in advance: no host synchronisation, and an
    iteration count that never depends on the data. With p=1 the temperature is annealed
    from ``diameter`` down to λ, i.e. ``diameter`` is read as the largest distance between
    two points. Both paths take it.

    mixed, l2: the largest Euclidean distance between two feature points. Pixels lie in
    [-1, 1] and two one-hot codes differ in two entries, so
    ||u - v||_2 <= sqrt(4 * image_numel + 2 * alpha_c**2) (59.88 for MNIST at α_c = 15).
    geomloss, given no diameter (the official code), estimates one from each call's
    points: the diagonal of their bounding box, which lies between the largest distance
    of the points and the box's diagonal sqrt(4 * image_numel + classes * alpha_c**2);
    docs/PAPER.md gives its values on real MNIST batches and what the choice changes.
    l2 is mixed with m = 0 and is handled identically.

    l1: the L1 diameter, ||u - v||_1 <= 2 * image_numel + 2 * alpha_c, which is also
    the largest value of the cost, so annealing starts at the cost's own scale (the
    Euclidean bound would be up to √D times too small for an L1 cost).
    """
    _check_cost(cost)
    if cost == "l1":
        return 2.0 * image_numel + 2.0 * alpha_c
    return (4.0 * image_numel + 2.0 * alpha_c**2) ** 0.5


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
    """W_λ between the empirical measures of the rows of x [N,D] and y [M,D] (λ =
    ``entropy_reg``), by geomloss with autograd (reference path).

    Weights default to uniform (1/N, 1/M); given weights must be non-negative and
    sum to 1 (rows of weight 0 are ignored). ``diameter`` starts geomloss's ε-scaling
    (None: estimated from the points; see :func:`feature_diameter`). ``cost``: mixed,
    l2 or l1 (see :func:`mixed_cost`). Returns a scalar tensor.
    """
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must be [N,D] and [M,D], got {tuple(x.shape)}, {tuple(y.shape)}")
    if x_weights is None:
        x_weights = torch.full((x.shape[0],), 1.0 / x.shape[0], dtype=x.dtype, device=x.device)
    if y_weights is None:
        y_weights = torch.full((y.shape[0],), 1.0 / y.shape[0], dtype=y.dtype, device=y.device)
    return _geomloss_solver(entropy_reg, m, scaling, diameter, cost)(x_weights, x, y_weights, y)


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
    geomloss with autograd (reference path; training uses
    :func:`semi_debiased_sinkhorn_with_grad`). λ = ``entropy_reg``.

    ``y_weights`` [M] marks the real rows actually drawn (any non-negative
    weights, normalised here); all-zero weights mean an empty real batch, for
    which the data term is 0 (and contributes zero gradient). p = 0 gives the
    biased loss 2W(X,Y) − W(X,X); p = 1 the fully debiased one with independent X'.
    ``cost``: mixed, l2 or l1 (see :func:`mixed_cost`).
    """
    n_prime = debias_size(n, p)
    if x.shape[0] != n + n_prime:
        raise ValueError(f"x must have n + n' = {n + n_prime} rows, got {x.shape[0]}")
    x_cross = x[:n]
    solve = {"scaling": scaling, "diameter": diameter, "cost": cost}
    self_term = geomloss_entropic_ot(x_cross, x[n_prime : n + n_prime], entropy_reg, m, **solve)
    if y_weights is None:
        return 2 * geomloss_entropic_ot(x_cross, y, entropy_reg, m, **solve) - self_term
    # Empty real batch: solve against uniform dummy weights (keeps the solver finite,
    # no host synchronisation) and multiply the data term by 0.
    weights, has_data = _real_batch_weights(y_weights)
    data_term = geomloss_entropic_ot(x_cross, y, entropy_reg, m, y_weights=weights, **solve)
    return 2 * has_data * data_term - self_term


def _real_batch_weights(y_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise 0/1 real-row weights [..., M] -> (weights, has_data [...]).

    An empty real batch gets uniform dummy weights (keeps the solver finite, no host
    synchronisation) and has_data = 0, which multiplies its data term away.
    """
    total = y_weights.sum(-1, keepdim=True)
    uniform = torch.full_like(y_weights, 1.0 / y_weights.shape[-1])
    weights = torch.where(total > 0, y_weights / total.clamp_min(1e-30), uniform)
    return weights, (total[..., 0] > 0).to(y_weights.dtype)


def geomloss_semi_debiased_sinkhorn_runs(
    x_cross: torch.Tensor,
    x_self: torch.Tensor,
    y: torch.Tensor,
    y_weights: torch.Tensor,
    entropy_reg: float,
    m: torch.Tensor,
    *,
    scaling: float = 0.5,
    diameter: float | None = None,
    cost: str = "mixed",
) -> torch.Tensor:
    """S_k for K independent runs at once -> [K], by geomloss with autograd (reference
    path; sweeps train with :func:`semi_debiased_sinkhorn_with_grad_runs`).

    Run k: S_k = 2 W_λ(x_cross[k], Y_k) − W_λ(x_cross[k], x_self[k]), where
    x_cross [K,n,D] = X_k[0:n], x_self [K,n,D] = X_k[n'_k:n'_k+n] (n'_k may differ
    between runs), Y_k = the rows of y [K,M,D] with weight y_weights [K,M] (0/1,
    normalised here; an empty batch gives a zero data term, as in
    :func:`geomloss_semi_debiased_sinkhorn`), and m [K] each run's L1 weight. One batched
    geomloss solve per term; the runs never mix (each batch entry is its own problem).
    """
    k, n = x_cross.shape[:2]
    if x_self.shape != x_cross.shape or y.shape[0] != k or y_weights.shape != y.shape[:2]:
        raise ValueError(
            f"expected x_cross and x_self [K,n,D], y [K,M,D], y_weights [K,M]; got "
            f"{tuple(x_cross.shape)}, {tuple(x_self.shape)}, {tuple(y.shape)}, "
            f"{tuple(y_weights.shape)}"
        )
    solver = _geomloss_solver(entropy_reg, m, scaling, diameter, cost)
    uniform = torch.full((k, n), 1.0 / n, dtype=x_cross.dtype, device=x_cross.device)
    self_term = solver(uniform, x_cross, uniform, x_self)
    weights, has_data = _real_batch_weights(y_weights)
    data_term = solver(uniform, x_cross, weights, y)
    return 2 * has_data * data_term - self_term


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S_k of :func:`geomloss_semi_debiased_sinkhorn_runs` and its gradients, by ``ot``'s
    fixed solver (training path, ``train.sweep``); λ = ``entropy_reg``.

    Same inputs (x_cross, x_self [K,n,D], y [K,M,D], y_weights [K,M] 0/1, m a number or
    [K]), but ``diameter`` is required (it fixes the schedule); ``compile`` compiles the
    iterations (``ot.entropic_ot_with_grad``). Both terms of all K runs are one batched
    solve of 2K problems (the self term's second cloud is padded to M rows of weight 0,
    or the real buffer to n rows if it is shorter). Returns (S [K], ∇_{x_cross} S
    [K,n,D], ∇_{x_self} S [K,n,D]); nothing is recorded for autograd. Equals the
    geomloss path up to rounding.
    """
    _check_cost(cost)
    k, n, d = x_cross.shape
    if x_self.shape != x_cross.shape or y.shape[0] != k or y_weights.shape != y.shape[:2]:
        raise ValueError(
            f"expected x_cross and x_self [K,n,D], y [K,M,D], y_weights [K,M]; got "
            f"{tuple(x_cross.shape)}, {tuple(x_self.shape)}, {tuple(y.shape)}, "
            f"{tuple(y_weights.shape)}"
        )
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """S of :func:`geomloss_semi_debiased_sinkhorn` and ∇_x S [n + n', D] by the fixed
    solver (training path: ``train.trainer``, ``train.audit``); λ = ``entropy_reg``.

    x [n + n', D], y [M, D], y_weights [M] (0/1; all zero: empty real batch). Returns
    (S scalar, ∇_x S); nothing is recorded for autograd.
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
