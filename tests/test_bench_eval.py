"""``dpsinkhorn bench-eval`` end to end on the CPU at a tiny size (the committed H100
generator, random Inception weights, 2 seeds of 4 samples, 2 training steps): the JSON
has every phase, ratio and result the GPU call's note reads."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

GENERATOR = (
    Path(__file__).resolve().parents[2] / "shared/measurements/h100-83ae335/block_sigma1.5"
) / "generator.pt"


def test_bench_eval_writes_every_phase(tmp_path, run_cli):
    out = tmp_path / "bench.json"
    argv = [
        "bench-eval",
        "--generator",
        str(GENERATOR),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--seeds",
        "0",
        "1",
        "--num",
        "4",
        "--num-test",
        "4",
        "--fid-precisions",
        "--sqrtm",
        "eigh",
        "--compare-epochs",
        "1",
        "--max-epochs",
        "2",
        "--patience",
        "1",
        "--max-iter",
        "10",
        "--step-precisions",
        "fp32",
        "--step-records",
        "200",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--profile-steps",
        "1",
    ]
    assert run_cli(argv) == 0
    result = json.loads(out.read_text())
    assert set(result) >= {
        "settings",
        "inception",
        "fid",
        "classifiers",
        "train_step",
        "evaluation",
        "device",
        "torch",
        "wall_s",
    }
    assert result["inception"].startswith("random weights")
    assert set(result["evaluation"]) == {"sample_s", "reference_s", "fast_s", "ratio"}
    fid = result["fid"]
    for key in [
        "reference_features_s_per_seed",
        "fast_features_s_per_seed",
        "features_ratio",
        "distance_s_per_seed",
        "reference_total_s",
        "fast_total_s",
    ]:
        assert fid[key] > 0
    assert len(fid["reference_fid"]) == 1 and len(fid["fast_fid"]) == 2
    assert fid["fast_fid_relative_difference"][0] < 1e-3  # fp32 on both paths
    cls = result["classifiers"]
    for model in ("mlp", "cnn"):
        assert cls[f"{model}_epoch_ratio"] > 0 and cls[f"{model}_fast_full_s"] > 0
        # on the CPU the fast loop is the reference arithmetic: the same accuracies
        assert (
            cls[f"{model}_reference_accuracy_after_1_epochs"]
            == cls[f"{model}_fast_accuracy_after_1_epochs"]
        )
    step = result["train_step"]
    assert step["fp32_steps_per_s"] > 0 and step["fp32_profile"]["kernels"]


def test_a_failed_section_is_recorded_and_what_came_before_is_saved():
    from dpsinkhorn.bench.evalspeed import _section

    saved = []
    result: dict = {}
    _section(result, "fid", lambda r: saved.append(dict(r)), lambda: {"fast_total_s": 1.0})
    _section(result, "classifiers", lambda r: saved.append(dict(r)), lambda: 1 / 0)
    assert result["fid"] == {"fast_total_s": 1.0}
    assert result["classifiers"] == {"error": "ZeroDivisionError: division by zero"}
    assert [set(s) for s in saved] == [{"fid"}, {"fid", "classifiers"}]

    def fills_then_fails(out: dict) -> dict:
        out["logreg_s"] = 2.0
        raise RuntimeError("CUDA error: out of memory\nmore lines")

    result["classifiers"] = {}
    _section(result, "classifiers", saved.append, fills_then_fails, result["classifiers"])
    assert result["classifiers"] == {
        "logreg_s": 2.0,
        "error": "RuntimeError: CUDA error: out of memory",
    }


def test_classifiers_take_a_generator_of_more_than_ten_classes():
    """Labels 0..11 (an own dataset's generator): every classifier trains on 12 classes
    (was a fixed 10: ``IndexError: Target 10 is out of bounds``)."""
    from dpsinkhorn.bench.evalspeed import bench_classifiers

    rng = np.random.default_rng(0)
    draws = [(rng.integers(0, 256, (24, 8, 8), np.uint8), np.arange(24) % 12) for _ in range(2)]
    test = (rng.integers(0, 256, (12, 8, 8), np.uint8), np.arange(12))
    args = Namespace(
        max_iter=5,
        compare_epochs=1,
        classifiers=["mlp", "cnn"],
        max_epochs=2,
        patience=1,
        batch_size=8,
    )
    out = bench_classifiers(draws, test, [0, 1], torch.device("cpu"), args, {}, lambda: None)
    assert len(out["logreg_accuracy"]) == 2
    for model in ("mlp", "cnn"):
        assert len(out[f"{model}_fast_full_accuracy"]) == 2
        assert (
            out[f"{model}_reference_accuracy_after_1_epochs"]
            == out[f"{model}_fast_accuracy_after_1_epochs"]
        )


@pytest.mark.parametrize(
    "change, message",
    [
        (["--reference-seeds", "0"], "--reference-seeds must be at least 1, got 0"),
        (["--patience", "0"], "--patience must be at least 1"),
        (["--num", "1"], "--num must be at least 2"),
        (["--seeds", "0", "0"], "distinct seeds"),
    ],
)
def test_bad_arguments_are_one_line_before_any_section(change, message, tmp_path, run_cli, capsys):
    """Refused before the samples and FID, not recorded as a later section's error (exit 0)
    after the earlier sections spent a GPU call's time."""
    out = tmp_path / "bench.json"
    argv = ["bench-eval", "--generator", str(GENERATOR), "--out", str(out), "--device", "cpu"]
    assert run_cli([*argv, *change]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()
