"""The one training step (``train.step``) and the one privacy factory (``privacy.factory``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsinkhorn.config import make_experiment
from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.factory import SPEC_KEYS, make_private, make_private_stack
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, ParameterGradientSanitizer
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
