"""The GPU runbook's CPU-testable parts: persistent folders, and the targets report on the
real H100 measurements of commit 83ae335 (../shared/measurements/h100-83ae335), whose
numbers benchmarks/README.md's runbook table must quote."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_csv, require_shared, shared_path

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = REPO / "benchmarks" / "gpu"
BENCH_README = (REPO / "benchmarks" / "README.md").read_text()


def load_targets():
    spec = importlib.util.spec_from_file_location("gpu_targets", RUNBOOK / "targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def h100_measurements() -> Path:
    path = shared_path("DPSINKHORN_DATA_MIRROR").parent / "measurements" / "h100-83ae335"
    return require_shared(path, "the H100 measurements beside the data mirror")


def runbook(target: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in the "measured" cell of benchmarks/README.md's runbook
    table row whose target starts with ``target``."""
    rows = [r for r in BENCH_README.splitlines() if r.startswith(f"| {target}")]
    assert len(rows) == 1, f"benchmarks/README.md: no single runbook row for {target!r}"
    found = re.search(pattern, rows[0].split("|")[2])
    assert found, f"benchmarks/README.md, row {target!r}: no {pattern!r}"
    return found.groups()


LOOP = r"loop ([\d.]+) steps/s .*; ([\d.]+) over all .* vs bench ([\d.]+) \(([\d.]+)\)"


def committed_loop_log() -> Path:
    """The committed training log of the block row, trained in tf32 with graphs and the
    compiled solver (results-paper-scale/mnist-paper-setting-h100/provenance.json)."""
    return (
        REPO
        / "results-paper-scale"
        / "mnist-paper-setting-h100"
        / "mnist_dpsinkhorn"
        / "train_log.csv"
    )


def test_runbook_loop_rate_is_the_committed_logs():
    """benchmarks/README.md's loop rates are those of the committed train_log.csv: the rate
    past the first 10% of the steps (as targets.py counts it) and the log's own overall rate."""
    past_warmup, overall = (float(v) for v in runbook("training loop", LOOP)[:2])
    log = committed_loop_log()
    assert round(load_targets().loop_rate(log), 1) == past_warmup
    last = read_csv(log)[-1]
    assert round(float(last["steps_per_s"]), 1) == overall
    assert int(last["step"]) / float(last["elapsed_s"]) == pytest.approx(overall, abs=0.05)


def test_targets_on_the_h100_measurements_of_83ae335(h100_measurements, tmp_path):
    """targets.py on the H100 files gives what benchmarks/README.md's runbook table says."""
    out = tmp_path / "out"
    (out / "row_benchmarks").mkdir(parents=True)
    bench = [(h100_measurements / f"bench-call{k}.jsonl").read_text() for k in (1, 2)]
    (out / "bench.jsonl").write_text("".join(bench))
    # the block row was trained with graphs + compiled solver in tf32 (its README)
    shared_log = h100_measurements / "block_sigma1.5" / "train_log.csv"
    shutil.copy(shared_log, out / "loop_tf32.csv")
    for tsv in (h100_measurements / "eval-benchmarks").glob("*.tsv"):
        shutil.copy(tsv, out / "row_benchmarks")
    rows = {target: (measured, met) for target, measured, met in load_targets().evaluate(out)}
    print("\n".join(f"{t}: {m} -> {ok}" for t, (m, ok) in rows.items()))

    steps = next(v for k, v in rows.items() if k.startswith(">= 2,000 steps/s"))
    (best,) = runbook(">= 2,000 steps/s", r"([\d.]+) steps/s")
    assert steps[0].startswith(f"{best} steps/s") and "bf16" in steps[0] and steps[1] == "no"

    loop = next(v for k, v in rows.items() if k.startswith("training loop") and "tf32" in k)
    rate, _, bench_rate, share = runbook("training loop", LOOP)
    assert loop == (f"loop {rate} vs bench {bench_rate} steps/s ({share})", "no")
    # the committed log is the shared one without its loss column
    assert [r["elapsed_s"] for r in read_csv(shared_log)] == [
        r["elapsed_s"] for r in read_csv(committed_loop_log())
    ]

    sweeps = [v for k, v in rows.items() if k.startswith("sweep of 8")]
    quoted = [f"{x}x" for x in runbook("sweep of 8 >=", r"([\d.]+)×;.* ([\d.]+)×;.* ([\d.]+)×")]
    assert [v[0].split(" ")[0] for v in sweeps] == quoted
    assert [v[1] for v in sweeps] == ["yes", "no", "no"]
    classify = rows["each classify job < 15 s"]
    assert classify[1] == "no"
    (slowest,) = runbook("each classifier job", r"max ([\d.]+) s")
    assert classify[0].startswith(f"max {slowest} s (classify_")
    sample = rows["each sample job < 15 s"]
    (slowest,) = runbook("each sample job", r"max ([\d.]+) s")
    assert sample[1] == "yes" and sample[0].startswith(f"max {slowest} s")
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
        cwd=first,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"persistent folder    {persist}" in result.stdout
    for name in ("results", "data", ".snakemake"):
        assert (first / name).is_symlink() and (first / name).resolve() == persist / name
    assert (persist / "results" / "paper" / "checkpoint.pt").read_text() == "step 1000"
    assert "| target | measured | met |" in (out / "targets.md").read_text()

    second = fresh_copy("call2")  # the next call: no results/ in its tree
    result = subprocess.run(
        ["bash", "benchmarks/gpu/run.sh", "targets"],
        cwd=second,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (second / "results" / "paper" / "checkpoint.pt").read_text() == "step 1000"
