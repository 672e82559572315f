"""Batched entropic OT with a fixed iteration schedule, returning value and gradients.

The training step's solver. It runs the same algorithm as geomloss's tensorized
``SamplesLoss("sinkhorn", p=1, debias=False, diameter=..., scaling=...)``, so its value
and gradients equal geomloss's up to floating-point rounding (tests/test_ot.py checks
this against geomloss for every cost). Two things differ, both for speed:

* the temperature schedule (geomloss's "ε-scaling": λ annealed down from the diameter)
  is built once from a data-independent diameter, so a solve is a fixed sequence of
  tensor operations: no host synchronisation, no data-dependent
  control flow, the same kernels every step (capturable in a CUDA graph);
* the gradients w.r.t. both point clouds are returned in closed form (nothing is
  recorded through the iterations, nothing reaches the caller's autograd graph), so
  the step sees ∇_X S explicitly and sanitises it
  before it enters the generator's backward pass.

Notation, per batch entry b (B independent problems):
    x [N, D] with weights α [N], y [M, D] with weights β [M] (non-negative, summing
    to 1; weight-0 rows are ignored), cost C [N, M] (:func:`mixed_cost`),
    W_λ(α, β) = <α, f> + <β, g> for the dual potentials (f, g) at the Sinkhorn
    temperature λ (the config's ``entropy_reg``; not the privacy budget ε).

Gradients (envelope theorem, as geomloss obtains them by differentiating its final
extrapolation step with the earlier potentials held fixed):
    ∇_{x_i} W = α_i Σ_j P_ij ∇_x C(x_i, y_j),   P_ij = softmax_j(log β_j + (g_j − C_ij)/λ)
    ∇_{y_j} W = β_j Σ_i Q_ij ∇_y C(x_i, y_j),   Q_ij = softmax_i(log α_i + (f_i − C_ij)/λ)
    ∇_x C = 2(x − y) + m sign(x − y)            (mixed; l2: m = 0; l1: sign(x − y) only)
The two sums are vector-Jacobian products of the cost matrix (its autograd backward:
matrix products and cdist's fused L1 kernel), the only autograd use in this module.
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
    """Cost matrix for x [B,N,D], y [B,M,D] -> [B,N,M] (no ½ anywhere).

    ``cost``: mixed ||x_i − y_j||² + m ||x_i − y_j||₁; l2 ||x_i − y_j||²; l1
    ||x_i − y_j||₁ (``m`` is ignored by l2 and l1; l2 equals mixed with m = 0).
    ``m`` is a number or a tensor [B] (one weight per batch entry, for sweeps).
    """
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
    """Symmetric log-domain Sinkhorn annealed through ``temperatures``
    (:func:`temperature_schedule`), as geomloss's ``sinkhorn_loop``.

    c_xy [B,N,M], log-weights a_log [B,N], b_log [B,M] -> potentials (f [B,N], g [B,M])
    at the last temperature, before the final extrapolation. No kernel truncation.
    """
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
def _compiled_iterations():
    """:func:`sinkhorn_iterations` through ``torch.compile`` (built once per process).

    Fuses each iteration's element-wise work and reductions: on a GPU the iterations
    become a few dozen kernels instead of ~200 (one per operation). Shapes are static
    (``dynamic=False``): a new batch shape or schedule compiles again.
    """
    return torch.compile(sinkhorn_iterations, dynamic=False)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_λ for B independent problems, with its gradients; λ = temperatures[-1].

    x [B,N,D], y [B,M,D], x_weights [B,N], y_weights [B,M] (each summing to 1),
    m [B] (L1 weight of the mixed cost; ignored by l2 and l1), ``temperatures`` from
    :func:`temperature_schedule`. Returns (value [B], ∇_x W [B,N,D], ∇_y W [B,M,D]).
    ``compile``: run the iterations through ``torch.compile`` (:func:`_compiled_iterations`).
    Works on detached inputs; the results carry no autograd history.
    """
    # The cost is recorded for autograd only to use its backward kernels for the
    # closed-form gradients at the end (a vector-Jacobian product with the plans).
    with torch.enable_grad():
        x_leaf, y_leaf = x.detach().requires_grad_(), y.detach().requires_grad_()
        cost_graph = mixed_cost(x_leaf, y_leaf, m, cost)  # [B,N,M]
    c_xy = cost_graph.detach()
    a_log, b_log = _log_weights(x_weights), _log_weights(y_weights)

    iterate = _compiled_iterations() if compile else sinkhorn_iterations
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
    (grad_x,) = torch.autograd.grad(cost_graph, x_leaf, plan_x, retain_graph=True)
    (grad_y,) = torch.autograd.grad(cost_graph, y_leaf, plan_y)
    return value, grad_x, grad_y
