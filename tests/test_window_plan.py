"""What a call of ``dpsinkhorn gpu-window`` starts and what it leaves: only work that can
finish in the allocation (a long training is never started in a short window; call 1,
without the FID weights, trains the rows with the most cells per minute first), and the
finished cells exported as a results set after every call, also one stopped at its
deadline (a stopped evaluation's phases are never shown as cells). Snakemake is replaced
by a recorder: these tests run no workflow."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from helpers import require_shared, shared_path

from dpsinkhorn import fileio, window, window_plan
from dpsinkhorn.cli import main
from dpsinkhorn.config.experiments import experiment
from dpsinkhorn.evaluate import phases

#: What the window configs of these tests share.
HEAD = """\
run_name: window
data_dir: DATA
device: cpu
seeds: [0]
evaluation: {num_samples: 60, fid_reference_size: 20, classifiers: [logreg]}
"""
CONFIG = (
    HEAD
    + """\
training_defaults: {channels: [32, 16, 8]}
experiments:
  dp_fast: {dataset: mnist, sigma: 1.5, steps: 600, batch_size: 50}
  dp_slow: {dataset: mnist, sigma: 1.5, steps: 1200, batch_size: 100}
  dp_slow2: {dataset: mnist, sigma: 1.5, steps: 1200, batch_size: 100}
  dp_slow3: {dataset: mnist, sigma: 1.5, steps: 1200, batch_size: 100}
  long_np: {dataset: mnist, method: sinkhorn, batch_size: 500, steps: 160000}
  real_mnist: {dataset: mnist, table1_row: real, method: real_data}
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper, sigma: 1.5, steps: 600}
"""
)
#: Step rates of the three training shapes (made up for the test: 10, 5 and 105 steps/s
#: give 1 min, 4 min and 25.4 min of training).
RATES = {"dp_fast": 10.0, "dp_slow": 5.0, "long_np": 105.0}


def setup(tmp_path: Path, work: str) -> tuple[dict, dict]:
    (tmp_path / "c.yaml").write_text(CONFIG.replace("DATA", str(tmp_path / "data")))
    (tmp_path / "w.yaml").write_text(f"configfile: c.yaml\nwork:\n{work}")
    loaded = window.load_window(tmp_path / "w.yaml")
    config = window.load_config([loaded["config_path"]])
    rates = []
    for exp, rate in RATES.items():
        spec = experiment(config, exp)
        rates.append(
            {
                "dataset": "mnist",
                "batch_size": spec["batch_size"],
                "runs": 1,
                "steps_per_s": rate,
                "source": "test",
                "generator": "dcgan",
                "channels": [32, 16, 8],
            }
        )
    return loaded, {"rates": rates, "later_s": 0.0, "start_long": False}


def run_work(tmp_path, monkeypatch, loaded, limits, seconds, weights: Path) -> tuple[str, list]:
    """One call's work with ``seconds`` left; returns its outcome and each Snakemake call's
    targets (recorded, not run)."""
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    started = []

    def record(cmd, deadline, grace, log, cwd=None):
        started.append(cmd[cmd.index("--", cmd.index("--rerun-triggers")) + 1 :])
        return "done"

    monkeypatch.setattr(window, "run_until", record)
    state = {"calls": []}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    outcome = window.work(
        loaded,
        work,
        time.monotonic() + seconds,
        [f"data_mirror={mirror}", f"fid_weights={weights}"],
        None,
        "1",
        state,
        tmp_path / "log",
        limits,
    )
    return outcome, started, state


def test_a_long_training_is_not_started_in_a_short_window(tmp_path, monkeypatch):
    loaded, limits = setup(
        tmp_path,
        "  - {name: np, experiments: [long_np]}\n  - {name: slow, experiments: [dp_slow]}\n",
    )
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"w")
    outcome, started, state = run_work(tmp_path, monkeypatch, loaded, limits, 90, weights)
    assert started == [] and outcome == "waiting"  # nothing could finish: nothing ran
    items = state["items"]
    assert "long_np: 25.4 min of training, needs a cluster" in items["np"]["outcome"]
    assert re.search(r"dp_slow: 4.0 min of training, 1\.\d min left", items["slow"]["outcome"])
    # the allocation's later calls count: 4 minutes fit
    outcome, started, _ = run_work(
        tmp_path, monkeypatch, loaded, {**limits, "later_s": 300}, 90, weights
    )
    assert [t[0].split("/")[-2] for t in started] == ["dp_slow"]
    # asked for (--start-long): the long training starts
    _, started, _ = run_work(
        tmp_path, monkeypatch, loaded, {**limits, "start_long": True}, 90, weights
    )
    assert ["long_np" in t[0] for t in started] == [True, False]


def test_call_one_trains_most_cells_per_minute_first(tmp_path, monkeypatch):
    loaded, limits = setup(
        tmp_path,
        "  - {name: slow, experiments: [dp_slow, long_np]}\n"
        "  - {name: fast, experiments: [dp_fast]}\n",
    )
    outcome, started, state = run_work(
        tmp_path, monkeypatch, loaded, limits, 600, tmp_path / "not-here-yet.pth"
    )
    # no FID weights: only trainings, fewest minutes per (equal) cells first, never the long
    assert [t for targets in started for t in targets] == [
        "results/window/dp_fast/privacy.json",
        "results/window/dp_slow/privacy.json",
    ]
    assert "long_np" in state["items"]["slow"]["outcome"]


def test_a_call_whose_items_wait_for_what_has_not_arrived_is_not_done(tmp_path, monkeypatch):
    """Call 1 trains what it can while the FID weights travel; its evaluations still wait,
    so the call ends ``waiting``, never ``done`` (the work list is not done); the same for
    an item whose dataset has not arrived."""
    loaded, limits = setup(tmp_path, "  - {name: fast, experiments: [dp_fast]}\n")
    outcome, started, state = run_work(
        tmp_path, monkeypatch, loaded, limits, 600, tmp_path / "not-here-yet.pth"
    )
    assert started == [["results/window/dp_fast/privacy.json"]]
    assert outcome == "waiting" and "FID weights" in state["items"]["fast"]["outcome"]
    loaded["overrides"] = []
    monkeypatch.setattr(window, "run_until", lambda *a, **k: "done")
    state = {"calls": []}
    outcome = window.work(
        loaded,
        tmp_path / "w2",
        time.monotonic() + 60,
        [],
        None,
        "1",
        state,
        tmp_path / "log",
        limits,
    )
    assert outcome == "waiting" and "dataset mnist" in state["items"]["fast"]["outcome"]


def test_call_one_starts_no_training_that_the_earlier_ones_left_no_time_for(tmp_path, monkeypatch):
    """Three 4-minute trainings, each of which fits the call's 10 minutes, run one after
    another while the FID weights travel: the third would start with 2 minutes left, so it
    is not started (the clock advances as each training takes its measured minutes)."""
    loaded, limits = setup(
        tmp_path,
        "  - {name: a, experiments: [dp_slow]}\n"
        "  - {name: b, experiments: [dp_slow2]}\n"
        "  - {name: c, experiments: [dp_slow3]}\n",
    )
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    now, started = [1000.0], []

    def train(cmd, deadline, grace, log, cwd=None):
        targets = cmd[cmd.index("--", cmd.index("--rerun-triggers")) + 1 :]
        started.extend(t.split("/")[-2] for t in targets)
        now[0] += 240 * len(targets)  # 1,200 steps at 5 steps/s each
        return "done"

    monkeypatch.setattr(window, "run_until", train)
    monkeypatch.setattr(window, "time", type("Clock", (), {"monotonic": lambda: now[0]}))
    work, state = tmp_path / "work", {"calls": []}
    outcome = window.work(
        loaded,
        work,
        now[0] + 600,
        [f"data_mirror={mirror}", f"fid_weights={tmp_path / 'not-here.pth'}"],
        None,
        "1",
        state,
        tmp_path / "log",
        limits,
    )
    assert started == ["dp_slow", "dp_slow2"] and outcome == "waiting"
    assert re.search(r"dp_slow3: 4.0 min of training, 2.0 min left", state["items"]["c"]["outcome"])


def test_cells_exported_after_a_call_that_stops_at_its_deadline(tmp_path, monkeypatch):
    loaded, _ = setup(
        tmp_path,
        "  - {name: real, experiments: [real_mnist]}\n"
        "  - {name: dp, experiments: [mnist_dpsinkhorn]}\n",
    )
    results = "results/window"

    def stopped(win, workdir, deadline, *args):
        """real_mnist's evaluation finished; mnist_dpsinkhorn's stopped after its FID phase
        (Snakemake deleted the job's outputs; its progress and one stray file remain)."""
        fileio.write_json(workdir / results / "nonprivate/real_mnist/fid_seed0.json", {"fid": 3.0})
        fileio.write_json(
            workdir / results / "nonprivate/real_mnist/acc_logreg_seed0.json", {"accuracy": 0.9}
        )
        dp = workdir / results / "mnist_dpsinkhorn"
        fileio.write_json(dp / "evaluate_progress.json", {"key": "k", "done": {"fid": []}})
        fileio.write_json(dp / "fid_seed0.json", {"fid": 50.0})
        fileio.write_json(dp / "privacy.json", {"sigma": 1.5, "steps": 600})
        return "deadline"

    monkeypatch.setattr(window, "work", stopped)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "kernels"))
    out = tmp_path / "out"
    code = main(
        [
            "gpu-window",
            "--config",
            str(tmp_path / "w.yaml"),
            "--archive-out",
            str(out / "state.tgz"),
            "--results-set",
            str(out / "sets"),
            "--set-name",
            "cpu-test",
            "--commit",
            "abc1234",
            "--device-name",
            "cpu (test)",
            "--budget-s",
            "60",
            "--reserve-s",
            "0",
        ]
    )
    assert code == 0
    set_dir = out / "sets" / "cpu-test"
    provenance = json.loads((set_dir / "provenance.json").read_text())
    assert provenance["calls"][0]["outcome"] == "deadline"
    assert set(provenance["experiments"]) == {"real_mnist"}  # finished cells only
    stamp = provenance["experiments"]["real_mnist"]["evaluated_in"]
    assert stamp == {"call": 1, "device": "cpu (test)", "commit": "abc1234"}
    assert not (set_dir / "mnist_dpsinkhorn").exists()
    assert "| 90.0 (1/1 seed)" in (set_dir / "table1.md").read_text()
    # renderable as it lies in the call's output (its config found from the checkout)
    (set_dir / "table1.md").unlink()
    monkeypatch.chdir(tmp_path)
    assert main(["report", "results-set", "--dir", str(set_dir)]) == 0
    assert (set_dir / "table1.md").is_file()
    # the stopped evaluation's phases travel on in the archive, never as cells
    back = tmp_path / "back"
    fileio.unpack(out / "state.tgz", back)
    assert (back / results / "mnist_dpsinkhorn/evaluate_progress.json").is_file()


