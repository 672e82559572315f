"""The fixed-schedule solver (ot) against geomloss: same values, same gradients."""

from __future__ import annotations

import pytest
import torch
from geomloss._legacy.sinkhorn_divergence import epsilon_schedule as geomloss_schedule
from oracles import (
    geomloss_entropic_ot,
    geomloss_semi_debiased_sinkhorn,
    geomloss_semi_debiased_sinkhorn_runs,
)

from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.loss import (
    semi_debiased_sinkhorn_with_grad,
    semi_debiased_sinkhorn_with_grad_runs,
)

LAMBDA, SCALING, DIAMETER = 0.05, 0.5, 20.0
F64 = torch.float64


def clouds(n: int, m: int, d: int, seed: int, dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randn(m, d, generator=g, dtype=dtype)


@pytest.mark.parametrize(
    "diameter, blur, scaling",
    [(59.88, 0.05, 0.5), (20.0, 0.05, 0.9), (3.0, 1.0, 0.5), (1.0, 1.0, 0.5)],
)
def test_temperature_schedule_is_geomloss(diameter, blur, scaling):
    assert ot.temperature_schedule(diameter, blur, scaling) == pytest.approx(
        geomloss_schedule(1, diameter, blur, scaling), rel=1e-15
    )


@pytest.mark.parametrize("bad", [(0.0, 0.05, 0.5), (1.0, 0.0, 0.5), (1.0, 0.05, 1.0)])
def test_temperature_schedule_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="scaling"):
        ot.temperature_schedule(*bad)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cost", ["mixed", "l2", "l1"])
def test_value_and_gradients_equal_geomloss(cost, fused, monkeypatch):
    """Batched problems with different m and zero-weight rows, float64: equal to 1e-12.
    ``fused``: the cost and gradients by ``ot.fused_cost`` in blocks of two rows."""
    monkeypatch.setattr(ot, "FUSED_BLOCK", 2 * 3 * 17 * 9)
    diameter = DIAMETER if cost != "l1" else 100.0
    problems = [(0.7, 0), (0.0, 1), (2.0, 2)]  # (m, seed)
    xs, ys, bs, want = [], [], [], []
    for m, seed in problems:
        x, y = clouds(12, 17, 9, seed)
        b = torch.rand(17, generator=torch.Generator().manual_seed(seed), dtype=F64)
        b[::4] = 0  # rows that were not drawn
        b = b / b.sum()
        xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
        value = geomloss_entropic_ot(
            xg, yg, LAMBDA, m, y_weights=b, scaling=SCALING, diameter=diameter, cost=cost
        )
        want.append((value.detach(), *torch.autograd.grad(value, [xg, yg])))
        xs.append(x), ys.append(y), bs.append(b)
    a = torch.full((3, 12), 1 / 12, dtype=F64)
    m = torch.tensor([m for m, _ in problems], dtype=F64)
    temperatures = ot.temperature_schedule(diameter, LAMBDA, SCALING)
    value, grad_x, grad_y = ot.entropic_ot_with_grad(
        torch.stack(xs), torch.stack(ys), a, torch.stack(bs), temperatures, m, cost, fused=fused
    )
    for k, (v, gx, gy) in enumerate(want):
        torch.testing.assert_close(value[k], v, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad_x[k], gx, rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(grad_y[k], gy, rtol=1e-10, atol=1e-14)
    assert grad_y[0, ::4].abs().max() == 0  # undrawn rows get no gradient


def test_results_carry_no_autograd_history():
    x, y = clouds(5, 6, 3, 0)
    x.requires_grad_()
    out = ot.entropic_ot_with_grad(
        x[None],
        y[None],
        torch.full((1, 5), 0.2, dtype=F64),
        torch.full((1, 6), 1 / 6, dtype=F64),
        ot.temperature_schedule(DIAMETER, LAMBDA, SCALING),
        torch.ones(1, dtype=F64),
    )
    assert not any(t.requires_grad for t in out)


def _geomloss_loss_and_grad(x, y, weights, n, p, m, cost):
    xg = x.clone().requires_grad_()
    loss = geomloss_semi_debiased_sinkhorn(
        xg, y, n, p, LAMBDA, m, y_weights=weights, scaling=SCALING, diameter=DIAMETER, cost=cost
    )
    return loss.detach(), torch.autograd.grad(loss, xg)[0]


@pytest.mark.parametrize("cost", ["mixed", "l2", "l1"])
@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_semi_debiased_loss_and_gradient_equal_geomloss(cost, p):
    """S and ∇_X S (both X[0:n] and the debiasing rows X[n':n+n']) as autograd gives them."""
    n = 10
    x, y = clouds(n + int(n * p), 23, 8, 3)
    weights = (torch.arange(23) % 3 != 0).to(F64)  # 0/1: a Poisson buffer
    want = _geomloss_loss_and_grad(x, y, weights, n, p, 1.3, cost)
    got = semi_debiased_sinkhorn_with_grad(
        x, y, weights, n, p, LAMBDA, 1.3, scaling=SCALING, diameter=DIAMETER, cost=cost
    )
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-13)


