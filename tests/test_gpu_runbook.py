"""The GPU runbook's CPU-testable parts: persistent folders, and the targets report on the
real H100 measurements of commit 83ae335 (../shared/measurements/h100-83ae335)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_shared, shared_path

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = REPO / "benchmarks" / "gpu"


def load_targets():
    spec = importlib.util.spec_from_file_location("gpu_targets", RUNBOOK / "targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def h100_measurements() -> Path:
    path = shared_path("DPSINKHORN_DATA_MIRROR").parent / "measurements" / "h100-83ae335"
    return require_shared(path, "the H100 measurements beside the data mirror")


def test_targets_on_the_h100_measurements_of_83ae335(h100_measurements, tmp_path):
    """The issue's table: 907.9 steps/s (bf16), loop 538 of 696.5 (tf32), CNN jobs 137 s."""
    out = tmp_path / "out"
    (out / "row_benchmarks").mkdir(parents=True)
    bench = [(h100_measurements / f"bench-call{k}.jsonl").read_text() for k in (1, 2)]
    (out / "bench.jsonl").write_text("".join(bench))
    # the block row was trained with graphs + compiled solver in tf32 (its README)
    shutil.copy(h100_measurements / "block_sigma1.5" / "train_log.csv", out / "loop_tf32.csv")
    for tsv in (h100_measurements / "eval-benchmarks").glob("*.tsv"):
        shutil.copy(tsv, out / "row_benchmarks")
    rows = {target: (measured, met) for target, measured, met in load_targets().evaluate(out)}
    print("\n".join(f"{t}: {m} -> {ok}" for t, (m, ok) in rows.items()))
    steps = next(v for k, v in rows.items() if k.startswith(">= 2,000 steps/s"))
    assert steps[0].startswith("907.9 steps/s") and "bf16" in steps[0] and steps[1] == "no"
    loop = next(v for k, v in rows.items() if k.startswith("training loop") and "tf32" in k)
    assert "vs bench 696.5" in loop[0] and loop[1] == "no"  # 538 steps/s: 0.77
    sweeps = [v for k, v in rows.items() if k.startswith("sweep of 8")]
    assert len(sweeps) == 3 and [v[1] for v in sweeps] == ["yes", "no", "no"]  # eager 4.5x
    assert rows["each classify job < 15 s"][1] == "no"
    assert "136.8 s (classify_mnist_dpsinkhorn_cnn_seed0" in rows["each classify job < 15 s"][0]
    assert rows["each sample job < 15 s"][1] == "yes"  # 10-14 s
    assert rows["each fid job < 15 s"] == ("-", "not measured")  # never started
    assert rows["MNIST Table 1 DP row < 600 s"] == ("-", "not measured")


def test_runbook_keeps_results_data_and_snakemake_state_between_fresh_copies(tmp_path):
    """Each call gets a fresh working tree: the second call sees what the first one wrote."""
    persist, out = tmp_path / "persist", tmp_path / "out"
    env = {
        **os.environ,
        "PERSIST": str(persist),
        "OUT": str(out),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }

    def fresh_copy(name: str) -> Path:
        tree = tmp_path / name
        shutil.copytree(RUNBOOK, tree / "benchmarks" / "gpu")
        return tree

    first = fresh_copy("call1")
    (first / "results" / "paper").mkdir(parents=True)
    (first / "results" / "paper" / "checkpoint.pt").write_text("step 1000")
    result = subprocess.run(
        ["bash", "benchmarks/gpu/run.sh", "targets"],
        cwd=first, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"persistent folder    {persist}" in result.stdout
    for name in ("results", "data", ".snakemake"):
        assert (first / name).is_symlink() and (first / name).resolve() == persist / name
    assert (persist / "results" / "paper" / "checkpoint.pt").read_text() == "step 1000"
    assert "| target | measured | met |" in (out / "targets.md").read_text()

    second = fresh_copy("call2")  # the next call: no results/ in its tree
    result = subprocess.run(
        ["bash", "benchmarks/gpu/run.sh", "targets"],
        cwd=second, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (second / "results" / "paper" / "checkpoint.pt").read_text() == "step 1000"
