"""``dpsinkhorn gpu-window`` on the CPU: a tiny two-experiment window split over several
calls that each stop at their deadline, each call in a fresh folder given only the last
call's archive, ends where one uninterrupted call ends (generator bytes identical in
reproducible mode, each ledger's steps counted once), and its results set renders."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, require_shared, shared_path, without_log_hash

from dpsinkhorn import fileio, window, window_imports, window_setup

TINY = """\
run_name: window
data_dir: DATA
device: cpu
seeds: [0]
evaluation:
  num_samples: 60
  fid_reference_size: 20
  fid_sqrtm: eigh
  classifiers: [logreg]
  logreg_max_iter: 50
  max_epochs: 2
  patience: 1
  batch_size: 128
training_defaults:
  # Training is the work a deadline may split (it checkpoints); each evaluation job is not
  # split. The non-private training (200 steps, most of the work) starts after the DP item
  # and is longer than a split call's budget (split_budget), so it spans calls (the test
  # checks that a training stopped at a deadline).
  steps: 50
  checkpoint_every: 25
  log_every: 25
  channels: [32, 16, 8]   # a small generator: the budget goes to steps, not to one step
  reproducible: true
experiments:
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper, sigma: 1.5}
  mnist_nonprivate:
    {dataset: mnist, table1_row: nonprivate, method: sinkhorn, batch_size: 100, steps: 200}
"""
#: The DP and the non-private experiment's steps in TINY (a ledger of it must say so).
DP_STEPS = yaml.safe_load(TINY)["training_defaults"]["steps"]
NONPRIVATE_STEPS = yaml.safe_load(TINY)["experiments"]["mnist_nonprivate"]["steps"]
WINDOW = """\
configfile: tiny.yaml
signal_grace_s: 30
work:   # no measured rate for the tiny generator: long: true starts its trainings
  - {name: dp, experiments: [mnist_dpsinkhorn], long: true}
  - {name: nonprivate, experiments: [mnist_nonprivate], long: true}
"""


def call(root: Path, tmp: Path, archive_in: Path | None, archive_out: Path, budget: float):
    """One call from a fresh folder holding only the window files (and the archive)."""
    fresh = tmp / f"call-{archive_out.name}"
    fresh.mkdir()
    shutil.copy(root / "tiny.yaml", fresh)
    shutil.copy(root / "window.yaml", fresh)
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "Inception weights")
    cmd = [
        sys.executable,
        "-m",
        "dpsinkhorn",
        "gpu-window",
        "--config",
        str(fresh / "window.yaml"),
        "--archive-out",
        str(archive_out),
        "--budget-s",
        str(budget),
        "--reserve-s",
        "0",
        "--results-set",
        str(fresh / "sets"),
        "--set-name",
        "cpu-test",
        "--commit",
        "test",
        "--snakemake-config",
        f"data_mirror={mirror}",
        f"fid_weights={weights}",
        # one job of one thread at a time, as the other workflow tests (a job's threads set
        # its OMP_NUM_THREADS): with 2 threads beside the other pytest worker, one call's
        # 800 DP steps took 577 s instead of about a minute (the CI of 37cdc6c)
        "--cores",
        "1",
    ]
    if archive_in is not None:
        cmd += ["--archive-in", str(archive_in)]
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    result = subprocess.run(  # the call stops itself at its budget; then it packs
        cmd, capture_output=True, text=True, env=env, timeout=budget + 300, cwd=fresh
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return fresh / "sets" / "cpu-test"


def split_budget(one_call_s: float, whole: Path) -> float:
    """Each split call's budget, from the uninterrupted call on this machine (its load sets
    every time below, so the number of calls does not depend on how fast the machine is):
    two fifths of that call, so that two calls cannot do its work (at least two end
    with work left) and three or four do (each call pays its own Snakemake and job starts
    and loses the job its deadline stops: at two sevenths, six calls took 240 s where one
    took 142 s); at most four fifths of the non-private training, so that no call can train
    it whole: some deadline lands inside it and it checkpoints (exit 75; at 48 s against a
    47 s training, the CI of 97214fc stopped it only 0.4 s after its start, before it had a
    step); and at least twice the longest job that is not a training (an evaluation or the
    FID reference: a deadline cannot split it), so that every call, whose trainings are
    done or resume from their checkpoint, can finish one such job after its Snakemake's
    start. Job times are the Snakemake benchmark files (wall ``s``)."""
    seconds = {
        path.stem: float(list(csv.DictReader(path.open(), delimiter="\t"))[-1]["s"])
        for path in (whole / "results/window/benchmarks").rglob("*.tsv")
    }
    longest = max(s for name, s in seconds.items() if not name.startswith("train_"))
    training = seconds["train_mnist_nonprivate"]
    return max(min(one_call_s * 2 / 5, training * 4 / 5), 2 * longest)


def without_times(record: dict) -> dict:
    """A result record less its wall-clock fields: ``seconds`` (how long the job ran) and a
    ledger's ``train_log_sha256`` (:func:`helpers.without_log_hash`)."""
    return {k: v for k, v in without_log_hash(record).items() if k != "seconds"}


