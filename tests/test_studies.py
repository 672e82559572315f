"""Studies (config expansion), `dpsinkhorn targets` and `dpsinkhorn plan`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpsinkhorn import config as config_lib
from dpsinkhorn import plan
from dpsinkhorn.config import studies, targets
from dpsinkhorn.config.workflow import gradient_settings
from dpsinkhorn.privacy.accounting import compute_epsilon
from dpsinkhorn.privacy.budget import resolve_budget

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "seeds": [0, 1],
    "training_defaults": {"steps": 20},
    "experiments": {
        "real_mnist": {"dataset": "mnist", "table1_row": "real", "method": "real_data"},
        "mnist_dp": {"dataset": "mnist", "table1_row": "paper", "sigma": 1.5},
    },
}


def write_config(tmp_path: Path, studies_section: dict, **extra) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra, "studies": studies_section}))
    return path


def test_vary_cells_reuse_an_identical_experiment(tmp_path):
    path = write_config(
        tmp_path,
        {"fig4a": {"bases": ["mnist_dp"], "vary": {"lr": [1.0e-3, 1.0e-4], "optimizer": ["adam"]}}},
    )
    config = config_lib.load_config([path])
    cells = studies.study_cells(config, "fig4a")
    # lr 1e-4 with adam is mnist_dp itself (the defaults): no second training.
    assert [c.experiment for c in cells] == ["fig4a_lr0p001_adam", "mnist_dp"]
    new = config_lib.experiment(config, "fig4a_lr0p001_adam")
    assert new["lr"] == 1.0e-3 and new["sigma"] == 1.5 and new["table1_row"] is None
    # Validating the expanded config again finds the same experiments (idempotent).
    again = config_lib.validate(config)
    assert config_lib.experiment_names(again) == config_lib.experiment_names(config)


def test_named_cells_settings_and_experiment_references(tmp_path):
    path = write_config(
        tmp_path,
        {
            "table4": {
                "bases": ["mnist_dp"],
                "settings": {"steps": 30},
                "cells": {"a": {"sigma": 1.1, "clip": 1.0}, "paper": {"experiment": "mnist_dp"}},
            },
            "fig5": {"bases": ["mnist_dp"], "vary": {"p": [0.4, 0.2]}},
        },
    )
    config = config_lib.load_config([path])
    cells = studies.study_cells(config, "table4")
    assert [(c.label, c.experiment) for c in cells] == [("a", "table4_a"), ("paper", "mnist_dp")]
    spec = config_lib.experiment(config, "table4_a")
    assert (spec["sigma"], spec["clip"], spec["steps"]) == (1.1, 1.0, 30)
    # fig5's p=0.4 differs from mnist_dp only in... nothing: reused; p=0.2 is new.
    assert studies.study_experiments(config, "fig5") == ["mnist_dp", "fig5_p0p2"]


def test_multiple_bases_label_cells_by_base(tmp_path):
    experiments = {
        **BASE["experiments"],
        "fmnist_dp": {"dataset": "fmnist", "table1_row": "paper", "sigma": 1.9},
    }
    path = write_config(
        tmp_path,
        {"fig5": {"bases": ["mnist_dp", "fmnist_dp"], "vary": {"p": [0.0]}}},
        experiments=experiments,
    )
    config = config_lib.load_config([path])
    cells = studies.study_cells(config, "fig5")
    assert [c.experiment for c in cells] == ["fig5_mnist_dp_p0", "fig5_fmnist_dp_p0"]
    assert config_lib.dataset_of(config, "fig5_fmnist_dp_p0") == "fmnist"


@pytest.mark.parametrize(
    "section, message",
    [
        ({"fig5": {"bases": ["nope"], "vary": {"p": [0.0]}}}, "studies.fig5.bases: unknown"),
        ({"fig5": {"bases": ["mnist_dp"], "vary": {"p": [2.0]}}}, "fig5_p2.p: bad value 2.0"),
        (
            {"table2": {"bases": ["mnist_dp"], "cells": {"x": {"sigam": 1}}}},
            "studies.table2.cells.x.sigam: unknown key (allowed: accountant, ",
        ),
        (
            {"table2": {"bases": ["mnist_dp"], "cells": {"x": {"p": 5.0}}}},
            "studies.table2.cells.x.p: bad value 5.0: must be <= 1",
        ),
        (
            {"table4": {"bases": ["mnist_dp"], "cells": {"x": {"experiment": "mnist_dp", "p": 0}}}},
            "studies.table4.cells.x.p: unknown key (allowed: experiment)",
        ),
        ({"fig9": {"bases": ["mnist_dp"], "vary": {"p": [0.0]}}}, "studies.fig9: unknown key"),
        ({"fig5": {"bases": ["mnist_dp"]}}, "studies.fig5: give cells or vary"),
        (
            {"fig5": {"bases": ["mnist_dp"], "vary": {"p": [0.0]}, "cells": {"x": {"p": 0}}}},
            "studies.fig5: give cells or vary, not both",
        ),
    ],
)
def test_bad_studies_are_named(tmp_path, section, message):
    """Each names the key at fault (a study cell's unknown key or bad value, not the whole
    cell as 'not valid under any of the given schemas')."""
    path = write_config(tmp_path, section)
    with pytest.raises(ValueError, match=re.escape(message)):
        config_lib.load_config([path])


def test_full_config_studies_and_fig4b_noise_scale():
    config = config_lib.load_config([ROOT / "config" / "config.yaml"])
    assert studies.configured_studies(config) == list(studies.STUDIES)
    # Table 2's semi-debiased row and Tables 4/5's paper rows are the Table 1 DP rows.
    assert studies.study_cells(config, "table2")[-1].experiment == "mnist_dpsinkhorn"
    assert studies.study_cells(config, "table5")[-1].experiment == "fmnist_dpsinkhorn"
    # Figure 4c analyses the generators Figure 5 trains on MNIST.
    fig5 = studies.study_experiments(config, "fig5")
    assert set(studies.study_experiments(config, "fig4c")) <= set(fig5)
    # fig4b: fewer steps for smaller ε, σ solved so that each spends its sound ε.
    for eps in (1.0, 10.0):
        spec = config_lib.experiment(config, f"fig4b_m3_eps{eps:g}")
        q = spec["batch_size"] / plan.TRAIN_SIZES["mnist"]
        sigma, steps = resolve_budget(
            sigma=None,
            steps=spec["steps"],
            target_epsilon=eps,
            q=q,
            batch_size=spec["batch_size"],
            delta=spec["delta"],
        )
        assert (spec["m"], steps) == (3.0, 16000 * eps)
        assert compute_epsilon(sigma, q, steps, spec["delta"]) == pytest.approx(eps, rel=1e-3)


def test_paper_convention_steps_for_table4():
    config = config_lib.load_config([ROOT / "config" / "config.yaml"])
    spec = config_lib.experiment(config, "table4_s1p5_c0p5_p0p2_m1")
    steps = plan.resolved_steps(spec)
    # The paper: sigma 1.5 reaches its epsilon = 10 in ~160,000 steps.
    assert 150000 < steps < 170000
    _, sound_steps = resolve_budget(
        sigma=1.5,
        steps=None,
        target_epsilon=10.0,
        q=spec["batch_size"] / 60000,
        batch_size=spec["batch_size"],
        delta=spec["delta"],
    )
    assert sound_steps > 10 * steps  # the sound count allows far more steps


def test_outputs_inputs_and_targets_cli(tmp_path):
    path = write_config(
        tmp_path,
        {
            "table4": {"bases": ["mnist_dp"], "cells": {"a": {"sigma": 1.1}}},
            "fig4c": {"bases": ["mnist_dp"], "vary": {"p": [0.0, 1.0]}, "batches": 4},
        },
    )
    config = config_lib.load_config([path])
    results = Path("results") / config["run_name"]
    assert targets.outputs(config, "table4", results)["csv"] == str(results / "tables/table4.csv")
    inputs = targets.inputs(config, "fig4c", results)
    assert inputs["gradients"] == [
        str(results / "nonprivate" / e / "gradstudy.json") for e in ("fig4c_p0", "fig4c_p1")
    ]
    assert len(inputs["results"]) == 2 * 2 * 4  # 2 experiments x 2 seeds x (fid + 3 classifiers)
    assert gradient_settings(config) == {
        "p_values": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
        "batches": 4,
    }
    with pytest.raises(ValueError, match="does not produce 'table2'"):
        targets.outputs(config, "table2", results)
    out = subprocess.run(
        [sys.executable, "-m", "dpsinkhorn", "targets", "table4", "--config", str(path), "--cells"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(results / "tables/table4.md") in out.stdout
    assert str(results / "table4_a" / "fid_seed1.json") in out.stdout


def test_plan_with_given_rate(tmp_path):
    path = write_config(tmp_path, {"fig5": {"bases": ["mnist_dp"], "vary": {"p": [0.0]}}})
    config = config_lib.load_config([path])
    result = plan.plan(config, "cpu", steps_per_s=4.0)
    assert [r["experiment"] for r in result["training"]] == ["mnist_dp", "fig5_p0"]
    assert result["training_hours"] == pytest.approx(2 * 20 / 4.0 / 3600)


def test_plan_measures_steps_per_s(tmp_path):
    experiments = {"mnist_dp": {"dataset": "mnist", "sigma": 1.5, "channels": [8, 4, 2]}}
    path = write_config(tmp_path, {}, experiments=experiments)
    config = config_lib.load_config([path])
    result = plan.plan(config, "cpu", bench_steps=2)
    (row,) = result["training"]
    assert row["steps_per_s"] > 0 and row["hours"] == pytest.approx(20 / row["steps_per_s"] / 3600)
    assert result["steps_per_s_source"].startswith("measured")


H100_RATES = ROOT / "results-paper-scale" / "mnist-paper-setting-h100" / "step_rates.json"


def test_eps10_study_hours_from_measured_h100_rates():
    """The sound ε = 10 study of config.yaml, planned from the committed H100 rates."""
    config = config_lib.load_config([ROOT / "config" / "config.yaml"])
    names = studies.study_experiments(config, "eps10")
    assert names[0] == "mnist_dpsinkhorn_eps10" and len(names) == 24
    long = {"eps10_b50_s0p7", "eps10_b50_s0p9", "mnist_sound_official", "eps10_b50_s1p3"}
    for name in names:  # every cell spends a sound ε = 10: σ solved, or steps (long cells)
        spec = config_lib.experiment(config, name)
        assert spec["target_epsilon"] == 10.0 and (spec["sigma"] is None) == (name not in long)
    rates = plan.load_rates(H100_RATES)
    result = plan.plan_from_rates(config, rates, names, sweep_runs=8)
    b50 = [j for j in result["jobs"] if j["batch_size"] == 50]
    # sweeps group by shape, not length: the six 160k cells with σ 0.7 and 0.9, then σ 1.1, 1.3
    assert [len(j["experiments"]) for j in b50] == [8, 2]
    assert [j["steps"] for j in b50] == [2096011, 6353758]
    assert all(j["steps_per_s"] == 114.84 for j in b50)
    assert b50[0]["rate_source"].startswith("measured")
    assert b50[1]["rate_source"].startswith("8-run rate")
    assert result["hours_measured"] == pytest.approx((2096011 + 6353758) / 114.84 / 3600)
    # B 250 and 1000 were never timed on the GPU: listed, not guessed
    assert len(result["unmeasured"]) == 14
    assert all(j["hours"] is None for j in result["jobs"] if j["batch_size"] != 50)
    single = plan.plan_from_rates(config, rates, names[:2], sweep_runs=1)
    assert [j["steps_per_s"] for j in single["jobs"]] == [516.85, 516.85]


def test_plan_cli_needs_rates_for_a_study_and_names_a_bad_rates_file(tmp_path, capsys):
    from dpsinkhorn import cli

    config = str(ROOT / "config" / "config.yaml")
    assert cli.main(["plan", "--config", config, "--study", "eps10"]) == 2
    assert "--study needs --rates" in capsys.readouterr().err
    bad = tmp_path / "rates.json"
    bad.write_text('{"rates": [{"dataset": "mnist", "batch_size": 50, "runs": 1}]}')
    assert cli.main(["plan", "--config", config, "--study", "eps10", "--rates", str(bad)]) == 2
    assert "rates[0] has no 'steps_per_s'" in capsys.readouterr().err
