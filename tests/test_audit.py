"""Empirical privacy audit of the production step (``dpsinkhorn.train.audit``, statistics in
``dpsinkhorn.privacy.audit``): the Trainer's / sweep's step at the config's sampling rate,
for all four sanitisers; sound ones stay within the accountant's one-step ε, broken ones
(noise off, noise ÷ √n, noise ÷ √2 in noise_std, ÷ √2 inside __call__), image and parameter
alike, are caught with a computed power ≥ 0.99; the CLI fails on an exceeded claim."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from dpsinkhorn.privacy import audit as stats
from dpsinkhorn.privacy.mechanism import ParameterGradientSanitizer
from dpsinkhorn.train import audit as prod

CONFIGS = {(c.name, c.mechanism): c for c in prod.QUICK}


@pytest.fixture(scope="module")
def results():
    """Every quick configuration audited once (the whole file: about 30 s on one core)."""
    return {key: prod.audit(cfg) for key, cfg in CONFIGS.items()}


def test_clopper_pearson_upper_bound():
    # no success in n trials: the bound solves (1 - p)^n = alpha
    assert stats.clopper_pearson_upper(0, 1000, 0.025) == pytest.approx(1 - 0.025 ** (1 / 1000))
    assert stats.clopper_pearson_upper(1000, 1000, 0.025) == 1.0
    assert 0.5 < stats.clopper_pearson_upper(50, 100, 0.025) < 0.61


def test_bound_of_gaussian_scores_is_below_the_exact_epsilon_and_of_separable_ones_is_cp():
    rng = np.random.default_rng(0)
    mu, delta, r = 1.0 / 3.0, 1e-5, 200_000  # Gaussian mechanism with noise multiplier 3
    bound = stats.epsilon_lower_bound(rng.normal(-mu / 2, 1, r), rng.normal(mu / 2, 1, r), delta)
    assert 0.3 < bound < stats.one_step_claim(3.0, delta, "pld") == pytest.approx(1.271, abs=1e-3)
    # perfectly separable: no error in r/2 on either side, cp = CP(0 of r/2 at 97.5%)
    separable = stats.epsilon_lower_bound(-np.ones(r), np.ones(r), delta)
    cp = stats.clopper_pearson_upper(0, r // 2, 0.025)
    assert separable == pytest.approx(math.log((1 - delta - cp) / cp))  # FPR and FNR both ≤ cp


@pytest.mark.parametrize(
    "name", ["worst/batch", "worst/per_sample", "worst/sweep", "worst/parameter"]
)
def test_sound_sanitisers_stay_within_their_claims(results, name):
    runs = results[(name, "sound")]
    assert len(runs) == (2 if name == "worst/sweep" else 1)
    for r in runs:
        assert r["passed"] and r["noise_check_passed"] and r["sensitivity_respected"]
        assert r["steps_debias_rows_differ"] == 0  # released without noise: canary-free
        assert 0.5 < r["epsilon_certified_95"] <= r["epsilon_claimed_one_step_q1"]
        # the worst-case canary moves the clipped release by a full sensitivity
        assert r["distance_min_over_sensitivity"] == pytest.approx(1.0, abs=1e-3)
        assert r["distance_max_over_sensitivity"] == pytest.approx(1.0, abs=1e-3)
    if name == "worst/sweep":  # two members, different σ, each audited against its own z
        assert [r["noise_multiplier_claimed"] for r in runs] == [3.0, 4.0]
        assert runs[0]["epsilon_claimed_one_step_q1"] > runs[1]["epsilon_claimed_one_step_q1"]
    expected = "ParameterGradientSanitizer" if name == "worst/parameter" else "ImageGradient"
    assert runs[0]["sanitizer"].startswith(expected)


def test_worst_case_configuration_certifies_within_a_factor_1_5_of_the_claim(results):
    (r,) = results[("worst/batch", "sound")]
    assert r["epsilon_claimed_one_step_q1"] / r["epsilon_certified_95"] < 1.5


BROKEN = sorted(key for key in CONFIGS if key[1] != "sound")


@pytest.mark.parametrize("name, mechanism", BROKEN, ids=["-".join(k) for k in BROKEN])
def test_broken_sanitisers_are_caught_with_a_computed_power_of_99_percent(results, name, mechanism):
    """Each broken variant, image and parameter alike, through the real ``__call__`` /
    ``apply``: the audit must not pass it, and its computed power against it is ≥ 0.99."""
    (r,) = results[(name, mechanism)]
    assert r["caught"], r
    assert r["power"] >= 0.99, r
    if mechanism == "sqrt_2_in_call":  # noise_std right, less noise drawn: the check sees it
        assert not r["noise_check_passed"] and r["power_noise_check"] > 0.999
    else:  # declared as drawn: the bound from the real releases catches it
        assert (
            r["noise_check_passed"] and r["epsilon_certified_95"] > r["epsilon_claimed_one_step_q1"]
        )


def test_every_listed_variant_is_audited_for_both_sanitisers():
    for perturbation in ("image", "parameter"):
        audited = {c.mechanism for c in prod.QUICK if c.perturbation == perturbation}
        assert (
            audited >= {"noise_over_sqrt_2", "sqrt_2_in_call", "noise_off", "noise_over_sqrt_n"}
            or perturbation == "image"
        )
    image = {c.mechanism for c in prod.QUICK if c.perturbation == "image"}
    assert image >= {"noise_over_sqrt_2", "sqrt_2_in_call", "noise_off", "noise_over_sqrt_n"}


def test_sampling_rate_is_the_configs(results):
    for (name, _), runs in results.items():
        cfg = CONFIGS[(name, runs[0]["mechanism"])]
        for r in runs:
            assert r["q"] == r["sampler_rate"] == cfg.batch_size / cfg.num_records
            assert r["epsilon_accountant_one_step_at_q"] < r["epsilon_claimed_one_step_q1"]


def test_canary_inclusion_is_the_runs_own_poisson_draw():
    """The hook reads inclusion from the step's own draws; its frequency is q."""
    cfg = CONFIGS[("worst/batch", "sound")]
    trainers, stepper = prod.build_runs(cfg, Path("unused"))
    hook = prod._CanaryHook(trainers[0].sampler, cfg.num_records - 1)  # wraps the sampler
    hook.mode, draws, included = "draws", 2000, 0
    for _ in range(draws):
        with pytest.raises(prod._CanaryHook.Skip):
            stepper.forward_backward(trainers)
        included += int(hook.included[0])
    assert binomtest(included, draws, cfg.batch_size / cfg.num_records).pvalue > 1e-4