def final_state(archive: Path, into: Path) -> Path:
    into.mkdir()
    fileio.unpack(archive, into)
    return into


def prepared_data(tmp_path: Path) -> Path:
    """MNIST prepared once, outside every call's folder (as a warm machine's /tmp keeps it):
    the calls' budgets then go to training, not to decoding the archives again."""
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    root = tmp_path / "data"
    cmd = [
        sys.executable,
        "-m",
        "dpsinkhorn",
        "data",
        "--dataset",
        "mnist",
        "--root",
        str(root),
        "--mirror",
        str(mirror),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return root


@pytest.mark.slow
def test_window_split_over_interrupted_calls_equals_one_call(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY.replace("DATA", str(prepared_data(tmp_path))))
    (tmp_path / "window.yaml").write_text(WINDOW)
    began = time.monotonic()
    one = call(tmp_path, tmp_path, None, tmp_path / "one.tar.gz", budget=900)
    whole = final_state(tmp_path / "one.tar.gz", tmp_path / "whole")
    budget = split_budget(time.monotonic() - began, whole)
    state = json.loads((whole / window.STATE).read_text())
    assert [c["outcome"] for c in state["calls"]] == ["done"]

    archive, outcomes = None, []
    for k in range(20):
        out = tmp_path / f"a{k}.tar.gz"
        split = call(tmp_path, tmp_path, archive, out, budget=budget)
        archive = out
        outcomes = [
            c["outcome"]
            for c in json.loads((final_state(out, tmp_path / f"s{k}") / window.STATE).read_text())[
                "calls"
            ]
        ]
        if outcomes[-1] == "done":
            break
    # at least two calls ended with work left: at their deadline, or "waiting" (an evaluation
    # that could not reach its next phase in the time left was not started)
    assert outcomes[-1] == "done" and len(outcomes) >= 3, outcomes
    assert set(outcomes[:-1]) <= {"deadline", "waiting"} and "deadline" in outcomes, outcomes
    parts = final_state(archive, tmp_path / "parts")
    log = (parts / "window.log").read_text()  # every call's Snakemake output, in order
    assert "Params have changed" not in log  # no call retrained what an earlier one finished
    # a training stopped at a call's deadline (exit 75: checkpointed) and a later call resumed
    assert "train --config window/config.yaml" in log and "exit status 75." in log
    for exp, home in (("mnist_dpsinkhorn", ""), ("mnist_nonprivate", "nonprivate/")):
        a, b = whole / "results/window" / home / exp, parts / "results/window" / home / exp
        assert (a / "generator.pt").read_bytes() == (b / "generator.pt").read_bytes(), exp
        ledger_a = json.loads((a / "privacy.json").read_text())
        ledger_b = json.loads((b / "privacy.json").read_text())
        steps = DP_STEPS if exp == "mnist_dpsinkhorn" else NONPRIVATE_STEPS
        assert ledger_a["steps"] == ledger_b["steps"] == steps
        assert ledger_b.get("epsilon") == ledger_a.get("epsilon")
        assert not (b / "private_workspace").exists()  # removed when training completed
    # the results set: the same files, provenance of every call, Table 1 rendered
    for path in sorted(p for p in one.rglob("*.json") if p.name != "provenance.json"):
        a, b = (json.loads(p.read_text()) for p in (path, split / path.relative_to(one)))
        assert without_times(a) == without_times(b), path.name
    provenance = json.loads((split / "provenance.json").read_text())
    assert len(provenance["calls"]) == len(outcomes)
    assert set(provenance["experiments"]) == {"mnist_dpsinkhorn", "mnist_nonprivate"}
    # each phase names the commit that computed it (a phase resumed in a later call too)
    commits = {c["commit"] for c in provenance["calls"]}
    for entry in provenance["experiments"].values():
        assert {"fid", "logreg"} <= set(entry["phases"])
        assert {phase["commit"] for phase in entry["phases"].values()} <= commits
    table = (split / "table1.md").read_text()
    assert "DP-Sinkhorn (paper setting)" in table and "Non-private Sinkhorn" in table


def test_archive_round_trip_in_parts_and_exclusions(tmp_path):
    work = tmp_path / "w"
    (work / "results/r/e/private_workspace").mkdir(parents=True)
    (work / "data/mnist").mkdir(parents=True)
    (work / "results/r/e/private_workspace/ckpt.pt").write_bytes(os.urandom(300_000))
    (work / "results/r/e/samples_seed0.npz").write_bytes(b"x")
    (work / "data/mnist/train.npz").write_bytes(b"x")
    parts = fileio.pack(work, tmp_path / "a.tar.gz", window_setup.DEFAULT_EXCLUDE, part_mib=0.1)
    assert len(parts) >= 3 and not (tmp_path / "a.tar.gz").exists()
    back = tmp_path / "back"
    fileio.unpack(tmp_path / "a.tar.gz", back)
    got = {p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()}
    assert got == {"results/r/e/private_workspace/ckpt.pt"}
    assert (back / got.pop()).read_bytes() == (
        work / "results/r/e/private_workspace/ckpt.pt"
    ).read_bytes()


def test_window_file_errors_name_the_key(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "w.yaml").write_text(
        "configfile: tiny.yaml\nwork:\n  - {name: a, experiments: [nope]}\n"
    )
    with pytest.raises(ValueError, match=r"work\[0\]: unknown experiment 'nope'"):
        window.load_window(tmp_path / "w.yaml")
    (tmp_path / "w.yaml").write_text("configfile: tiny.yaml\nwork: []\nextra: 1\n")
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        window.load_window(tmp_path / "w.yaml")
    (tmp_path / "w.yaml").write_text(
        "configfile: tiny.yaml\nwork:\n  - {name: a, experiments: [real_mnist], outputs: [fid]}\n"
    )
    (tmp_path / "tiny.yaml").write_text(
        TINY + "  real_mnist: {dataset: mnist, method: real_data}\n"
    )
    with pytest.raises(ValueError, match=r"work\[0\]\.outputs: removed: .* one job"):
        window.load_window(tmp_path / "w.yaml")
    assert window.device_slug("NVIDIA H100 80GB HBM3 (torch 2.11)") == "h100"
    assert window.device_slug("cpu (torch 2.14, 2 cores)") == "cpu"


def test_paper_window_file_loads_in_order():
    loaded = window.load_window(REPO / "benchmarks" / "gpu" / "window.yaml")
    names = [item["name"] for item in loaded["work"]]
    assert names[0] == "real_mnist" and names[-1] == "sound_budget"
    imports = [item for item in loaded["work"] if item["import"]]
    assert all(item["name"].startswith("fid_") for item in imports)
    assert [set(item["import"]) for item in imports] == [{"fmnist_dpmerf"}, {"mnist_dpsinkhorn"}]
    # the generators of 83ae335 have ledgers older than content_sha256: pinned to the hashes
    # their results set recorded; DP-MERF's ledgers have it
    provenance = json.loads(
        (REPO / "results-paper-scale/mnist-paper-setting-h100/provenance.json").read_text()
    )
    assert imports[1]["pins"] == {
        e: provenance["experiments"][e]["generator"]["sha256"] for e in imports[1]["import"]
    }
    assert not imports[0]["pins"]
    config = window.load_config([loaded["config_path"]])
    targets = window.item_targets(config, loaded["work"][0])
    # the whole evaluation: FID and the three classifiers, five seeds
    assert targets[0] == "results/paper/nonprivate/real_mnist/fid_seed0.json" and len(targets) == 20
    assert not any(item["long"] for item in loaded["work"][:-1])
    assert loaded["work"][-1]["name"] == "sound_budget" and not loaded["work"][-1]["long"]


@pytest.mark.parametrize("steps_off", [0, 1])
def test_export_set_from_an_archive_and_imported_generator(tmp_path, capsys, steps_off):
    """--export-set (no work): the archive's cells become a results set with provenance;
    an imported generator is copied once and its source and sha256 recorded. A ledger
    whose steps are not the config's leaves the set's files without a table, and says why
    in one line."""
    (tmp_path / "tiny.yaml").write_text(TINY.replace("DATA", str(tmp_path / "data")))
    (tmp_path / "w.yaml").write_text(
        "configfile: tiny.yaml\nwork:\n  - {name: fid, import: {mnist_dpsinkhorn: run1}}\n"
    )
    source = tmp_path / "committed" / "run1"
    ledger = {
        "sigma": 1.5,
        "steps": DP_STEPS + steps_off,
        "clipping": "batch",
        "clip": 0.5,
        "batch_size": 50,
        "delta": 1e-5,
        "epsilon": 0.23,
        "guarantee": "none: the noise seed is public",
        "content_sha256": hashlib.sha256(b"weights").hexdigest(),
    }
    fileio.write_json(source / "privacy.json", ledger)
    fileio.write_bytes(source / "generator.pt", b"weights")
    work = tmp_path / "work"
    loaded = window.load_window(tmp_path / "w.yaml")
    config = window.load_config([loaded["config_path"]])
    state = {
        "calls": [
            {
                "call": 1,
                "device": "NVIDIA H100 80GB HBM3 (torch 2.11)",
                "commit": "abc1234",
                "started": "s",
                "finished": "2026-11-25T00:00:00",
                "outcome": "done",
            }
        ]
    }
    window_imports.import_generators(loaded["work"][0], config, work, tmp_path / "committed", state)
    window_imports.import_generators(loaded["work"][0], config, work, None, state)  # once: no root
    fileio.write_json(
        work / "results/window/mnist_dpsinkhorn/acc_logreg_seed0.json", {"accuracy": 0.5}
    )
    fileio.write_json(work / "results/window/mnist_dpsinkhorn/fid_seed0.json", {"fid": 12.0})
    phases = {p: {"commit": "abc1234", "code_sha256": "0" * 64} for p in ("fid", "logreg")}
    fileio.write_json(work / "results/window/mnist_dpsinkhorn/evaluate_phases.json", phases)
    fileio.write_json(work / window.STATE, state)
    fileio.pack(work, tmp_path / "state.tgz", window_setup.DEFAULT_EXCLUDE, part_mib=15)
    from dpsinkhorn.cli import main

    code = main(
        [
            "gpu-window",
            "--config",
            str(tmp_path / "w.yaml"),
            "--archive-in",
            str(tmp_path / "state.tgz"),
            "--export-set",
            str(tmp_path / "sets"),
        ]
    )
    assert code == 0
    set_dir = tmp_path / "sets" / "h100-abc1234"
    provenance = json.loads((set_dir / "provenance.json").read_text())
    imported = provenance["experiments"]["mnist_dpsinkhorn"]["generator"]
    assert imported["source"] == "run1" and imported["bytes"] == len(b"weights")
    assert provenance["experiments"]["mnist_dpsinkhorn"]["phases"] == phases
    warning = f"warning: results set {set_dir} not rendered: "
    if steps_off:
        assert not (set_dir / "table1.md").exists()
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith(warning)]
        assert "steps" in line, line
    else:
        assert "| 50.0 (1/1 seed)" in (set_dir / "table1.md").read_text()
        assert warning not in capsys.readouterr().err
    assert not (set_dir / "mnist_dpsinkhorn" / "generator.pt").exists()