def test_evaluation_waits_for_a_call_that_can_reach_its_next_phase(tmp_path):
    loaded, _ = setup(tmp_path, "  - {name: real, experiments: [real_mnist]}\n")
    config = window.load_config([loaded["config_path"]])
    work = tmp_path / "work"
    log = work / "results/window/logs/nonprivate/evaluate_real_mnist.log"
    log.parent.mkdir(parents=True)
    log.write_text("[10:00:00] sample: 4.1 s\n[10:02:15] fid: 135.6 s\nFID 1.0\n")
    state: dict = {}
    window_plan.measure_phases(config, work, state)
    assert state["phase_seconds"] == {"sample": 4.1, "fid": 135.6}
    why = window_plan.evaluation_refusal(config, "real_mnist", work, 100, state)
    assert why == "real_mnist: its next saved phase (fid) takes 140 s, 100 s left"
    assert window_plan.evaluation_refusal(config, "real_mnist", work, 150, state) is None
    # FID saved by this code: the next phase (Log-Reg) was never measured, so it may start
    progress = work / "results/window/nonprivate/real_mnist/evaluate_progress.json"
    fid = {"records": [], "code_sha256": phases.phase_code_sha256("fid"), "commit": "abc1234"}
    fileio.write_json(progress, {"key": "k", "done": {"fid": fid}})
    assert window_plan.evaluation_refusal(config, "real_mnist", work, 100, state) is None
    # FID saved by other code, or in the older format: the job computes it again, so the
    # plan counts it again
    for saved in ({**fid, "code_sha256": "0" * 64}, []):
        fileio.write_json(progress, {"key": "k", "done": {"fid": saved}})
        assert window_plan.evaluation_refusal(config, "real_mnist", work, 100, state) == why