def test_empty_real_batch_has_no_data_term():
    n, p = 10, 0.4
    x, y = clouds(14, 6, 5, 4)
    empty = torch.zeros(6, dtype=F64)
    loss, grad = semi_debiased_sinkhorn_with_grad(
        x, y, empty, n, p, LAMBDA, 1.0, scaling=SCALING, diameter=DIAMETER
    )
    want = _geomloss_loss_and_grad(x, y, empty, n, p, 1.0, "mixed")
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(loss, want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want[1], rtol=1e-10, atol=1e-13)


def test_fewer_real_rows_than_n_is_padded_correctly():
    """The self term's cloud (n rows) is longer than the real buffer (3 rows)."""
    n, p = 10, 0.5
    x, y = clouds(15, 3, 5, 5)
    weights = torch.ones(3, dtype=F64)
    got = semi_debiased_sinkhorn_with_grad(
        x, y, weights, n, p, LAMBDA, 0.5, scaling=SCALING, diameter=DIAMETER
    )
    want = _geomloss_loss_and_grad(x, y, weights, n, p, 0.5, "mixed")
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-13)


def test_runs_are_independent_problems_with_their_own_m():
    """K runs in one solve equal the geomloss runs path and its gradients, run by run."""
    k, n = 3, 8
    xc, xs = (
        torch.randn(k, n, 6, dtype=F64, generator=torch.Generator().manual_seed(s)) for s in (0, 1)
    )
    y = torch.randn(k, 11, 6, dtype=F64)
    weights = (torch.rand(k, 11) < 0.6).to(F64)
    weights[1] = 0  # run 1 drew nobody
    m = torch.tensor([0.0, 1.0, 3.0], dtype=F64)
    xcg, xsg = xc.clone().requires_grad_(), xs.clone().requires_grad_()
    want = geomloss_semi_debiased_sinkhorn_runs(
        xcg, xsg, y, weights, LAMBDA, m, scaling=SCALING, diameter=DIAMETER
    )
    want_grads = torch.autograd.grad(want.sum(), [xcg, xsg])
    loss, grad_cross, grad_self = semi_debiased_sinkhorn_with_grad_runs(
        xc, xs, y, weights, LAMBDA, m, scaling=SCALING, diameter=DIAMETER
    )
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_cross, want_grads[0], rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(grad_self, want_grads[1], rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("fused", [False, True])
def test_float32_is_as_accurate_as_geomloss_at_the_paper_scale(fused):
    """MNIST-sized features (784 pixels + 10 classes), paper's λ, B and n', float32.

    At λ = 0.05 the costs are ~1e3, so C/λ ~ 1e4 and float32 rounding alone moves the
    plan by ~1e-3: two float32 solvers cannot agree to float32 precision. The
    yardstick is float64 geomloss: ours in float32 must be as close to it as
    geomloss in float32 is.
    """
    from dpsinkhorn.ot.loss import feature_diameter

    n, p, diameter = 50, 0.4, feature_diameter(784, 1.0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(70, 794, generator=g) * 2 - 1
    y = torch.rand(108, 794, generator=g) * 2 - 1
    weights = (torch.rand(108, generator=g) < 0.45).float()

    def geomloss(dtype):
        xg = x.to(dtype).requires_grad_()
        loss = geomloss_semi_debiased_sinkhorn(
            xg,
            y.to(dtype),
            n,
            p,
            LAMBDA,
            1.0,
            y_weights=weights.to(dtype),
            scaling=SCALING,
            diameter=diameter,
        )
        return loss.detach(), torch.autograd.grad(loss, xg)[0]

    exact_loss, exact_grad = geomloss(F64)
    geo_loss, geo_grad = geomloss(torch.float32)
    loss, grad = semi_debiased_sinkhorn_with_grad(
        x, y, weights, n, p, LAMBDA, 1.0, scaling=SCALING, diameter=diameter, fused_cost=fused
    )

    def error(g: torch.Tensor) -> float:
        return float((g.double() - exact_grad).norm() / exact_grad.norm())

    assert error(grad) <= max(1.5 * error(geo_grad), 1e-6)
    assert error(grad) < 2e-4
    assert abs(float(loss) - float(exact_loss)) <= 1e-6 * float(exact_loss)


def test_compiled_solver_trains_like_the_eager_one(prepared_mnist):
    """``compile_solver``: torch.compile'd iterations, same losses and parameters to rounding."""
    from dpsinkhorn import config as config_lib
    from dpsinkhorn.data import datasets as data
    from dpsinkhorn.train.trainer import StepOptions, Trainer

    spec = config_lib.make_experiment(
        "c", channels=[16, 8, 4], sigma=1.0, steps=10, reproducible=True
    )  # two trainers compared draw for draw: a public noise key
    records = data.load_split(prepared_mnist, "mnist", "train")
    eager = Trainer(spec, *records, torch.device("cpu"))
    compiled = Trainer(spec, *records, torch.device("cpu"), StepOptions(compile_solver=True))
    for _ in range(3):
        torch.testing.assert_close(compiled.step(), eager.step(), rtol=1e-5, atol=0)
    for a, b in zip(compiled.model.parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
