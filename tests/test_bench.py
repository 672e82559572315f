"""The benchmark command's contract (it times; tests never assert on speed)."""

from __future__ import annotations

import json

import pytest
from test_train import make_config

from dpsinkhorn.cli import main


def test_bench_both_implementations(tmp_path, prepared_data, capsys):
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--impl", "both"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("ours_steps_per_s", "reference_steps_per_s", "ratio", "device", "torch"):
        assert key in result
    assert result["ratio"] == pytest.approx(
        result["ours_steps_per_s"] / result["reference_steps_per_s"]
    )
    assert result["steps_per_s"] == result["ours_steps_per_s"] > 0