def test_items_are_independent_and_an_import_is_never_retrained(tmp_path):
    """A failing item (an imported generator.pt that cannot be loaded) is recorded and the
    next item still runs; the imported generator is never trained again although its
    dataset is prepared after the import (what retrained one on an H200 at 0b9279e:
    Snakemake judges files it did not make by modification time); a call that ends with a
    failed item still packs its archive; the next call tries the failed item last."""
    config = TINY.replace("DATA", str(tmp_path / "data")) + (
        "  real_mnist: {dataset: mnist, table1_row: real, method: real_data}\n"
    )
    (tmp_path / "tiny.yaml").write_text(config)
    (tmp_path / "window.yaml").write_text(
        "configfile: tiny.yaml\nsignal_grace_s: 30\nwork:\n"
        "  - {name: broken, import: {mnist_dpsinkhorn: run1}}\n"
        "  - {name: real, experiments: [real_mnist]}\n"
    )
    source = tmp_path / "committed" / "run1"
    digest = hashlib.sha256(b"not a generator").hexdigest()  # as its ledger says: imported
    fileio.write_json(
        source / "privacy.json", {"sigma": 1.5, "steps": DP_STEPS, "content_sha256": digest}
    )
    fileio.write_bytes(source / "generator.pt", b"not a generator")
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "Inception weights")
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    states = []
    for k in range(2):
        cmd = [
            sys.executable,
            "-m",
            "dpsinkhorn",
            "gpu-window",
            "--config",
            str(tmp_path / "window.yaml"),
            "--archive-out",
            str(tmp_path / f"s{k}.tgz"),
            "--budget-s",
            "600",
            "--reserve-s",
            "0",
            "--commit",
            "test",
            "--import-root",
            str(tmp_path / "committed"),
            "--snakemake-config",
            f"data_mirror={mirror}",
            f"fid_weights={weights}",
        ]
        if k:
            cmd += ["--archive-in", str(tmp_path / "s0.tgz")]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        assert result.returncode == 1, result.stdout + result.stderr  # an item failed
        states.append(final_state(tmp_path / f"s{k}.tgz", tmp_path / f"state{k}"))
    first = json.loads((states[0] / window.STATE).read_text())
    assert first["calls"][0]["outcome"] == "failed:broken"
    assert first["items"]["broken"]["failures"] == 1 and first["items"]["real"]["outcome"] == "done"
    real = states[0] / "results/window/nonprivate/real_mnist"
    assert (real / "fid_seed0.json").is_file() and (real / "acc_logreg_seed0.json").is_file()
    log = (states[1] / "window.log").read_text()
    assert "--experiment mnist_dpsinkhorn" not in log  # never trained: it was imported
    assert "rule train:" not in log
    second = json.loads((states[1] / window.STATE).read_text())
    assert second["items"]["broken"]["failures"] == 2
    assert not (states[1] / "results/window/mnist_dpsinkhorn/generator.pt").exists()  # not packed


