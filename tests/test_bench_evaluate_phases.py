"""The evaluation benchmarks end to end on the CPU at a tiny size: ``evaluate_phases.py`` (the
committed H100 generator, random Inception weights, 2 seeds of 4 samples: the JSON has every
phase), ``fid_precision.py`` (real weights, the real-data row and a generator: each
precision's FID errors and bound) and ``profile_classifier.py`` (each CNN step's top ops; its
grouped candidate step equals the product's vmapped one)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GENERATOR = REPO.parent / "shared/measurements/h100-83ae335/block_sigma1.5/generator.pt"


def _script(name: str = "evaluate_phases"):
    spec = importlib.util.spec_from_file_location(name, REPO / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_phases_writes_every_phase(tmp_path):
    out = tmp_path / "phases.json"
    argv = ["--generator", str(GENERATOR), "--out", str(out), "--device", "cpu"]
    argv += ["--seeds", "0", "1", "--num", "4", "--num-test", "4", "--fid-precisions", "bf16"]
    argv += ["--max-epochs", "2", "--patience", "1", "--max-iter", "10"]
    assert _script().main(argv) == 0
    result = json.loads(out.read_text())
    assert result["inception"] == "random weights (timing only)"
    assert result["sample_s"] > 0 and result["total_s"] > result["sample_s"]
    fid = result["fid"]
    assert fid["fp32_features_s_per_seed"] > 0 and len(fid["fp32_fid"]) == 2
    assert fid["bf16"]["fid_relative_error"] >= 0 and fid["bf16"]["features_s_seed0"] > 0
    for model in ("logreg", "mlp", "cnn"):
        assert len(result["classifiers"][model]["accuracy"]) == 2
    assert all(1 <= e <= 2 for e in result["classifiers"]["cnn"]["epochs"])


def test_classifiers_take_a_generator_of_more_than_ten_classes():
    """Labels 0..11 (an own dataset's generator): every classifier trains on 12 classes."""
    from argparse import Namespace

    rng = np.random.default_rng(0)
    draws = [(rng.integers(0, 256, (24, 8, 8), np.uint8), np.arange(24) % 12) for _ in range(2)]
    test = (rng.integers(0, 256, (12, 8, 8), np.uint8), np.arange(12))
    args = Namespace(
        seeds=[0, 1],
        classifiers=["logreg", "mlp", "cnn"],
        max_iter=5,
        max_epochs=2,
        patience=1,
        batch_size=8,
    )
    out = _script().classifier_phase(draws, test, torch.device("cpu"), args, {}, lambda: None)
    assert all(len(out[m]["accuracy"]) == 2 for m in ("logreg", "mlp", "cnn"))


def test_fid_precision_reports_each_rows_errors_and_the_bound(tmp_path, data_mirror, fid_weights):
    """The real-data row and a generator's, fp16 against IEEE fp32: per row the FID, its
    absolute and relative error and whether both are within the bound; the bound is the
    largest error over the rows. (On a CPU, tf32 is fp32: its error is exactly 0.) Each row's
    fp32 FID against the reference path's (pytorch-fid's own forward and distance) in the
    first row only."""
    out = tmp_path / "precision.json"
    argv = ["--weights", str(fid_weights), "--data-mirror", str(data_mirror), "--device", "cpu"]
    argv += ["--generators", str(GENERATOR), "--precisions", "tf32", "fp16", "--num", "6"]
    argv += ["--num-test", "6", "--pytorch-fid-rows", "1", "--out", str(out)]
    assert _script("fid_precision").main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"real_mnist", str(GENERATOR)}
    for row in result["rows"].values():
        assert row["fp32"]["fid"] > 0
        assert row["tf32"]["absolute_error"] == 0 and row["tf32"]["within"]
        fp16 = row["fp16"]
        assert fp16["absolute_error"] == abs(fp16["fid"] - row["fp32"]["fid"])
        assert fp16["relative_error"] == pytest.approx(fp16["absolute_error"] / row["fp32"]["fid"])
        assert fp16["within"] == (fp16["absolute_error"] <= 0.05 and fp16["relative_error"] <= 0.01)
    real, generated = result["rows"]["real_mnist"], result["rows"][str(GENERATOR)]
    assert "pytorch_fid" not in generated
    reference = real["pytorch_fid"]
    assert reference["absolute_error"] == abs(real["fp32"]["fid"] - reference["fid"])
    assert reference["relative_error"] < 1e-4 and reference["within"]
    worst = result["bound"]["fp16"]
    assert worst["max_absolute_error"] == max(
        r["fp16"]["absolute_error"] for r in result["rows"].values()
    )
    assert worst["rows_outside"] == [
        n for n, r in result["rows"].items() if not r["fp16"]["within"]
    ]


def test_profile_classifier_lists_each_cnn_steps_top_ops(tmp_path):
    """At a tiny size on the CPU, for the vmapped step and the grouped one: the eager step's
    milliseconds and the top ops by self CPU time, whose shares add up to at most 1, the
    convolutions among them."""
    out = tmp_path / "profile.json"
    argv = ["--device", "cpu", "--num", "40", "--seeds", "0", "1", "--batch-size", "8"]
    argv += ["--warmup", "1", "--steps", "2", "--top", "30", "--out", str(out)]
    assert _script("profile_classifier").main(argv) == 0
    variants = json.loads(out.read_text())["variants"]
    assert set(variants) == {"vmap", "grouped"}
    for result in variants.values():
        assert result["eager_ms_per_step"] > 0 and "graphed_ms_per_step" not in result
        ops = result["top_ops"]
        assert 0 < sum(op["share"] for op in ops) <= 1 + 1e-9
        assert any("convolution" in op["op"] for op in ops)


def test_grouped_cnn_step_equals_the_vmapped_one():
    """Three seeds' CNNs on their own two-channel digit images (sklearn's 8x8 digits and
    their transposes), dropout off: the grouped forward's logits and one step's gradients of
    every parameter equal the vmapped ``BatchedRun``'s within float32 rounding."""
    from sklearn.datasets import load_digits

    from dpsinkhorn.evaluate.classifiers import BatchedRun

    digits = load_digits()
    images = torch.from_numpy(digits.images[:90] / 16).float()
    x = torch.stack([images, images.transpose(1, 2)], 1)  # [90, 2, 8, 8]
    y = torch.from_numpy(digits.target[:90])
    xs, ys = list(x.split(30)), list(y.split(30))
    run = BatchedRun("cnn", xs, ys, 10, [0, 1, 2], batch_size=8)
    idx = run.epoch_batches()[0]
    run.base.eval()
    grouped = _script("profile_classifier").GroupedCNN(run)
    with torch.no_grad():
        reference = run.train_fn(run.params, run.buffers, run.x_fit[run.rows, idx])
        torch.testing.assert_close(grouped.logits(idx), reference, rtol=0, atol=1e-5)
    frozen = torch.optim.SGD(list(run.params.values()), lr=0.0)  # leaves the gradients
    grads = {}
    for name, model in (("vmap", run), ("grouped", grouped)):
        model.step(frozen, idx)
        grads[name] = {key: v.grad.clone() for key, v in run.params.items()}
    assert set(grads["grouped"]) == {f"{i}.{p}" for i in (0, 4, 9) for p in ("weight", "bias")}
    for key, g in grads["vmap"].items():
        assert g.abs().sum() > 0
        torch.testing.assert_close(grads["grouped"][key], g, rtol=0, atol=1e-5)
