"""Batched entropic OT with a fixed iteration schedule, returning value and gradients.

The training step's solver: geomloss's tensorized ``SamplesLoss("sinkhorn", p=1,
debias=False)`` algorithm (equal up to rounding; tests/test_ot.py), with the temperature
schedule fixed in advance from a data-independent diameter (no host synchronisation, the
same kernels every step) and the gradients in closed form, outside the caller's autograd
(docs/PAPER.md, "The loss"). Per problem, x [N,D] with weights α, y [M,D] with β, cost C:
    W_λ = <α, f> + <β, g> for the dual potentials (f, g) at temperature λ (``entropy_reg``)
    ∇_{x_i} W = α_i Σ_j P_ij ∇_x C(x_i, y_j),   P_ij = softmax_j(log β_j + (g_j − C_ij)/λ)
    ∇_{y_j} W = β_j Σ_i Q_ij ∇_y C(x_i, y_j),   Q_ij = softmax_i(log α_i + (f_i − C_ij)/λ)
    ∇_x C = 2(x − y) + m sign(x − y)            (mixed; l2: m = 0; l1: sign(x − y) only)
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

LOG_ZERO = -100000.0  # log-weight of a weight-0 row (geomloss's value)
COSTS = ("mixed", "l2", "l1")


def check_cost(cost: str) -> None:
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")


def mixed_cost(
    x: torch.Tensor, y: torch.Tensor, m: float | torch.Tensor, cost: str = "mixed"
) -> torch.Tensor:
    """Cost matrix for x [B,N,D], y [B,M,D] -> [B,N,M] (no ½ anywhere): mixed
    ||x_i − y_j||² + m ||x_i − y_j||₁, l2 ||x_i − y_j||², l1 ||x_i − y_j||₁; ``m`` (ignored
    by l2 and l1) is a number or a tensor [B] (one weight per batch entry, for sweeps)."""
    check_cost(cost)
    if cost == "l1":
        return torch.cdist(x, y, p=1)
    sq = (x * x).sum(-1)[:, :, None] + (y * y).sum(-1)[:, None, :] - 2 * x @ y.transpose(1, 2)
    out = sq.clamp_min(0)
    if cost == "mixed" and torch.is_tensor(m):
        out = out + m.view(-1, 1, 1) * torch.cdist(x, y, p=1)
    elif cost == "mixed" and m:
        out = out + m * torch.cdist(x, y, p=1)
    return out


#: Most elements of one [B, rows, M, D] block of differences in :func:`fused_cost`.
FUSED_BLOCK = 2**24


def _difference_blocks(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, cost: str):
    """(rows, x_i − y_j [B, rows, M, D], weight of ||·||², weight of ||·||₁ [B,1,1,1]) per
    block of x's rows, each block at most ``FUSED_BLOCK`` elements."""
    l1 = {"mixed": m, "l2": torch.zeros_like(m), "l1": torch.ones_like(m)}[cost].view(-1, 1, 1, 1)
    sq, rows = float(cost != "l1"), max(1, FUSED_BLOCK // (x.shape[0] * y.shape[1] * x.shape[2]))
    for start in range(0, x.shape[1], rows):
        block = slice(start, start + rows)
        yield block, x[:, block, None] - y[:, None], sq, l1


def fused_cost(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, cost: str) -> torch.Tensor:
    """:func:`mixed_cost` [B,N,M] from the exact differences x_i − y_j, both norms in one
    broadcast expression per block of rows (no matrix product, no cdist); m [B]."""
    blocks = [
        (sq * diff.square() + l1 * diff.abs()).sum(-1)
        for _, diff, sq, l1 in _difference_blocks(x, y, m, cost)
    ]
    return torch.cat(blocks, dim=1)


def fused_cost_gradients(
    x: torch.Tensor,
    y: torch.Tensor,
    m: torch.Tensor,
    cost: str,
    plan_x: torch.Tensor,
    plan_y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_j plan_x_ij ∇_x C_ij [B,N,D], Σ_i plan_y_ij ∇_y C_ij [B,M,D]) for plans [B,N,M],
    both from one pass over the differences: ∇_x C = −∇_y C = 2(x − y) + m sign(x − y)."""
    grad_x, grad_y = torch.empty_like(x), torch.zeros_like(y)
    for rows, diff, sq, l1 in _difference_blocks(x, y, m, cost):
        slope = 2 * sq * diff + l1 * diff.sign()
        grad_x[:, rows] = (plan_x[:, rows, :, None] * slope).sum(2)
        grad_y -= (plan_y[:, rows, :, None] * slope).sum(1)
    return grad_x, grad_y


def temperature_schedule(diameter: float, entropy_reg: float, scaling: float) -> list[float]:
    """Sinkhorn temperatures of the annealed descent to λ = ``entropy_reg`` for p = 1
    (geomloss's "ε-scaling" schedule, whose ``blur`` is λ for p = 1).

    Starts at ``diameter`` and multiplies by ``scaling`` until λ is reached:
    [diameter, diameter, diameter·s, diameter·s², ..., λ] (all > λ but the last).
    """
    if not (diameter > 0 and entropy_reg > 0 and 0 < scaling < 1):
        raise ValueError(
            f"need diameter > 0, entropy_reg > 0, 0 < scaling < 1; got {diameter}, "
            f"{entropy_reg}, {scaling}"
        )
    # Same values as geomloss: exp of an arithmetic sequence of logs (float64).
    logs = np.arange(math.log(diameter), math.log(entropy_reg), math.log(scaling))
    return [float(diameter)] + [float(np.exp(e)) for e in logs] + [float(entropy_reg)]


def _log_weights(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w > 0, w.clamp_min(1e-38).log(), torch.full_like(w, LOG_ZERO))


def _softmin(lam: float, cost: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """-λ log Σ_j exp(h_j − C_ij/λ) over the last axis: cost [B,N,M], h [B,M] -> [B,N]."""
    return -lam * torch.logsumexp(h[:, None, :] - cost / lam, dim=2)


def sinkhorn_iterations(
    c_xy: torch.Tensor, a_log: torch.Tensor, b_log: torch.Tensor, temperatures: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric log-domain Sinkhorn annealed through ``temperatures``, as geomloss's
    ``sinkhorn_loop``: c_xy [B,N,M], log-weights a_log [B,N], b_log [B,M] -> potentials
    (f [B,N], g [B,M]) at the last temperature, before the final extrapolation."""
    c_yx = c_xy.transpose(1, 2)
    lam = temperatures[0]
    f = _softmin(lam, c_xy, b_log)
    g = _softmin(lam, c_yx, a_log)
    for lam in temperatures:
        f_next = _softmin(lam, c_xy, b_log + g / lam)
        g_next = _softmin(lam, c_yx, a_log + f / lam)
        f, g = 0.5 * (f + f_next), 0.5 * (g + g_next)
    return f, g


@functools.cache
def compiled(function):
    """``function`` (:func:`sinkhorn_iterations`, :func:`fused_cost`,
    :func:`fused_cost_gradients`) through ``torch.compile``, built once per process: each
    iteration's or block's element-wise work and reductions become a few fused kernels.
    Shapes are static (``dynamic=False``): a new batch shape or schedule compiles again."""
    return torch.compile(function, dynamic=False)


@torch.no_grad()
def entropic_ot_with_grad(
    x: torch.Tensor,
    y: torch.Tensor,
    x_weights: torch.Tensor,
    y_weights: torch.Tensor,
    temperatures: list[float],
    m: torch.Tensor,
    cost: str = "mixed",
    compile: bool = False,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_λ for B independent problems, with its gradients; λ = temperatures[-1].

    x [B,N,D], y [B,M,D], x_weights [B,N], y_weights [B,M] (each summing to 1),
    m [B] (L1 weight of the mixed cost; ignored by l2 and l1), ``temperatures`` from
    :func:`temperature_schedule`. Returns (value [B], ∇_x W [B,N,D], ∇_y W [B,M,D]).
    ``compile``: run the iterations (and the fused cost) through :func:`compiled`.
    ``fused``: the cost and its gradients by :func:`fused_cost` and
    :func:`fused_cost_gradients` instead of :func:`mixed_cost` and its autograd backward.
    Works on detached inputs; the results carry no autograd history.
    """
    cost_of, gradients_of, iterate = fused_cost, fused_cost_gradients, sinkhorn_iterations
    if compile:
        cost_of, gradients_of, iterate = map(compiled, (cost_of, gradients_of, iterate))
    if fused:
        c_xy = cost_of(x, y, m, cost)
    else:  # recorded for autograd only to use its backward kernels for the gradients
        with torch.enable_grad():
            x_leaf, y_leaf = x.detach().requires_grad_(), y.detach().requires_grad_()
            cost_graph = mixed_cost(x_leaf, y_leaf, m, cost)  # [B,N,M]
        c_xy = cost_graph.detach()
    a_log, b_log = _log_weights(x_weights), _log_weights(y_weights)
    f, g = iterate(c_xy, a_log, b_log, tuple(temperatures))

    # Final extrapolation at λ: one more update of both potentials from (f, g).
    lam = temperatures[-1]
    logits_x = b_log[:, None, :] + (g[:, None, :] - c_xy) / lam  # [B,N,M], softmax over j
    logits_y = a_log[:, :, None] + (f[:, :, None] - c_xy) / lam  # [B,N,M], softmax over i
    f_final = -lam * torch.logsumexp(logits_x, dim=2)
    g_final = -lam * torch.logsumexp(logits_y, dim=1)
    value = (x_weights * f_final).sum(1) + (y_weights * g_final).sum(1)

    # ∇_{x_i} W = Σ_j α_i P_ij ∇_x C_ij and ∇_{y_j} W = Σ_i β_j Q_ij ∇_y C_ij.
    plan_x = x_weights[:, :, None] * torch.softmax(logits_x, dim=2)
    plan_y = y_weights[:, None, :] * torch.softmax(logits_y, dim=1)
    if fused:
        return value, *gradients_of(x, y, m, cost, plan_x, plan_y)
    (grad_x,) = torch.autograd.grad(cost_graph, x_leaf, plan_x, retain_graph=True)
    (grad_y,) = torch.autograd.grad(cost_graph, y_leaf, plan_y)
    return value, grad_x, grad_y
