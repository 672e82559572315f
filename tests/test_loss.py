"""Entropic OT against an independent solver (POT, float64), the semi-debiased identity, and
the training solver's handling of the Poisson buffer's padding rows."""

from __future__ import annotations

import gzip

import numpy as np
import ot
import pytest
import torch
from oracles import geomloss_entropic_ot, geomloss_semi_debiased_sinkhorn

from dpsinkhorn.ot.loss import (
    conditional_features,
    debias_size,
    feature_diameter,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.ot.solver import mixed_cost

LAMBDA = 0.05


def _points(n: int, d: int, seed: int, scale: float = 0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, d, generator=g, dtype=torch.float64)


def _pot_entropic_ot(x: torch.Tensor, y: torch.Tensor, lam: float, m: float):
    """<C,P> + λ KL(P | a⊗b) and the plan P from POT's log-domain Sinkhorn (float64)."""
    xn, yn = x.numpy(), y.numpy()
    cost = ot.dist(xn, yn, metric="sqeuclidean") + m * ot.dist(xn, yn, metric="cityblock")
    a, b = ot.unif(len(xn)), ot.unif(len(yn))
    plan = ot.sinkhorn(a, b, cost, lam, method="sinkhorn_log", numItermax=200000, stopThr=1e-13)
    positive = plan > 0
    kl = np.sum(plan[positive] * np.log(plan[positive] / np.outer(a, b)[positive]))
    return float(np.sum(cost * plan) + lam * kl), plan


@pytest.mark.parametrize("m", [0.0, 1.0, 3.0])
def test_entropic_ot_matches_pot_value_and_gradient(m):
    x, y = _points(12, 5, 0), _points(9, 5, 1) + 0.2
    value_pot, plan = _pot_entropic_ot(x, y, LAMBDA, m)
    xg = x.clone().requires_grad_(True)
    value = geomloss_entropic_ot(xg, y, LAMBDA, m, scaling=0.999)  # slow annealing: converged
    value.backward()
    assert value.item() == pytest.approx(value_pot, rel=1e-5)
    # Envelope theorem: dW/dx_i = sum_j P_ij dC(x_i, y_j)/dx_i.
    diff = x[:, None, :] - y[None, :, :]
    dcost = 2 * diff + m * torch.sign(diff)
    grad_pot = (torch.as_tensor(plan)[:, :, None] * dcost).sum(1)
    assert ((xg.grad - grad_pot).norm() / grad_pot.norm()).item() < 1e-2


def test_default_schedule_approximates_the_optimum():
    """geomloss's default ε-scaling (0.5, what the paper ran) stops annealing early: its value
    undershoots W_λ by a few percent here; the error shrinks as the annealing slows. The
    docs/PAPER.md's loss section gives the measured value and gradient gaps."""
    x, y = _points(20, 6, 2), _points(15, 6, 3)
    value_pot, _ = _pot_entropic_ot(x, y, LAMBDA, 1.0)
    errors = [
        abs(geomloss_entropic_ot(x, y, LAMBDA, 1.0, scaling=s).item() / value_pot - 1)
        for s in (0.5, 0.9, 0.99)
    ]
    assert errors[0] < 0.05
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4


def test_mixed_cost_has_no_half_factor():
    x = torch.tensor([[[0.0, 0.0]]])
    y = torch.tensor([[[1.0, 2.0]]])
    assert mixed_cost(x, y, m=0).item() == pytest.approx(5.0)  # ||x-y||², not ½||x-y||²
    assert mixed_cost(x, y, m=2).item() == pytest.approx(5.0 + 2 * 3.0)


def test_l2_and_l1_costs_equal_direct_computation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 5, generator=g, dtype=torch.float64)
    y = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    diff = x[:, :, None, :] - y[:, None, :, :]
    l2 = (diff**2).sum(-1)
    l1 = diff.abs().sum(-1)
    torch.testing.assert_close(mixed_cost(x, y, m=3.0, cost="l2"), l2)  # m ignored
    torch.testing.assert_close(mixed_cost(x, y, m=3.0, cost="l1"), l1)  # m ignored
    torch.testing.assert_close(mixed_cost(x, y, m=3.0), l2 + 3.0 * l1)
    torch.testing.assert_close(mixed_cost(x, y, m=0.0), mixed_cost(x, y, m=5.0, cost="l2"))
    with pytest.raises(ValueError, match="cost must be one of"):
        mixed_cost(x, y, 1.0, cost="l3")


