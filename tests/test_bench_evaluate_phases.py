"""``benchmarks/evaluate_phases.py`` end to end on the CPU at a tiny size (the committed H100
generator, random Inception weights, 2 seeds of 4 samples): the JSON has every phase."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
GENERATOR = REPO.parent / "shared/measurements/h100-83ae335/block_sigma1.5/generator.pt"


def _script():
    spec = importlib.util.spec_from_file_location(
        "evaluate_phases", REPO / "benchmarks/evaluate_phases.py"
    )
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
