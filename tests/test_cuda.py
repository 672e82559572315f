"""The training step on a CUDA device: no host synchronisation, CUDA graph replay.

Skipped without a GPU (CI has none). Run on a GPU machine with
``python -m pytest tests/test_cuda.py`` and the MNIST mirror beside the project
(or ``DPSINKHORN_DATA_MIRROR``).
"""

from __future__ import annotations

import pytest
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn import data
from dpsinkhorn.loss import (
    feature_diameter,
    semi_debiased_sinkhorn,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.train import GraphedStep, Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def mnist(prepared_mnist):
    return data.load_split(prepared_mnist, "mnist", "train")


def paper_spec(**overrides) -> dict:
    """The paper's MNIST setting (B = 50, p = 0.4, DCGAN 256/128/64), private."""
    # reproducible: runs are compared draw for draw (a public noise key from seed + name)
    spec = config_lib.make_experiment(
        "gpu", method="dp_sinkhorn", sigma=1.0, steps=100, reproducible=True
    )
    return {**spec, **overrides}


@pytest.mark.parametrize("perturbation", ["image", "parameter"])
def test_step_never_waits_for_the_host(mnist, perturbation):
    trainer = Trainer(paper_spec(perturbation=perturbation), *mnist, CUDA)
    trainer.step()  # first call: allocator and library set-up may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.device_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(
    "perturbation, precision", [("image", "fp32"), ("parameter", "fp32"), ("image", "bf16")]
)
def test_graph_replay_follows_the_eager_run(mnist, perturbation, precision):
    """Same draws (the generator's state advances identically), same parameters, same ledger."""
    steps = GraphedStep.WARMUP_STEPS + 5
    spec = paper_spec(perturbation=perturbation)
    eager = Trainer(spec, *mnist, CUDA, cuda_graphs=False, precision=precision)
    graphed = Trainer(spec, *mnist, CUDA, cuda_graphs=True, precision=precision)
    assert graphed.cuda_graphs
    eager_losses = torch.stack([eager.step() for _ in range(steps)])
    graphed_losses = torch.stack([graphed.step() for _ in range(steps)])
    assert graphed.graphed.graph is not None  # the last steps were replays
    assert graphed.step_count == graphed.accountant.steps == steps
    assert torch.equal(graphed.rng.get_state(), eager.rng.get_state())
    # Adam(capturable=True) computes its bias correction on the device: rounding only.
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=1e-4, atol=1e-4)
    for a, b in zip(graphed.model.parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_sweep_graph_replay_follows_the_eager_sweep(mnist):
    """Two runs (different p, σ, mechanism) replayed together; one finishes first."""
    from dpsinkhorn.sweep import SweepTrainer

    specs = [
        paper_spec(seed=0, p=0.2, sigma=0.8, steps=6),
        paper_spec(seed=1, p=0.6, perturbation="parameter", steps=9),
    ]
    eager = SweepTrainer(specs, *mnist, CUDA)
    graphed = SweepTrainer(specs, *mnist, CUDA, cuda_graphs=True)
    for sweep in (eager, graphed):
        for step in range(9):
            sweep.step(sweep.trainers if step < 6 else sweep.trainers[1:])
    assert [t.step_count for t in graphed.trainers] == [6, 9]
    assert [t.accountant.steps for t in graphed.trainers] == [6, 9]
    for g, e in zip(graphed.trainers, eager.trainers, strict=True):
        assert torch.equal(g.rng.get_state(), e.rng.get_state())
        for a, b in zip(g.model.parameters(), e.model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("perturbation", ["image", "parameter"])
def test_reduced_precision_step_stays_within_tolerance(mnist, precision, perturbation):
    """The bounds of tests/test_precision.py, on the device where TF32 exists."""
    from dpsinkhorn.bench import PRECISION_TOLERANCE, precision_error

    error = precision_error(paper_spec(perturbation=perturbation), *mnist, CUDA, precision)
    for key, bound in PRECISION_TOLERANCE.items():
        assert error[key] <= bound, error
    assert error["grad_rel"] > 0  # fp32 is not TF32: the two computed different gradients
    assert error["within_tolerance"]


def test_solver_in_float32_on_cuda_is_as_accurate_as_geomloss():
    """The cost's matrix product must not run in TF32 (C/λ ~ 1e4 would lose the plan)."""
    n, p, lam, diameter = 50, 0.4, 0.05, feature_diameter(784, 1.0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(70, 794, generator=g) * 2 - 1
    y = torch.rand(108, 794, generator=g) * 2 - 1
    weights = (torch.rand(108, generator=g) < 0.45).float()
    xg = x.double().requires_grad_()
    exact = semi_debiased_sinkhorn(
        xg, y.double(), n, p, lam, 1.0, y_weights=weights.double(), diameter=diameter
    )
    (exact_grad,) = torch.autograd.grad(exact, xg)
    loss, grad = semi_debiased_sinkhorn_with_grad(
        x.to(CUDA), y.to(CUDA), weights.to(CUDA), n, p, lam, 1.0, scaling=0.5, diameter=diameter
    )
    error = float((grad.cpu().double() - exact_grad).norm() / exact_grad.norm())
    assert error < 2e-4
    assert abs(float(loss) - float(exact)) <= 1e-6 * abs(float(exact))


def test_resume_on_cuda_equals_an_uninterrupted_run(mnist, tmp_path):
    """Issue 15: a checkpoint written on CUDA resumes on CUDA (its RNG state reaches
    ``Generator.set_state`` as a CPU ByteTensor), and the resumed run's generator and
    ledger equal those of an uninterrupted run (same GPU; public noise key)."""
    from dpsinkhorn.train import Preempted, train

    spec = {**paper_spec(steps=12), "checkpoint_every": 4, "log_every": 2, "channels": [16, 8, 4]}
    full = train(spec, tmp_path / "full", device="cuda", train_data=mnist, progress=False)
    with pytest.raises(Preempted):
        train(spec, tmp_path / "resumed", device="cuda", train_data=mnist, stop_after=5,
              progress=False)  # fmt: skip
    resumed = train(spec, tmp_path / "resumed", device="cuda", train_data=mnist, progress=False)
    assert resumed == full
    a = torch.load(tmp_path / "full" / "generator.pt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "resumed" / "generator.pt", weights_only=False)["state_dict"]
    for k in a:  # cuDNN may pick non-deterministic kernels: equal up to float rounding
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
