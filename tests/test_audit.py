"""Empirical privacy audit of one sanitised step (dpsinkhorn.privacy.audit): an attack on the
real mechanism stays within the accountant's ε, and catches two broken mechanisms."""

from __future__ import annotations

import pytest

from dpsinkhorn.privacy.audit import audit, clopper_pearson_upper

RELEASES = 10000  # per dataset; the whole file runs in about 20 s on one CPU core


def test_clopper_pearson_upper_bound():
    # no success in n trials: the bound solves (1 - p)^n = alpha
    assert clopper_pearson_upper(0, 1000, 0.025) == pytest.approx(1 - 0.025 ** (1 / 1000))
    assert clopper_pearson_upper(1000, 1000, 0.025) == 1.0
    assert 0.5 < clopper_pearson_upper(50, 100, 0.025) < 0.61


@pytest.mark.parametrize("clipping", ["batch", "per_sample"])
def test_real_mechanism_stays_within_the_claimed_epsilon(clipping):
    result = audit("real", clipping, RELEASES)
    # the canary is worst-case: the clipped blocks are a full sensitivity apart
    assert result["distance_of_clipped_blocks"] == pytest.approx(result["sensitivity_claimed"])
    assert 0 < result["epsilon_lower_bound_95"] <= result["epsilon_claimed_one_step"]


@pytest.mark.parametrize(
    "mechanism, clipping", [("noise_off", "batch"), ("noise_over_sqrt_n", "per_sample")]
)
def test_audit_catches_a_broken_mechanism(mechanism, clipping):
    result = audit(mechanism, clipping, RELEASES)
    assert result["epsilon_lower_bound_95"] > result["epsilon_claimed_one_step"]
