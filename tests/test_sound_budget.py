"""Sound-budget cells: the official code's σ at a sound ε = 10 in Table 1, the
SoK re-run cited beside them, the eps10 study's long cells, and their GPU-hours."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpsinkhorn import fileio
from dpsinkhorn.config import experiment, load_config
from dpsinkhorn.config.cluster import load_rates
from dpsinkhorn.config.studies import study_cells, study_experiments
from dpsinkhorn.plan import TRAIN_SIZES, plan_from_rates
from dpsinkhorn.privacy.accounting import compute_epsilon
from dpsinkhorn.privacy.budget import privacy_report
from dpsinkhorn.privacy.mechanism import noise_multiplier
from dpsinkhorn.report.common import ROW_LABELS
from dpsinkhorn.report.paper import SOK_NOISE_MULTIPLIER, SOK_OFFICIAL_CODE
from dpsinkhorn.report.tables import table1

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "config.yaml"
H100 = REPO / "results-paper-scale" / "mnist-paper-setting-h100" / "step_rates.json"


@pytest.fixture(scope="module")
def paper() -> dict:
    return load_config(PAPER)


def test_mnist_official_sigma_spends_sound_eps10_in_3986344_steps():
    """`dpsinkhorn privacy --q 1/1200 --sigma 1.1 --delta 1e-5 --epsilon 10 --batch-size 50`."""
    report = privacy_report(q=50 / 60000, delta=1e-5, batch_size=50, sigma=1.1, epsilon=10.0)
    assert report["steps"] == 3986344 and report["valid_guarantee"]
    assert report["epsilon"] <= 10.0


def _most_steps(spec: dict) -> bool:
    """The spec's steps spend at most its target ε and one step more would exceed it."""
    z = noise_multiplier(spec["sigma"], spec["batch_size"], spec["clipping"])
    q = spec["batch_size"] / TRAIN_SIZES[spec["dataset"]]
    eps = [compute_epsilon(z, q, spec["steps"] + k, spec["delta"], "rdp") for k in (0, 1)]
    return eps[0] <= spec["target_epsilon"] < eps[1]


@pytest.mark.parametrize(
    ("name", "dataset"), [("mnist_sound_official", "mnist"), ("fmnist_sound_official", "fmnist")]
)
def test_table1_official_rows_train_the_steps_their_budget_allows(paper, name, dataset):
    spec = experiment(paper, name)
    assert spec["table1_row"] == "sound_official" and spec["dataset"] == dataset
    assert spec["sigma"] == SOK_NOISE_MULTIPLIER[dataset]
    assert (spec["batch_size"], spec["clipping"], spec["target_epsilon"]) == (50, "batch", 10.0)
    assert _most_steps(spec)


def test_eps10_long_cells_trade_sigma_for_steps_at_equal_sound_epsilon(paper):
    long = [c for c in study_cells(paper, "eps10") if "sigma" in c.changes]
    assert [c.changes["sigma"] for c in long] == [0.7, 0.9, 1.1, 1.3]
    steps = [experiment(paper, c.experiment)["steps"] for c in long]
    assert steps == sorted(steps) and steps[-1] > 6_000_000
    assert all(_most_steps(experiment(paper, c.experiment)) for c in long)
    # the official code's σ is the Table 1 row itself (the same generator, reused)
    assert [c.experiment for c in long if c.changes["sigma"] == 1.1] == ["mnist_sound_official"]


def test_plan_gives_gpu_hours_and_day_long_requests_of_the_long_cells(paper):
    result = plan_from_rates(paper, load_rates(H100), study_experiments(paper, "eps10"))
    jobs = {j["experiments"][0]: j for j in result["jobs"]}
    job = jobs["eps10_b50_s1p3"]
    assert job["hours"] == pytest.approx(6353758 / 516.85 / 3600)
    assert job["chain_jobs"] == 1 and job["request_minutes"] <= 24 * 60
    assert job["request_minutes"] == math.ceil(6353758 / 516.85 / 60 * 3 + 10)
    # Fashion-MNIST's step has MNIST's shape (28 x 28 x 1, B 50, the paper's DCGAN): its rate
    fmnist = plan_from_rates(paper, load_rates(H100), ["fmnist_sound_official"])
    assert fmnist["unmeasured"] == [] and fmnist["jobs"][0]["steps_per_s"] == 516.85


def test_official_row_needs_a_fixed_sigma(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(
        "experiments:\n  x: {dataset: mnist, table1_row: sound_official, sigma: null,"
        " target_epsilon: 10.0, steps: 100}\n"
    )
    with pytest.raises(ValueError, match="table1_row.*sound_official"):
        load_config(bad)


def test_table1_shows_the_official_row_and_cites_sok(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "run_name: fake\nseeds: [0]\nevaluation: {classifiers: [cnn]}\nexperiments:\n"
        "  mnist_sound_official: {dataset: mnist, table1_row: sound_official, sigma: 1.1,"
        " target_epsilon: 10.0, steps: 3986344}\n"
    )
    out = tmp_path / "results" / "fake"
    exp = out / "mnist_sound_official"
    fileio.write_json(exp / "fid_seed0.json", {"fid": 70.0})
    fileio.write_json(exp / "acc_cnn_seed0.json", {"accuracy": 0.8})
    fileio.write_json(exp / "privacy.json", {"epsilon": 10.0, "epsilon_paper_convention": 99.0})
    table1([config], out)
    md = (out / "tables" / "table1.md").read_text()
    assert f"| {ROW_LABELS['sound_official']} |" in md
    fid, _, _, cnn = SOK_OFFICIAL_CODE["mnist"]
    assert "SoK: Privacy-Preserving Data Synthesis" in md and f"FID {fid:g}, CNN {cnn:g}%" in md
