"""The image-gradient mechanism (clip, noise, sensitivity) and the accountant, numerically."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import norm

from dpsinkhorn.cli import main
from dpsinkhorn.config import load_config, make_experiment
from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.ot.loss import semi_debiased_sinkhorn_with_grad
from dpsinkhorn.privacy.accounting import (
    PLD_MIN_NOISE_MULTIPLIER,
    PrivacyAccountant,
    compute_epsilon,
    paper_convention_epsilon,
)
from dpsinkhorn.privacy.budget import (
    _bisect_noise,
    budget_of,
    privacy_report,
    resolve_budget,
    solve_noise_multiplier,
)
from dpsinkhorn.privacy.mechanism import (
    ImageGradientSanitizer,
    ParameterGradientSanitizer,
    noise_multiplier,
)
from dpsinkhorn.train.step import sanitize

N, N_PRIME, CLIP, SIGMA = 50, 20, 0.5, 1.5


def _grad(rows: int = N + N_PRIME, scale: float = 10.0, seed: int = 0) -> torch.Tensor:
    return scale * torch.randn(rows, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def _noise_free(sanitizer: ImageGradientSanitizer, grad: torch.Tensor) -> torch.Tensor:
    """Sanitised gradient minus the exact noise it drew (replayed from the same seed)."""
    sanitizer.generator = torch.Generator().manual_seed(1)
    out = sanitizer(grad)
    replay = torch.randn(grad[:N].shape, generator=torch.Generator().manual_seed(1))
    out[:N] -= sanitizer.noise_std * replay
    return out


def test_batch_clipping_bounds_each_block_as_one_vector():
    s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, "batch")
    clipped = _noise_free(s, _grad())
    assert clipped[:N].norm().item() == pytest.approx(CLIP, rel=1e-5)
    assert clipped[N:].norm().item() == pytest.approx(CLIP, rel=1e-5)
    small = _grad(scale=1e-4)  # below the bound: unchanged
    torch.testing.assert_close(_noise_free(s, small), small)


def test_per_sample_clipping_bounds_each_row():
    s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, "per_sample")
    row_norms = _noise_free(s, _grad()).flatten(1).norm(dim=1)
    assert torch.all(row_norms <= CLIP * (1 + 1e-5))
    assert row_norms.min().item() == pytest.approx(CLIP, rel=1e-5)


@pytest.mark.parametrize("clipping", ["batch", "per_sample"])
def test_noise_std_is_two_clip_sigma_and_only_on_private_rows(clipping):
    s = ImageGradientSanitizer(400, 100, CLIP, SIGMA, clipping, torch.Generator().manual_seed(0))
    out = s(torch.zeros(500, 1, 28, 28))
    assert s.noise_std == 2 * CLIP * SIGMA
    assert out[:400].std().item() == pytest.approx(2 * CLIP * SIGMA, rel=0.01)
    assert out[:400].mean().item() == pytest.approx(0.0, abs=0.01)
    assert torch.count_nonzero(out[400:]) == 0  # debiasing rows: no noise


def test_a_sweep_sanitises_each_run_with_its_own_mechanism():
    """``train.step.sanitize``: run k's rows of the padded stack go through run k's own
    sanitiser (its n', Δ, σ, clipping and generator), bit for bit as a single run's
    would; runs without an image mechanism pass unchanged; padding stays zero."""
    specs = [  # (n', clip, sigma, clipping), "parameter", or None (non-private)
        (20, 0.5, 1.5, "batch"),
        (5, 0.2, 0.8, "per_sample"),
        None,
        (0, 1.0, 2.0, "batch"),
        "parameter",
        (30, 0.5, 1.0, "per_sample"),
    ]
    rows = N + 30
    grads = torch.zeros(len(specs), rows, 1, 28, 28)

    def run(k: int) -> SimpleNamespace:
        spec = specs[k]
        generator = torch.Generator().manual_seed(k)
        if spec is None or spec == "parameter":
            sanitizer = None if spec is None else ParameterGradientSanitizer(CLIP, SIGMA, generator)
            return SimpleNamespace(n=N, n_prime=10, sanitizer=sanitizer)
        n_prime, clip, sigma, clipping = spec
        sanitizer = ImageGradientSanitizer(N, n_prime, clip, sigma, clipping, generator)
        return SimpleNamespace(n=N, n_prime=n_prime, sanitizer=sanitizer)

    singles = [run(k) for k in range(len(specs))]
    stacked = [run(k) for k in range(len(specs))]
    for k, r in enumerate(stacked):
        used = N + r.n_prime
        grads[k, :used] = _grad(used, scale=10.0 ** (k - 2), seed=k)
    out = sanitize(stacked, grads)
    for k, r in enumerate(singles):
        used = N + r.n_prime
        if not isinstance(r.sanitizer, ImageGradientSanitizer):
            assert torch.equal(out[k], grads[k])
            continue
        assert torch.equal(out[k, :used], r.sanitizer(grads[k, :used]))
        assert not torch.equal(out[k, :N], grads[k, :N])  # noised
        assert torch.count_nonzero(out[k, used:]) == 0
        # Both drew the same noise: the generators advanced alike.
        assert torch.equal(
            r.sanitizer.generator.get_state(), stacked[k].sanitizer.generator.get_state()
        )


def test_noise_multiplier_and_sensitivity():
    batch = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, "batch")
    per_sample = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, "per_sample")
    assert batch.sensitivity == 2 * CLIP and batch.noise_multiplier == SIGMA
    assert per_sample.sensitivity == pytest.approx(2 * CLIP * math.sqrt(N))
    assert per_sample.noise_multiplier == pytest.approx(SIGMA / math.sqrt(N))
    for s in (batch, per_sample):  # multiplier = noise std / sensitivity
        assert s.noise_multiplier == pytest.approx(s.noise_std / s.sensitivity)


def _neighbouring_gradients(x: torch.Tensor, trials: int, seed: int):
    """∇_X S for real batches D and D ∪ {one record}, by the training solver
    (``semi_debiased_sinkhorn_with_grad``: fixed schedule, Poisson buffer with 0/1 weights;
    the added record is a buffer row whose weight goes from 0 to 1). Yields the pairs."""
    g = torch.Generator().manual_seed(seed)
    real = torch.randn(40, x.shape[1], generator=g, dtype=x.dtype)
    for _ in range(trials):
        buffer = torch.cat([real, 3 * torch.randn(1, x.shape[1], generator=g, dtype=x.dtype)])
        points = torch.cat([x, buffer])
        diameter = float(torch.cdist(points, points).max())
        pair = []
        for added in (0.0, 1.0):
            weights = torch.cat([torch.ones(40, dtype=x.dtype), torch.tensor([added])])
            _, grad = semi_debiased_sinkhorn_with_grad(
                x, buffer, weights, N, 0.4, 0.05, 1.0, scaling=0.5, diameter=diameter
            )
            pair.append(grad)
        yield pair


def test_sensitivity_holds_for_neighbouring_real_batches():
    """Adding one real record moves the clipped block G[0:n] by at most 2Δ (the training
    solver's gradient); unclipped it moves by more, so the clipping is what bounds it."""
    x = 0.3 * torch.randn(N + N_PRIME, 30, generator=torch.Generator().manual_seed(3))
    s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA)
    clipped, raw = 0.0, 0.0
    for grads in _neighbouring_gradients(x, trials=10, seed=4):
        blocks = [_noise_free(s, grad)[:N] for grad in grads]
        clipped = max(clipped, (blocks[0] - blocks[1]).norm().item())
        raw = max(raw, (grads[0][:N] - grads[1][:N]).norm().item())
    assert 0 < clipped <= 2 * CLIP * (1 + 1e-6)
    assert raw > 2 * CLIP  # without clipping the bound would not hold


def _with_non_finite(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` with a NaN row, an inf entry and a -inf entry in the private block and
    a NaN entry in the debiasing rows: what a diverged solver or generator returns."""
    bad = grad.clone()
    bad[3] = float("nan")
    bad[7, 0, 5, 5] = float("inf")
    bad[11, 0, 0, 1] = float("-inf")
    bad[N + 2, 0, 1, 1] = float("nan")
    return bad


def _zeroed(bad: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(bad), bad, torch.zeros_like(bad))


@pytest.mark.parametrize("scale", [10.0, 1e-4])  # clipped, and below the bound
def test_non_finite_gradient_is_clipped_to_delta_and_the_release_is_finite(scale):
    """NaN / inf entries count as 0 before the norm: the clipped block has norm <= Δ
    (the sensitivity bound holds for every input) and the release is finite."""
    bad = _with_non_finite(_grad(scale=scale))
    for clipping in ("batch", "per_sample"):
        s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, clipping)
        expected = _noise_free(s, _zeroed(bad))  # the same entries, finite from the start
        clipped = _noise_free(s, bad)
        assert torch.isfinite(clipped).all()
        torch.testing.assert_close(clipped, expected)
        if clipping == "batch":
            norms = torch.stack([clipped[:N].norm(), clipped[N:].norm()])
        else:
            norms = clipped.flatten(1).norm(dim=1)
            assert norms[3].item() == 0.0  # the NaN row carries nothing
        assert torch.all(norms <= CLIP * (1 + 1e-5)), norms
        if scale > 1:
            assert norms.max().item() == pytest.approx(CLIP, rel=1e-5)
        s.generator = torch.Generator().manual_seed(3)
        assert torch.isfinite(s(bad)).all()  # the release itself
    # and on the training path (train.step.sanitize, one run)
    s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, "batch", torch.Generator().manual_seed(0))
    run = SimpleNamespace(n=N, n_prime=N_PRIME, sanitizer=s)
    assert torch.isfinite(sanitize([run], bad[None])).all()


def test_overflowing_norm_clips_to_zero_not_nan():
    """Finite entries whose squared norm overflows (inf norm): the block goes to 0."""
    for clipping in ("batch", "per_sample"):
        s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, clipping)
        clipped = _noise_free(s, torch.full((N + N_PRIME, 1, 28, 28), 1e30))
        assert torch.count_nonzero(clipped) == 0


def test_parameter_sanitizer_non_finite_gradient_is_clipped_to_delta():
    s = ParameterGradientSanitizer(CLIP, SIGMA)
    large = 10.0 * torch.randn(5000, generator=torch.Generator().manual_seed(0))
    bad = large.clone()
    bad[:10] = float("nan")
    bad[10] = float("inf")
    bad[11] = float("-inf")
    clipped = _param_noise_free(s, bad)
    assert torch.isfinite(clipped).all()
    assert clipped.norm().item() == pytest.approx(CLIP, rel=1e-5)
    torch.testing.assert_close(clipped, _param_noise_free(s, _zeroed(bad)))
    # through apply(): a NaN in one parameter's .grad leaves every released .grad finite
    model = torch.nn.Linear(6, 5)
    model(torch.randn(8, 6)).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    model.bias.grad[1] = float("inf")
    ParameterGradientSanitizer(CLIP, SIGMA, torch.Generator().manual_seed(2)).apply(
        model.parameters()
    )
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_empty_batch_still_gets_noise():
    s = ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA, generator=torch.Generator().manual_seed(0))
    out = s(torch.zeros(N + N_PRIME, 1, 28, 28))
    assert out[:N].abs().sum() > 0


def test_sanitizer_rejects_wrong_batch():
    with pytest.raises(ValueError, match="expected 70 rows"):
        ImageGradientSanitizer(N, N_PRIME, CLIP, SIGMA)(torch.zeros(60, 4))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_sigma_must_be_positive(bad):
    with pytest.raises(ValueError, match="sigma must be a positive number"):
        noise_multiplier(bad, 50)


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5])
def test_sampling_rate_must_be_in_unit_interval(q):
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\]"):
        compute_epsilon(1.0, q, 10, 1e-5)


# --- parameter-gradient baseline (Table 2) -----------------------------------


def _param_noise_free(sanitizer: ParameterGradientSanitizer, grad: torch.Tensor) -> torch.Tensor:
    """Sanitised vector minus the exact noise it drew (replayed from the same seed)."""
    sanitizer.generator = torch.Generator().manual_seed(5)
    out = sanitizer(grad)
    replay = torch.randn(grad.shape, generator=torch.Generator().manual_seed(5))
    return out - sanitizer.noise_std * replay


def test_parameter_sanitizer_clips_the_whole_vector_to_delta():
    s = ParameterGradientSanitizer(CLIP, SIGMA)
    large = 10.0 * torch.randn(5000, generator=torch.Generator().manual_seed(0))
    clipped = _param_noise_free(s, large)
    assert clipped.norm().item() == pytest.approx(CLIP, rel=1e-5)
    torch.testing.assert_close(clipped, large * (CLIP / large.norm()))  # direction kept
    small = 1e-4 * torch.randn(5000, generator=torch.Generator().manual_seed(1))
    assert small.norm().item() < CLIP
    torch.testing.assert_close(_param_noise_free(s, small), small)  # below Δ: untouched


def test_parameter_sanitizer_noise_std_and_multiplier():
    s = ParameterGradientSanitizer(CLIP, SIGMA, torch.Generator().manual_seed(0))
    out = s(torch.zeros(200_000))
    assert s.noise_std == 2 * CLIP * SIGMA
    assert out.std().item() == pytest.approx(2 * CLIP * SIGMA, rel=0.01)
    assert out.mean().item() == pytest.approx(0.0, abs=0.01)
    assert s.sensitivity == 2 * CLIP and s.noise_multiplier == SIGMA
    assert s.noise_multiplier == pytest.approx(s.noise_std / s.sensitivity)
    assert s.clipping == "batch"
    with pytest.raises(ValueError, match="flat gradient vector"):
        s(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="sigma must be a positive number"):
        ParameterGradientSanitizer(CLIP, 0.0)


def test_parameter_sanitizer_applies_to_all_parameters_as_one_vector():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model(torch.randn(8, 6)).pow(2).sum().mul(100).backward()
    before = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert before.norm() > CLIP  # so clipping acts on the concatenation
    expected = ParameterGradientSanitizer(CLIP, SIGMA, torch.Generator().manual_seed(2))(before)
    s = ParameterGradientSanitizer(CLIP, SIGMA, torch.Generator().manual_seed(2))
    s.apply(model.parameters())
    after = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(after, expected)
    # each parameter scaled by the same factor: per-parameter clipping would differ
    noise_free = after - (expected - _param_noise_free(s, before))
    ratios = noise_free / before
    torch.testing.assert_close(ratios, torch.full_like(ratios, CLIP / before.norm().item()))


def test_parameter_sanitizer_sensitivity_for_neighbouring_batches():
    """The clipped parameter gradients of neighbouring real batches differ by at most 2Δ
    (∇_X S from the training solver, backpropagated through the generator as training
    does); unclipped they differ by more."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 30)
    z = torch.randn(N + N_PRIME, 8, generator=torch.Generator().manual_seed(3))
    out = model(z)
    s = ParameterGradientSanitizer(CLIP, SIGMA)
    clipped, raw = 0.0, 0.0
    for grads in _neighbouring_gradients(out.detach(), trials=5, seed=4):
        flats = []
        for grad in grads:
            model.zero_grad()
            model(z).backward(grad)
            flats.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        kept = [_param_noise_free(s, flat) for flat in flats]
        clipped = max(clipped, (kept[0] - kept[1]).norm().item())
        raw = max(raw, (flats[0] - flats[1]).norm().item())
    assert 0 < clipped <= 2 * CLIP * (1 + 1e-5)
    assert raw > 2 * CLIP  # without clipping the bound would not hold


# --- accountant ------------------------------------------------------------


def _gaussian_delta(eps: float, mu: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/std = mu (Balle & Wang 2018)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_pld_matches_exact_gaussian_composition_without_subsampling():
    """q = 1: T Gaussian steps with multiplier z are one Gaussian with multiplier z/√T."""
    z, steps, delta = 2.0, 16, 1e-5
    eps = compute_epsilon(z, 1.0, steps, delta, accountant="pld")
    assert _gaussian_delta(eps, math.sqrt(steps) / z) == pytest.approx(delta, rel=0.05)
    eps_rdp = compute_epsilon(z, 1.0, steps, delta, accountant="rdp")
    assert eps < eps_rdp < 1.3 * eps  # RDP is an upper bound, and not a loose one


@pytest.mark.parametrize("order", [2, 3, 8])
def test_rdp_of_subsampled_gaussian_matches_numerical_integration(order):
    """A_α = E_{x~N(0,z²)}[((1−q) + q·N(1,z²)(x)/N(0,z²)(x))^α]; RDP = log(A_α)/(α−1)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    q, z = 0.05, 1.2

    def integrand(x: float) -> float:
        ratio = math.exp((2 * x - 1) / (2 * z * z))
        return norm.pdf(x, scale=z) * ((1 - q) + q * ratio) ** order

    a_alpha, _ = integrate.quad(integrand, -40 * z, 40 * z, epsabs=1e-13, epsrel=1e-12, limit=200)
    expected = math.log(a_alpha) / (order - 1)
    got = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, z, np.array([order]))[0]
    assert got == pytest.approx(expected, rel=1e-6)


def test_paper_convention_reproduces_the_papers_epsilon():
    """Appendix D.4: ε = 10 at δ = 1e-5 after ~160k (MNIST, σ 1.5) / ~280k (FMNIST, σ 1.9) steps."""
    q = 50 / 60000
    assert paper_convention_epsilon(q, 1.5, 160_000, 50, 1e-5) == pytest.approx(10.0, abs=0.1)
    assert paper_convention_epsilon(q, 1.9, 280_000, 50, 1e-5) == pytest.approx(10.0, abs=0.1)


def test_sound_epsilon_of_the_paper_setting():
    eps = compute_epsilon(1.5, 50 / 60000, 160_000, 1e-5)
    assert 0.9 < eps < 1.1  # the mechanism as specified spends ≈ 1.0, not 10


def test_most_steps_and_solved_sigma_are_tight():
    q, delta = 50 / 60000, 1e-5
    _, steps = resolve_budget(  # clipping batch: noise multiplier = sigma
        sigma=1.5, steps=None, target_epsilon=2.0, q=q, batch_size=50, delta=delta
    )
    assert compute_epsilon(1.5, q, steps, delta) <= 2.0 < compute_epsilon(1.5, q, steps + 1, delta)
    z = solve_noise_multiplier(10.0, q, 160_000, delta)
    assert compute_epsilon(z, q, 160_000, delta) <= 10.0
    assert compute_epsilon(z * 0.999, q, 160_000, delta) > 10.0


def test_unreachable_target_is_an_error():
    with pytest.raises(ValueError, match="unreachable"):
        resolve_budget(sigma=0.5, steps=None, target_epsilon=1e-4, q=0.5, batch_size=50, delta=1e-5)
    with pytest.raises(ValueError, match="unreachable"):
        resolve_budget(
            sigma=0.5, steps=10**6, target_epsilon=1.0, q=0.01, batch_size=50, delta=1e-5
        )


def test_resolve_budget_paper_convention_is_tight():
    """σ given, steps solved: the most steps whose paper-convention ε stays within the target."""
    q, delta, n = 50 / 60000, 1e-5, 50
    sigma, steps = resolve_budget(
        sigma=1.3,
        steps=None,
        target_epsilon=10.0,
        q=q,
        batch_size=n,
        delta=delta,
        convention="paper",
    )
    assert sigma == 1.3
    assert paper_convention_epsilon(q, 1.3, steps, n, delta) <= 10.0
    assert paper_convention_epsilon(q, 1.3, steps + 1, n, delta) > 10.0
    # far fewer steps than the sound accountant allows for the same target
    _, sound_steps = resolve_budget(
        sigma=1.3, steps=None, target_epsilon=10.0, q=q, batch_size=n, delta=delta
    )
    assert steps < sound_steps
    assert compute_epsilon(1.3, q, steps, delta) < 10.0
    # the paper's own setting: σ = 1.5 for ε = 10 runs ~160k steps (appendix D.4)
    _, paper_steps = resolve_budget(
        sigma=1.5,
        steps=None,
        target_epsilon=10.0,
        q=q,
        batch_size=n,
        delta=delta,
        convention="paper",
    )
    assert 155_000 < paper_steps < 165_000
    # steps given, σ solved: the smallest σ within the target
    sigma, _ = resolve_budget(
        sigma=None,
        steps=160_000,
        target_epsilon=10.0,
        q=q,
        batch_size=n,
        delta=delta,
        convention="paper",
    )
    assert paper_convention_epsilon(q, sigma, 160_000, n, delta) <= 10.0
    assert paper_convention_epsilon(q, sigma * 0.999, 160_000, n, delta) > 10.0
    assert sigma == pytest.approx(1.5, rel=0.01)
    with pytest.raises(ValueError, match="paper convention"):  # given both: target checked
        resolve_budget(
            sigma=1.5,
            steps=200_000,
            target_epsilon=10.0,
            q=q,
            batch_size=n,
            delta=delta,
            convention="paper",
        )
    with pytest.raises(ValueError, match="convention must be one of"):
        resolve_budget(
            sigma=1.5,
            steps=10,
            target_epsilon=None,
            q=q,
            batch_size=n,
            delta=delta,
            convention="other",
        )


def test_per_sample_budget_uses_sigma_over_sqrt_n():
    q, delta = 50 / 60000, 1e-5
    sigma, _ = resolve_budget(
        sigma=None,
        steps=1000,
        target_epsilon=5.0,
        q=q,
        batch_size=50,
        delta=delta,
        clipping="per_sample",
    )
    assert compute_epsilon(sigma / math.sqrt(50), q, 1000, delta) == pytest.approx(5.0, rel=1e-3)


def test_accountant_ledger_and_state_dict():
    acc = PrivacyAccountant(0.01, 1.0, 1e-5)
    for _ in range(30):
        acc.step()
    assert acc.steps == 30
    assert acc.epsilon() == pytest.approx(compute_epsilon(1.0, 0.01, 30, 1e-5))
    resumed = PrivacyAccountant(0.01, 1.0, 1e-5)
    resumed.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    resumed.step(20)
    assert resumed.steps == 50
    assert resumed.epsilon() == pytest.approx(compute_epsilon(1.0, 0.01, 50, 1e-5))
    resumed.noise_multiplier = 2.0  # a later segment with another mechanism is composed too
    resumed.step(10)
    assert resumed.state_dict()["segments"] == [[0.01, 1.0, 50], [0.01, 2.0, 10]]
    assert resumed.epsilon() > compute_epsilon(1.0, 0.01, 50, 1e-5)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant(0.01, 1.0, 1e-6).load_state_dict(acc.state_dict())


# --- CLI ------------------------------------------------------------------


def _run(capsys, *args: str) -> tuple[int, dict | str]:
    code = main(["privacy", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_cli_epsilon_steps_and_sigma(capsys):
    base = ["--q", str(1 / 1200), "--delta", "1e-5", "--batch-size", "50"]
    code, r = _run(capsys, *base, "--sigma", "1.5", "--steps", "160000")
    assert code == 0 and r["valid_guarantee"] and 0.9 < r["epsilon"] < 1.1
    assert {"epsilon", "steps", "sigma", "noise_multiplier"} <= r.keys()
    code, r = _run(capsys, *base, "--sigma", "1.5", "--steps", "160000", "--convention", "paper")
    assert code == 0 and not r["valid_guarantee"] and r["epsilon"] == pytest.approx(10, abs=0.1)
    code, r = _run(capsys, *base, "--steps", "160000", "--epsilon", "10")
    assert code == 0 and r["epsilon"] <= 10 and 0.5 < r["sigma"] < 0.6
    code, r = _run(capsys, *base, "--sigma", "1.5", "--epsilon", "1.0")
    assert code == 0 and r["epsilon"] <= 1.0 and 100_000 < r["steps"] < 160_000
    code, r = _run(
        capsys,
        *base,
        "--sigma",
        "1.5",
        "--steps",
        "100",
        "--accountant",
        "pld",
        "--clipping",
        "per_sample",
    )
    assert code == 0 and r["noise_multiplier"] == pytest.approx(1.5 / math.sqrt(50))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--q", "0.01", "--sigma", "0", "--steps", "10"], "sigma"),
        (["--q", "1.5", "--sigma", "1", "--steps", "10"], "q must be in"),
        (["--q", "0.5", "--sigma", "0.5", "--epsilon", "0.0001"], "unreachable"),
        (["--q", "0.01", "--sigma", "1"], "give --steps, --epsilon"),
    ],
)
def test_cli_bad_input(capsys, args, message):
    code, err = _run(capsys, *args, "--delta", "1e-5", "--batch-size", "50")
    assert code == 2 and message in err


def test_privacy_report_keys():
    r = privacy_report(q=0.01, delta=1e-5, batch_size=10, sigma=1.0, steps=10)
    assert r["noise_multiplier"] == 1.0 and r["steps"] == 10


# --- accountant and CLI input ------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        # was ZeroDivisionError
        (
            [
                "--q",
                "0.01",
                "--sigma",
                "1",
                "--steps",
                "10",
                "--batch-size",
                "0",
                "--clipping",
                "per_sample",
            ],
            "batch size must be an integer >= 1, got 0",
        ),
        # was ε = -1698.7 with exit 0
        (
            [
                "--q",
                "0.01",
                "--sigma",
                "1",
                "--steps",
                "-5",
                "--batch-size",
                "50",
                "--convention",
                "paper",
            ],
            "steps must be an integer >= 1, got -5",
        ),
        (
            ["--q", "0.01", "--sigma", "1", "--steps", "-5", "--batch-size", "50"],
            "steps must be an integer >= 1, got -5",
        ),
        (["--q", "nan", "--sigma", "1", "--steps", "5", "--batch-size", "50"], "q must be in"),
        (
            ["--q", "0.01", "--sigma", "1", "--epsilon", "nan", "--batch-size", "50"],
            "target epsilon must be a positive number, got nan",
        ),
        (
            [
                "--q",
                "0.01",
                "--sigma",
                "0.01",
                "--steps",
                "5",
                "--batch-size",
                "50",
                "--accountant",
                "pld",
            ],
            "use accountant rdp",
        ),
    ],
)
def test_cli_refuses_bad_numbers_in_one_line(capsys, args, message):
    code, err = _run(capsys, *args, "--delta", "1e-5")
    assert code == 2 and message in err and err.count("\n") == 1


def test_noise_search_never_asks_below_its_floor():
    """`--epsilon 10 --accountant pld` started its σ search at 1e-3, where the PLD
    accountant allocates tens of GiB; the search now brackets from 1 and stops at the floor."""
    asked = []

    def eps_of(z: float) -> float:  # ε falls as the noise grows, like any accountant's
        asked.append(z)
        return 2.0 / z

    z = _bisect_noise(eps_of, 10.0, floor=PLD_MIN_NOISE_MULTIPLIER)
    assert z == pytest.approx(0.2, rel=1e-4) and min(asked) >= PLD_MIN_NOISE_MULTIPLIER
    asked.clear()
    assert _bisect_noise(eps_of, 100.0, floor=PLD_MIN_NOISE_MULTIPLIER) == 0.2  # at the floor
    assert min(asked) >= PLD_MIN_NOISE_MULTIPLIER
    z = _bisect_noise(eps_of, 0.5)  # upwards
    assert z == pytest.approx(4.0, rel=1e-4)


def test_target_epsilon_nan_is_refused(tmp_path):
    with pytest.raises(ValueError, match="target epsilon must be a positive number, got nan"):
        resolve_budget(
            sigma=1.5, steps=10, target_epsilon=float("nan"), q=0.01, batch_size=50, delta=1e-5
        )
    path = tmp_path / "c.yaml"
    path.write_text("experiments:\n  e:\n    dataset: mnist\n    target_epsilon: .nan\n")
    with pytest.raises(ValueError, match=r"experiments\.e\.target_epsilon: bad value nan"):
        load_config(path)


def test_budget_of_reads_the_experiments_own_settings():
    """budget_of = resolve_budget with the spec's keys and q = batch_size / N."""
    spec = make_experiment(
        "b", sigma=None, steps=500, target_epsilon=3.0, clipping="per_sample", accountant="rdp"
    )
    expected = resolve_budget(
        sigma=None,
        steps=500,
        target_epsilon=3.0,
        q=50 / 60000,
        batch_size=50,
        delta=spec["delta"],
        clipping="per_sample",
        accountant="rdp",
        convention="sound",
    )
    assert budget_of(spec, 60000) == expected


def test_experiment_spec_is_read_once_from_a_validated_dict():
    spec = make_experiment("typed", sigma=2, channels=[8, 4, 2], cost="l2")
    settings = ExperimentSpec.from_dict(spec)
    assert settings.name == "typed" and settings.private
    assert settings.channels == (8, 4, 2) and settings.cost == "l2"
    assert settings.sigma == 2 and settings.generator == "dcgan"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.sigma = 1.0
    with pytest.raises(ValueError, match="cost"):
        ExperimentSpec.from_dict({k: v for k, v in spec.items() if k != "cost"})


def test_each_rdp_order_dp_accounting_leaves_out_is_warned_once(caplog):
    """At small σ dp-accounting leaves out orders whose series does not converge, warning
    at every ε computation; a training computes one per log row: each warning shows once,
    and ε is the same (a minimum over the orders kept)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="absl"):
        eps = [compute_epsilon(0.6543, 50 / 1617, steps, 1e-5) for steps in (101, 202, 303)]
    said = [r.getMessage() for r in caplog.records if "failed to converge" in r.getMessage()]
    assert said and len(said) == len(set(said)) and all("sigma=0.654300" in m for m in said)
    assert eps == sorted(eps) and all(math.isfinite(e) for e in eps)