def test_l2_cost_is_mixed_with_m0_and_l1_matches_pot():
    x, y = _points(12, 5, 0), _points(9, 5, 1) + 0.2
    l2 = geomloss_entropic_ot(x, y, LAMBDA, 2.0, cost="l2")
    assert l2.item() == geomloss_entropic_ot(x, y, LAMBDA, 0.0).item()
    assert l2.item() == pytest.approx(_pot_entropic_ot(x, y, LAMBDA, 0.0)[0], rel=1e-2)
    # l1 alone against POT's log-domain Sinkhorn on the cityblock cost
    xn, yn = x.numpy(), y.numpy()
    cost = ot.dist(xn, yn, metric="cityblock")
    a, b = ot.unif(len(xn)), ot.unif(len(yn))
    plan = ot.sinkhorn(a, b, cost, LAMBDA, method="sinkhorn_log", numItermax=200000, stopThr=1e-13)
    kl = np.sum(plan * np.log(plan / np.outer(a, b)))
    expected = float(np.sum(cost * plan) + LAMBDA * kl)
    value = geomloss_entropic_ot(x, y, LAMBDA, 2.0, cost="l1", scaling=0.999)
    assert value.item() == pytest.approx(expected, rel=1e-5)
    # the same cost through the semi-debiased loss
    n, p = 8, 0.5
    xs = _points(n + debias_size(n, p), 5, 2)
    got = geomloss_semi_debiased_sinkhorn(xs, y, n, p, LAMBDA, 2.0, cost="l1")
    want = 2 * geomloss_entropic_ot(xs[:n], y, LAMBDA, 0.0, cost="l1") - geomloss_entropic_ot(
        xs[:n], xs[debias_size(n, p) :], LAMBDA, 0.0, cost="l1"
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_training_solver_ignores_zero_weight_rows():
    """The Poisson buffer's padding rows (weight 0) do not change S or ∇_X S as the training
    solver computes them (``semi_debiased_sinkhorn_with_grad``); the same row with weight 1
    does, so the test sees the weights."""
    n, p = 10, 0.4
    x = _points(n + debias_size(n, p), 4, 4)
    real, far = _points(7, 4, 5), 100 + _points(3, 4, 6)
    pad = torch.cat([real, far])
    solve = {"scaling": 0.5, "diameter": float(torch.cdist(x, torch.cat([x, pad])).max())}

    def loss_and_grad(y: torch.Tensor, weights: list[float]):
        w = torch.tensor(weights, dtype=x.dtype)
        return semi_debiased_sinkhorn_with_grad(x, y, w, n, p, LAMBDA, 1.0, **solve)

    value, grad = loss_and_grad(real, [1.0] * 7)
    padded_value, padded_grad = loss_and_grad(pad, [1.0] * 7 + [0.0] * 3)
    assert padded_value.item() == pytest.approx(value.item(), rel=1e-9)
    torch.testing.assert_close(padded_grad, grad, rtol=1e-9, atol=1e-12)
    one_more, _ = loss_and_grad(pad, [1.0] * 8 + [0.0] * 2)
    assert one_more.item() != pytest.approx(value.item(), rel=1e-3)


def test_geomloss_path_ignores_zero_weight_rows():
    """The same for ``geomloss_entropic_ot`` (the reference path the solver is checked against)."""
    x, y = _points(10, 4, 4), _points(7, 4, 5)
    pad = torch.cat([y, 100 + _points(3, 4, 6)])
    weights = torch.tensor([1 / 7] * 7 + [0.0] * 3, dtype=torch.float64)
    a = geomloss_entropic_ot(x, y, LAMBDA, 1.0, diameter=10.0)
    b = geomloss_entropic_ot(x, pad, LAMBDA, 1.0, y_weights=weights, diameter=10.0)
    assert b.item() == pytest.approx(a.item(), rel=1e-9)


def test_debias_size():
    assert [debias_size(50, p) for p in (0, 0.2, 0.4, 1)] == [0, 10, 20, 50]
    assert debias_size(7, 0.5) == 3  # floor
    with pytest.raises(ValueError, match="p must be in"):
        debias_size(10, 1.5)


@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_semi_debiased_identity(p):
    n = 10
    n_prime = debias_size(n, p)
    x, y = _points(n + n_prime, 4, 7), _points(8, 4, 8)
    expected = 2 * geomloss_entropic_ot(x[:n], y, LAMBDA, 1.0) - geomloss_entropic_ot(
        x[:n], x[n_prime : n + n_prime], LAMBDA, 1.0
    )
    got = geomloss_semi_debiased_sinkhorn(x, y, n, p, LAMBDA, 1.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)


def test_p0_is_biased_and_p1_fully_debiased():
    n = 10
    x, y = _points(2 * n, 4, 9), _points(8, 4, 10)
    biased = 2 * geomloss_entropic_ot(x[:n], y, LAMBDA, 1.0) - geomloss_entropic_ot(
        x[:n], x[:n], LAMBDA, 1.0
    )
    assert geomloss_semi_debiased_sinkhorn(x[:n], y, n, 0.0, LAMBDA, 1.0).item() == pytest.approx(
        biased.item(), rel=1e-12
    )
    debiased = 2 * geomloss_entropic_ot(x[:n], y, LAMBDA, 1.0) - geomloss_entropic_ot(
        x[:n], x[n:], LAMBDA, 1.0
    )
    assert geomloss_semi_debiased_sinkhorn(x, y, n, 1.0, LAMBDA, 1.0).item() == pytest.approx(
        debiased.item(), rel=1e-12
    )


def test_debiasing_rows_do_not_depend_on_real_data():
    n, p = 10, 0.4
    x = _points(n + debias_size(n, p), 4, 11).requires_grad_(True)
    grads = []
    for seed in (12, 13):
        x.grad = None
        geomloss_semi_debiased_sinkhorn(x, _points(9, 4, seed), n, p, LAMBDA, 1.0).backward()
        grads.append(x.grad.clone())
    assert torch.equal(grads[0][n:], grads[1][n:])  # rows n:n+n' never see Y
    assert not torch.allclose(grads[0][:n], grads[1][:n])  # rows 0:n do


def test_empty_real_batch_contributes_no_gradient():
    n, p = 10, 0.4
    x = _points(n + debias_size(n, p), 4, 14).requires_grad_(True)
    y = _points(6, 4, 15)
    loss = geomloss_semi_debiased_sinkhorn(
        x, y, n, p, LAMBDA, 1.0, y_weights=torch.zeros(6, dtype=x.dtype)
    )
    loss.backward()
    grad_empty = x.grad.clone()
    x.grad = None
    self_only = -geomloss_entropic_ot(x[:n], x[debias_size(n, p) :], LAMBDA, 1.0)
    self_only.backward()
    assert torch.isfinite(grad_empty).all()
    assert loss.item() == pytest.approx(self_only.item(), rel=1e-12)
    torch.testing.assert_close(grad_empty, x.grad)


def test_conditional_features_and_diameter_bound():
    images = torch.rand(5, 1, 28, 28) * 2 - 1
    labels = torch.tensor([0, 3, 9, 3, 1])
    feats = conditional_features(images, labels, 10, 15.0)
    assert feats.shape == (5, 784 + 10)
    assert torch.equal(feats[:, 784:].argmax(1), labels)
    assert feats[:, 784:].max() == 15.0
    worst = conditional_features(-torch.ones(1, 1, 28, 28), torch.tensor([0]), 10, 15.0)
    other = conditional_features(torch.ones(1, 1, 28, 28), torch.tensor([1]), 10, 15.0)
    assert (worst - other).norm().item() == pytest.approx(feature_diameter(784, 15.0))
    assert feature_diameter(784, 15.0, "l2") == feature_diameter(784, 15.0, "mixed")
    # l1: the L1 diameter, also the largest value of the l1 cost
    l1 = feature_diameter(784, 15.0, "l1")
    assert (worst - other).abs().sum().item() == pytest.approx(l1) == 2 * 784 + 2 * 15.0
    assert mixed_cost(worst[None], other[None], 0.0, cost="l1").item() == pytest.approx(l1)


def _mnist_features(mirror, start: int, num: int) -> torch.Tensor:
    """Real MNIST test images start..start+num as features [num, 794] (float64, α_c 15)."""
    raw = mirror / "MNIST" / "raw"
    with gzip.open(raw / "t10k-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    pixels = torch.from_numpy(images[start : start + num].copy()).double() / 127.5 - 1
    return conditional_features(pixels, torch.as_tensor(labels[start : start + num]), 10, 15.0)


@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_loss_against_geomloss_at_our_diameter_and_at_its_own_estimate(data_mirror, p):
    """On real MNIST features (X: 50 + n' test images, Y: 50 others; the paper's cost,
    λ, α_c and scaling 0.5, float64), the training path equals geomloss's SamplesLoss
    given the same diameter (1e-10). Against SamplesLoss with its own, data-dependent
    diameter estimate (the official code's setting) the gap is that of a schedule which
    stops early: within 1% in S and 20% in ∇_X S (docs/PAPER.md: measured on 60 real
    batches, S 0.06-0.53%, ∇_X S 0.09-11%; this batch ~14%)."""
    n = 50
    rows = n + debias_size(n, p)
    x = _mnist_features(data_mirror, 0, rows).requires_grad_()
    y = _mnist_features(data_mirror, 1000, n)
    diameter = feature_diameter(784, 15.0)
    ours, our_grad = semi_debiased_sinkhorn_with_grad(
        x.detach(),
        y,
        torch.ones(n, dtype=y.dtype),
        n,
        p,
        LAMBDA,
        1.0,
        scaling=0.5,
        diameter=diameter,
    )
    for given, s_tol, grad_tol in ((diameter, 1e-10, 1e-10), (None, 1e-2, 0.2)):
        ref = geomloss_semi_debiased_sinkhorn(x, y, n, p, LAMBDA, 1.0, diameter=given)
        (ref_grad,) = torch.autograd.grad(ref, x)
        assert abs(ours.item() - ref.item()) <= s_tol * abs(ref.item()), given
        assert (our_grad - ref_grad).norm() <= grad_tol * ref_grad.norm(), given