def test_imports_are_checked_against_their_ledgers(tmp_path):
    """An import is copied only when generator.pt's sha256 is its ledger's content_sha256
    (or, for a ledger without it, the window file's pin) and train_log.csv's its
    train_log_sha256; otherwise one line naming the file, and nothing is copied."""
    (tmp_path / "tiny.yaml").write_text(TINY.replace("DATA", str(tmp_path / "data")))
    source = tmp_path / "committed" / "run1"
    fileio.write_bytes(source / "generator.pt", b"weights")
    fileio.write_bytes(source / "train_log.csv", b"step,epsilon\n4,0.5\n")
    sha = {
        n: hashlib.sha256((source / n).read_bytes()).hexdigest()
        for n in ("generator.pt", "train_log.csv")
    }
    config = window.load_config([tmp_path / "tiny.yaml"])

    def attempt(ledger: dict, pin: str | None = None) -> Path:
        fileio.write_json(source / "privacy.json", ledger)
        value = "run1" if pin is None else f"{{source: run1, sha256: {pin}}}"
        imports = f"{{name: fid, import: {{mnist_dpsinkhorn: {value}}}}}"
        (tmp_path / "w.yaml").write_text(f"configfile: tiny.yaml\nwork:\n  - {imports}\n")
        item = window.load_window(tmp_path / "w.yaml")["work"][0]
        work = tmp_path / f"work{len(list(tmp_path.glob('work*')))}"
        window_imports.import_generators(item, config, work, tmp_path / "committed", {})
        return work / "results/window/mnist_dpsinkhorn"

    def refused(match: str, ledger: dict, pin: str | None = None) -> None:
        with pytest.raises(window_imports.ImportRefused, match=match) as err:
            attempt(ledger, pin)
        assert "\n" not in str(err.value)
        assert not list(tmp_path.glob("work*/results/window/mnist_dpsinkhorn/*"))

    both = {"content_sha256": sha["generator.pt"], "train_log_sha256": sha["train_log.csv"]}
    dest = attempt(both)
    assert (dest / "generator.pt").read_bytes() == b"weights"
    assert (dest / "train_log.csv").read_bytes() == (source / "train_log.csv").read_bytes()
    shutil.rmtree(tmp_path / "work0")
    other = "f" * 64
    refused(
        r"run1/generator.pt: .*sha256 differs from content_sha256",
        {**both, "content_sha256": other},
    )
    refused(
        r"run1/train_log.csv: .*differs from train_log_sha256", {**both, "train_log_sha256": other}
    )
    refused(r"run1/generator.pt: its ledger records no content_sha256.*pin it", {})
    refused(r"run1/generator.pt: .*the sha256 the window file pins", {}, pin=other)
    refused(r"run1/generator.pt: .*the sha256 the window file pins", both, pin=other)
    pinned = attempt({}, pin=sha["generator.pt"])  # an old ledger: the pin checks it
    assert (pinned / "generator.pt").read_bytes() == b"weights"
    assert not (pinned / "train_log.csv").exists()  # nothing checks it: not imported
    with pytest.raises(ValueError, match=r"import\.mnist_dpsinkhorn: give a source folder"):
        attempt({}, pin="not-hex")


def test_repo_sources_import_the_committed_dpmerf_generators(tmp_path):
    """A ``repo:`` import source is a folder of this repository (it travels with the tree):
    window.yaml's DP-MERF items import the committed generators with no --import-root,
    each checked against its ledger, the bytes copied the bytes committed."""
    loaded = window.load_window(REPO / "benchmarks" / "gpu" / "window.yaml")
    config = window.load_config([loaded["config_path"]])
    items = [i for i in loaded["work"] if any(s.startswith("repo:") for s in i["import"].values())]
    state: dict = {}
    for item in items:
        window_imports.import_generators(item, config, tmp_path, None, state)
    assert set(state["imports"]) == {"fmnist_dpmerf"}  # MNIST's row is in mnist-dpmerf-h100
    for item in items:
        for exp, source in item["import"].items():
            committed = REPO / source.removeprefix("repo:")
            ledger = json.loads((committed / "privacy.json").read_text())
            assert state["imports"][exp]["sha256"] == ledger["content_sha256"]
            copied = tmp_path / "results" / config["run_name"] / exp
            for name in ("generator.pt", "privacy.json", "train_log.csv"):
                assert (copied / name).read_bytes() == (committed / name).read_bytes(), name