@pytest.mark.parametrize("bad", ["long: 1", "outputs: [fid]"])
def test_item_keys_are_checked(tmp_path, bad):
    with pytest.raises(ValueError, match=r"work\[0\]"):
        setup(tmp_path, f"  - {{name: a, experiments: [real_mnist], {bad}}}\n")


WINDOWS_CONFIG = (
    HEAD
    + """\
training_defaults: {channels: [32, 16, 8], batch_size: 50}
experiments:
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper, sigma: 1.5, steps: 4200}
  mnist_perrow: {dataset: mnist, table1_row: perrow, sigma: 1.5, steps: 4200,
                 clipping: per_sample}
  fmnist_dpsinkhorn: {dataset: fmnist, table1_row: paper, sigma: 1.5, steps: 4200}
"""
)


def windows_setup(tmp_path: Path) -> tuple[dict, list[dict]]:
    """Three Table 1 trainings of 7 minutes each (4,200 steps at 10 steps/s)."""
    (tmp_path / "c.yaml").write_text(WINDOWS_CONFIG.replace("DATA", str(tmp_path / "data")))
    rates = [
        {
            "dataset": "mnist",
            "batch_size": 50,
            "runs": 1,
            "steps_per_s": 10.0,
            "source": "test",
            "generator": "dcgan",
            "channels": [32, 16, 8],
        }
    ]
    fileio.write_json(tmp_path / "rates.json", {"rates": rates})
    work = "  - {name: a, experiments: [mnist_dpsinkhorn]}\n"
    (tmp_path / "w.yaml").write_text(f"configfile: c.yaml\nwork:\n{work}")
    (tmp_path / "sets").mkdir()
    return window.load_config([tmp_path / "c.yaml"]), rates