def test_a_sound_mechanism_over_its_claim_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(prod, "one_step_claim", lambda z, delta, accountant: 0.01)
    args = ["--only", "worst/batch", "--mechanism", "sound", "--releases", "20000"]
    assert prod.main(args) == 1
    (line,) = capsys.readouterr().out.splitlines()
    result = json.loads(line)
    assert result["passed"] is False and result["epsilon_certified_95"] > 0.01
    assert result["commit"] and result["config"] == "worst/batch"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--releases", "10"], "releases ≥ 1000"),
        (["--only", "nothing"], "no configuration matches"),
        (["--sharp", "--only", "mnist", "--data-root", "/nonexistent"], "not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, message):
    assert prod.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_noise_check_rejects_a_sanitiser_whose_noise_is_not_its_noise_std():
    gen = torch.Generator().manual_seed(0)
    draws = torch.randn(4 * 32 * 1000, generator=gen, dtype=torch.float64)
    distances = torch.ones(4)
    level = prod.CHECK_LEVEL
    assert stats.noise_check(draws, distances, 1.0, level)["noise_check_passed"]
    assert not stats.noise_check(draws / math.sqrt(2), distances, 1.0, level)["noise_check_passed"]
    assert not stats.noise_check(draws, distances, 0.0, level)["noise_check_passed"]


def test_parameter_sanitiser_clipped_is_its_noise_free_release():
    sanitizer = ParameterGradientSanitizer(1.0, 2.0, torch.Generator().manual_seed(1))
    grad = torch.full((10,), 3.0)
    assert sanitizer.clipped(grad).norm() == pytest.approx(1.0)
    noise = (sanitizer(grad) - sanitizer.clipped(grad)) / sanitizer.noise_std
    assert 0.2 < float(noise.std()) < 2.5
