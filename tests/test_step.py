"""The one training step (``train.step``) and the one privacy factory (``privacy.factory``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsinkhorn.bench.cli import STEP_VARIANTS, use_variants
from dpsinkhorn.config import make_experiment
from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.factory import SPEC_KEYS, make_private, make_private_stack
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, ParameterGradientSanitizer
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train import step as step_module
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import Trainer

CPU = torch.device("cpu")
N = 60000  # public dataset size the factory is given


@pytest.fixture(scope="module")
def mnist(prepared_data):
    images, labels = data.load_split(prepared_data, "mnist", "train")
    return images[:2000], labels[:2000]


def spec(name: str = "s", **settings) -> dict:
    base = {"sigma": 1.5, "steps": 4, "batch_size": 20, "reproducible": True}
    return make_experiment(name, **{**base, **settings})


@pytest.mark.parametrize(
    ("settings", "sanitizer", "multiplier"),
    [
        ({}, ImageGradientSanitizer, 1.5),
        ({"clipping": "per_sample"}, ImageGradientSanitizer, 1.5 / math.sqrt(20)),
        ({"perturbation": "parameter"}, ParameterGradientSanitizer, 1.5),
    ],
)
def test_make_private_builds_the_mechanism_the_ledger_charges(settings, sanitizer, multiplier):
    private = make_private(spec(**settings), N, CPU)
    assert type(private.sanitizer) is sanitizer
    assert private.sanitizer.noise_std == pytest.approx(2 * private.sanitizer.clip * 1.5)
    assert private.sanitizer.noise_multiplier == pytest.approx(multiplier)
    # The accountant is given exactly the sanitiser's multiplier and the sampler's rate.
    assert private.accountant.noise_multiplier == private.sanitizer.noise_multiplier
    assert private.accountant.sample_rate == private.sampler.rate == 20 / N == private.q
    assert private.sanitizer.generator is private.rng  # noise from the run's own stream
    assert (private.n, private.n_prime, private.total_steps) == (20, 8, 4)  # p = 0.4


def test_make_private_keys_reproducible_runs_publicly_and_others_secretly():
    def first_draw(s: dict) -> torch.Tensor:
        return torch.rand(4, generator=make_private(s, N, CPU).rng)

    assert torch.equal(first_draw(spec()), first_draw(spec()))  # public key: seed and name
    assert not torch.equal(first_draw(spec()), first_draw(spec("t")))
    secret = spec(reproducible=False)
    assert not torch.equal(first_draw(secret), first_draw(secret))  # a fresh key per run


def test_make_private_non_private_run_has_a_sampler_only():
    private = make_private(spec(method="sinkhorn"), N, CPU)
    assert private.sanitizer is None and private.accountant is None
    assert private.sampler.rate == 20 / N and private.total_steps == 4


def test_make_private_refuses_bad_settings_naming_the_experiment():
    with pytest.raises(ValueError, match="experiment s: perturbation parameter .* not per_sample"):
        # (the config validator refuses it too; the factory also guards raw dicts)
        make_private({**spec(perturbation="parameter"), "clipping": "per_sample"}, N, CPU)
    with pytest.raises(ValueError, match=r"experiment s: batch_size 20 must be in \[1, 10\]"):
        make_private(spec(), 10, CPU)
    for key in SPEC_KEYS:  # a raw dict lacking a setting the factory reads is refused by name
        incomplete = {k: v for k, v in spec().items() if k != key}
        with pytest.raises(ValueError, match=f"setting '{key}' missing"):
            make_private(incomplete, N, CPU)
    with pytest.raises(ValueError, match="cannot be stepped together"):
        make_private_stack([spec("a"), spec("b", batch_size=30)], N, CPU)


def test_make_private_stack_gives_each_run_its_own_stream_and_ledger():
    runs = make_private_stack([spec("a"), spec("b", clipping="per_sample", p=0.5)], N, CPU)
    assert runs[0].rng is not runs[1].rng
    assert runs[0].accountant is not runs[1].accountant
    assert [r.n_prime for r in runs] == [8, 10]
    draws = [torch.rand(3, generator=r.rng) for r in runs]
    assert not torch.equal(*draws)


def _state_bytes(model: torch.nn.Module) -> list[np.ndarray]:
    return [t.detach().numpy().copy() for t in model.state_dict().values()]


@pytest.mark.parametrize("settings", [{}, {"clipping": "per_sample"}, {"method": "sinkhorn"}])
def test_a_single_run_is_the_step_of_a_sweep_of_one(mnist, settings):
    """``dpsinkhorn train`` and a one-member ``train-sweep`` run the same step: same
    draws, same loss, same generator, bit for bit."""
    single = Trainer(spec(**settings), *mnist, CPU)
    sweep = SweepTrainer([spec(**settings)], *mnist, CPU)
    for _ in range(3):
        loss_single = single.step()
        (loss_sweep,) = sweep.step(sweep.trainers)
        assert torch.equal(loss_single, loss_sweep)
    for a, b in zip(_state_bytes(single.model), _state_bytes(sweep.trainers[0].model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert single.epsilon() == sweep.trainers[0].epsilon()


@pytest.mark.parametrize("value", [0, 255, 1e4, -1e4, math.inf, math.nan])
def test_an_unsampled_record_changes_nothing_in_a_step(mnist, value):
    """Only the Poisson sample reaches the step: a record gathered into the fixed-shape
    buffer at weight 0 (its uniform was >= q), set to an extreme image (all 0 or all 255,
    with the L1 weight m = 3 of the paper's Fashion-MNIST setting), or its features set to
    any value at all (±1e4, inf, NaN: no image has them; before the buffer was masked, a
    non-finite one turned the whole step into NaN), leaves the released update unchanged
    bit for bit."""
    images, labels = mnist
    settings = {"m": 3.0, "sigma": 0.5}
    probe = Trainer(spec(**settings), images, labels, CPU)
    probe.model.sample_inputs(probe.n + probe.n_prime, probe.rng, CPU)  # the step's order
    indices, weights = probe.sampler.sample(probe.rng)
    unsampled = indices[weights == 0]  # in the buffer, weight 0
    assert len(unsampled) > 0
    changed = images.copy()
    if value in (0, 255):  # an image
        changed[unsampled.numpy()] = value
    states = []
    for imgs in (images, changed):
        trainer = Trainer(spec(**settings), imgs, labels, CPU)
        if imgs is changed and value not in (0, 255):  # any value
            trainer.real[unsampled] = value  # the step's copy of the record's features
        trainer.step()
        states.append(_state_bytes(trainer.model))
    for a, b in zip(*states, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("members", [[{"p": 0.4}], [{"p": 0.4}, {"p": 1.0}, {"p": 0.0}]])
def test_debiasing_rows_take_labels_of_their_own_draws(mnist, monkeypatch, members):
    """Paper Algorithm 1: the labels of all n + n' generated rows are drawn i.i.d.; the
    debiasing rows X[n:n+n'] do NOT reuse the labels of X[0:n'] (the released code's
    ``gen_y[:n_regen]``). What reaches the cost's label columns is checked for one run
    and for a sweep whose members have different n'."""
    seen = []
    real_features = step_module.conditional_features

    def spy(images, labels, *args):
        seen.append(labels.clone())
        return real_features(images, labels, *args)

    specs = [spec(f"m{i}", **settings) for i, settings in enumerate(members)]
    if len(specs) == 1:  # dpsinkhorn train
        single = Trainer(specs[0], *mnist, CPU)
        runs, take_step = [single], single.step
    else:  # dpsinkhorn train-sweep
        sweep = SweepTrainer(specs, *mnist, CPU)
        runs, take_step = sweep.trainers, lambda: sweep.step(sweep.trainers)
    expected = []
    for t in runs:
        draws = torch.Generator().set_state(t.rng.get_state())
        expected.append(t.model.sample_inputs(t.n + t.n_prime, draws, CPU)[1])
    monkeypatch.setattr(step_module, "conditional_features", spy)
    take_step()
    rows = max(t.n + t.n_prime for t in runs)
    labels = seen[-1].view(len(runs), rows)  # the step's stacked [K * rows] generated labels
    for run, (t, want) in enumerate(zip(runs, expected, strict=True)):
        n, n_prime = t.n, t.n_prime
        assert torch.equal(labels[run, : n + n_prime], want)
        if n_prime:
            assert not torch.equal(labels[run, n : n + n_prime], labels[run, :n_prime])


# ------------------------------------------------------------------ variants of the step


@pytest.mark.parametrize(
    ("num", "rate"), [(60000, 50 / 60000), (60000, 1e-5), (1000, 0.3), (40, 0.9)]
)
def test_compact_poisson_selection_is_the_top_k_selection(num, rate):
    """Selection "compact" gives the same uniforms the same sampled rows in the same order,
    the same weights and the same overflow flags as the float64 top-k: 100 batched draws
    per setting, at the sampler's capacity and at a third of it (overflows)."""
    topk = PoissonSampler(num, rate, CPU)
    compact = PoissonSampler(num, rate, CPU, selection="compact")
    g = torch.Generator().manual_seed(num)
    for capacity in (topk.capacity, max(1, topk.capacity // 3)):
        topk.capacity = compact.capacity = capacity
        u = torch.rand(100, num, generator=g, dtype=torch.float64)
        (i_t, w_t, o_t), (i_c, w_c, o_c) = topk.select(u), compact.select(u)
        assert i_c.shape == w_c.shape == (100, capacity) and o_c.shape == (100,)
        assert torch.equal(w_c, w_t) and torch.equal(o_c, o_t)
        assert torch.equal(i_c[w_c > 0], i_t[w_t > 0])
    sampled = (u < rate).sum(-1)
    assert torch.equal(o_c, (sampled > capacity).long())
    if rate > 1e-3:
        assert o_c.sum() > 0  # the small capacity overflowed


def test_compact_poisson_selection_past_its_buffer_keeps_the_first_sampled_records():
    """More sampled records than ``compact_rows`` (probability ≤ COMPACT_TAIL a step):
    the lowest-indexed ``compact_rows`` of them are kept, ordered by u, and the step is
    counted as an overflow."""
    sampler = PoissonSampler(100, 0.5, CPU, selection="compact")
    sampler.capacity, sampler.compact_rows = 10, 20
    u = torch.rand(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    indices, weights, overflow = sampler.select(u)
    first = torch.nonzero(u < 0.5).squeeze(1)[:20]
    want = first[u[first].argsort()][:10]
    assert torch.equal(indices, want) and weights.sum() == 10 and overflow == 1


def test_compact_poisson_selection_is_poisson_sampling():
    """Each record is in the sample with probability q, independently of the others:
    20,000 draws of 200 records at q = 0.1 (bounds: 5 standard errors)."""
    num, rate, draws = 200, 0.1, 20000
    sampler = PoissonSampler(num, rate, CPU, selection="compact")
    g = torch.Generator().manual_seed(3)
    included = []
    for _ in range(draws // 1000):
        u = torch.rand(1000, num, generator=g, dtype=torch.float64)
        indices, weights, _ = sampler.select(u)
        included.append(torch.zeros(1000, num).scatter_add_(1, indices, weights))
    inc = torch.cat(included).double()
    assert set(inc.unique().tolist()) <= {0.0, 1.0}
    assert (inc.mean(0) - rate).abs().max() < 5 * math.sqrt(rate * (1 - rate) / draws)
    joint = (inc.T @ inc) / draws  # P(i and j sampled)
    off = joint[~torch.eye(num, dtype=torch.bool)]
    assert (off.mean() - rate**2).abs() < 5 * math.sqrt(rate**2 / draws / num)
    assert (off - rate**2).abs().max() < 6 * math.sqrt(rate**2 * (1 - rate**2) / draws)
    counts = inc.sum(1)
    assert counts.mean() == pytest.approx(num * rate, rel=0.01)
    assert counts.var() == pytest.approx(num * rate * (1 - rate), rel=0.05)
    assert int(sampler.overflows) == 0 and sampler.capacity < num


def test_poisson_sampler_refuses_an_unknown_selection():
    with pytest.raises(ValueError, match="selection must be one of"):
        PoissonSampler(100, 0.1, CPU, selection="sort")


@pytest.mark.parametrize("variant", STEP_VARIANTS)
@pytest.mark.parametrize("settings", [{}, {"perturbation": "parameter", "cost": "l1"}])
def test_each_step_variant_trains_like_the_default_step(mnist, variant, settings):
    """``dpsinkhorn bench --variant``: the compact Poisson selection trains bit for bit like
    the default step; the channels-last generator and the fused cost to float32 rounding
    (the losses to 1e-5; the parameters' change over three Adam steps, which amplifies
    rounding in near-zero gradients entry by entry, to 1e-3 in norm)."""
    default = Trainer(spec(**settings), *mnist, CPU)
    changed = Trainer(spec(**settings), *mnist, CPU)
    start = torch.cat([p.detach().flatten() for p in default.model.parameters()])
    use_variants([changed], changed.stepper, [variant])
    for _ in range(3):
        want, got = default.step(), changed.step()
        if variant == "compact_poisson":
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    moved = [
        torch.cat([p.detach().flatten() for p in t.model.parameters()]) - start
        for t in (default, changed)
    ]
    if variant == "compact_poisson":
        assert torch.equal(*moved)
    assert (moved[1] - moved[0]).norm() <= 1e-3 * moved[0].norm()


def test_channels_last_generator_keeps_its_activations_channels_last(mnist):
    """Every convolution's output, forward and backward, stays NHWC in a training step."""
    trainer = Trainer(spec(), *mnist, CPU)
    use_variants([trainer], trainer.stepper, ["channels_last"])
    formats = []

    def record(module, inputs, output):
        formats.append(output.is_contiguous(memory_format=torch.channels_last))

    for layer in trainer.model.net:
        layer.register_forward_hook(record)
    trainer.step()
    assert formats and all(formats)
    weights = [p for p in trainer.model.parameters() if p.ndim == 4]
    assert all(w.grad.is_contiguous(memory_format=torch.channels_last) for w in weights)


def test_step_variants_of_a_sweep_train_like_its_default_step(mnist):
    """A sweep's batched selection and solve take the variants too (K = 2 runs)."""
    specs = [spec("a"), spec("b", p=0.5, m=2.0)]
    default, changed = SweepTrainer(specs, *mnist, CPU), SweepTrainer(specs, *mnist, CPU)
    use_variants(changed.trainers, changed.stepper, ["compact_poisson", "fused_cost"])
    for _ in range(2):
        want, got = default.step(default.trainers), changed.step(changed.trainers)
        torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-5, atol=0)