def test_plan_windows_counts_trainings_that_cannot_share_an_allocation(tmp_path):
    """A training never starts in an allocation it cannot finish in: two 7-minute trainings
    never share 11 work minutes, so three need three allocations, however little the
    evaluations add (the sum of the minutes, 21.3 over 11, would say two)."""
    from dpsinkhorn.plan import plan_windows

    config, rates = windows_setup(tmp_path)
    result = plan_windows(config, rates, [], [], 0.1, 11.0)
    assert [round(r["train_minutes"], 6) for r in result["remaining"]] == [7.0, 7.0, 7.0]
    assert result["windows"] == 3
    # the evaluations fill what the trainings leave (3 x 4 minutes), then more windows
    assert plan_windows(config, rates, [], [], 4.0, 11.0)["windows"] == 3
    assert plan_windows(config, rates, [], [], 5.0, 11.0)["windows"] == 4
    # nothing to train (all imported): the evaluations' minutes alone
    imported = list(config["experiments"])
    assert plan_windows(config, rates, [], imported, 5.0, 11.0)["windows"] == 2


@pytest.mark.parametrize(
    "bad",
    [
        ["--window-work-minutes", "0"],
        ["--window-work-minutes", "-3"],
        ["--eval-minutes", "0"],
        ["--eval-minutes", "-5"],
        ["--sets", "missing"],
        ["--sets", "rates.json"],
    ],
)
def test_plan_windows_refuses_bad_input_in_one_line(tmp_path, capsys, bad):
    windows_setup(tmp_path)
    args = [
        "plan",
        "--config",
        str(tmp_path / "c.yaml"),
        "--rates",
        str(tmp_path / "rates.json"),
        "--windows",
        "--window",
        str(tmp_path / "w.yaml"),
        "--sets",
        str(tmp_path / "sets"),
        "--eval-minutes",
        "5",
    ]
    bad = [bad[0], str(tmp_path / bad[1]) if bad[0] == "--sets" else bad[1]]
    assert main([*args, *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and bad[0] in err


@pytest.mark.parametrize(
    "bad",
    [
        ["--budget-s", "-5"],
        ["--budget-s", "0"],
        ["--budget-s", "nan"],
        ["--reserve-s", "-1"],
        ["--part-mib", "0"],
        ["--later-s", "-60"],
        ["--archive-cap-mib", "0"],
        ["--archive-in", "missing.tgz"],
        ["--archive-in", "cut.tgz"],
    ],
)
def test_gpu_window_refuses_bad_input_in_one_line(tmp_path, capsys, bad):
    """A bad budget, part size or cap, or an archive that is missing or cut short, is one
    line (exit 2) before any work, and the archive a call would replace is kept."""
    loaded, _ = setup(tmp_path, "  - {name: real, experiments: [real_mnist]}\n")
    work = tmp_path / "work"
    fileio.write_json(work / "results/window/kept.json", {"kept": True})
    whole = fileio.pack(work, tmp_path / "whole.tgz", [], part_mib=15)[0].read_bytes()
    (tmp_path / "cut.tgz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "out.tgz").write_bytes(whole)
    bad = [tmp_path / b if b.endswith(".tgz") else b for b in bad]
    args = [
        "gpu-window",
        "--config",
        str(tmp_path / "w.yaml"),
        "--archive-out",
        str(tmp_path / "out.tgz"),
        "--commit",
        "abc1234",
        "--device-name",
        "cpu (test)",
        "--budget-s",
        "60",
        "--workdir",
        str(tmp_path / "w"),
        *map(str, bad),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and str(bad[-1] if bad[0] == "--archive-in" else bad[0]) in err
    )
    assert (tmp_path / "out.tgz").read_bytes() == whole
    assert not (tmp_path / "w" / window.STATE).exists()
