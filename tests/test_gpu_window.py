"""benchmarks/gpu/window.py on the CPU: its window file, what it starts in the time left (at
the committed measured step rates), stopping a command at the deadline, the archive's pack →
resume round trip, and calls in Snakemake's dry mode that resume from the last call's
archive and export the finished cells as a results set; benchmarks/gpu/call.sh's device
call, its archive in parts resumed by the next call. The record's round trip through a
real training split over calls: tests/test_trainings.py."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, require_shared, shared_path

from dpsinkhorn import config as cfg
from dpsinkhorn import fileio
from dpsinkhorn.report.resultset import render

spec = importlib.util.spec_from_file_location("gpu_window", REPO / "benchmarks/gpu/window.py")
window = importlib.util.module_from_spec(spec)
spec.loader.exec_module(window)

PAPER = REPO / "config" / "config.yaml"
#: The step rates the paper config's SLURM requests use (measured, in a committed results set).
RATES = REPO / cfg.load_config([PAPER])["cluster"]["step_rates"]


@pytest.fixture(autouse=True)
def _commit_env(monkeypatch):
    """Each test starts without a commit in the environment (a call sets it) and leaves none."""
    monkeypatch.delenv(window.COMMIT_ENV, raising=False)


def _window_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "w.yaml").write_text(text)
    return tmp_path / "w.yaml"


SMOKE = "configfile: config/smoke.yaml\n"


@pytest.mark.parametrize(
    "text, said",
    [
        (SMOKE + "experiments: [real_mnist]\nwork: []\n", "unknown key 'work'"),
        (SMOKE + "experiments: [nope]\n", "experiments: 'nope' is not in"),
        (SMOKE + "experiments: real_mnist\n", "experiments: 'real_mnist' is not a list"),
        (SMOKE, "not a window file"),
        (SMOKE + "experiments: [real_mnist]\noverrides: [seeds=1]\n", "overrides: 'seeds=1'"),
        ("configfile: c.yaml\nexperiments: [real_mnist]\n", "data_dir /private is not inside"),
    ],
)
def test_window_file_errors_name_the_key(tmp_path, capsys, text, said):
    smoke = (REPO / "config/smoke.yaml").read_text()
    (tmp_path / "c.yaml").write_text(smoke.replace("data_dir: data", "data_dir: /private"))
    path = _window_file(tmp_path, text)
    with pytest.raises(ValueError, match=said):
        window.load_window(path)
    assert window.main(["--window", str(path), "--minutes", "1", "--archive-out", "a"]) == 2
    err = capsys.readouterr().err
    assert said.split("'")[0] in err and len(err.strip().splitlines()) == 1


def test_paper_window_file_loads_in_order():
    loaded = window.load_window(REPO / "benchmarks/gpu/window.yaml")
    assert loaded["config_path"] == PAPER.resolve()
    exps = loaded["experiments"]
    assert exps[:3] == ["mnist_dpsinkhorn_eps10", "real_mnist", "fmnist_dpmerf"]
    assert len(set(exps)) == len(exps) and set(loaded["start_unmeasured"]) <= set(exps)
    assert set(loaded["imports"]) == {"fmnist_dpmerf"}


def test_an_import_is_copied_only_when_its_ledger_hashes_match(tmp_path):
    """The committed DP-MERF generator, log and ledger are copied byte for byte; a copy
    whose generator differs from its ledger's content_sha256 is refused."""
    source = REPO / "results-paper-scale/dpmerf-cpu/fmnist_dpmerf"
    text = f"configfile: {PAPER}\nexperiments: [fmnist_dpmerf]\nimports:\n"
    loaded = window.load_window(_window_file(tmp_path, f"{text}  fmnist_dpmerf: {source}\n"))
    config = cfg.load_config([PAPER])
    window.import_runs(loaded, tmp_path / "w")
    dest = cfg.experiment_dir(config, tmp_path / "w/results/paper", "fmnist_dpmerf")
    for name in ("generator.pt", "train_log.csv", "privacy.json"):
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert window.trained(config, tmp_path / "w", "fmnist_dpmerf")
    shutil.copytree(source, tampered := tmp_path / "tampered")
    (tampered / "generator.pt").write_bytes((source / "generator.pt").read_bytes() + b"x")
    loaded = window.load_window(_window_file(tmp_path, f"{text}  fmnist_dpmerf: {tampered}\n"))
    with pytest.raises(ValueError, match="generator.pt: sha256 is not its ledger's content"):
        window.import_runs(loaded, tmp_path / "w2")
    assert not (tmp_path / "w2").exists()
    bad = f"{text}  fmnist_dpmerf: {tmp_path}\n"
    with pytest.raises(ValueError, match="imports: fmnist_dpmerf: .* holds no privacy.json"):
        window.load_window(_window_file(tmp_path, bad))


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_minutes_no_call_can_work_with_are_refused(value, capsys):
    with pytest.raises(SystemExit) as stop:
        window.parse_args(["--archive-out", "a", "--minutes", value])
    assert stop.value.code == 2 and f"--minutes {float(value)}" in capsys.readouterr().err


def test_a_training_starts_only_when_it_fits_at_its_measured_rate(tmp_path):
    """The paper's MNIST training: its steps at the measured steps/s of one run at B = 50."""
    config, rates = cfg.load_config([PAPER]), window.load_rates(RATES)
    (rate,) = [r["steps_per_s"] for r in rates if (r["batch_size"], r["runs"]) == (50, 1)]
    minutes = cfg.experiment(config, "mnist_dpsinkhorn")["steps"] / rate / 60
    refuse = lambda exp, left_s: window.training_refusal(  # noqa: E731
        config, rates, tmp_path, exp, left_s
    )
    assert refuse("mnist_dpsinkhorn", (minutes + 0.1) * 60) is None
    assert refuse("mnist_dpsinkhorn", (minutes - 0.1) * 60) == (
        f"mnist_dpsinkhorn: {minutes:.1f} min of training, {minutes - 0.1:.1f} min left"
    )
    # B = 500: no measured rate for its step shape, never guessed
    assert "no measured step rate" in refuse("mnist_nonprivate", 1e9)
    # named by the window file's start_unmeasured: it starts, however little time is left
    exp = "mnist_nonprivate"
    assert window.training_refusal(config, rates, tmp_path, exp, 1, True) is None
    # started in an earlier call (its private workspace is here): it resumes, whatever is left
    workspace = cfg.experiment_dir(config, tmp_path / "results/paper", "mnist_dpsinkhorn")
    (workspace / "private_workspace").mkdir(parents=True)
    assert refuse("mnist_dpsinkhorn", 1) is None


def test_an_evaluation_starts_only_when_its_next_phase_fits(tmp_path):
    """Sampling and the next unsaved phase, at the seconds the jobs' logs show."""
    config = cfg.load_config([REPO / "config" / "smoke.yaml"])
    logs = tmp_path / "results/smoke" / cfg.LOGS_DIR
    logs.mkdir(parents=True)
    (logs / "evaluate_real_mnist.log").write_text(
        "[01:00:00] sample: 10.0 s\n[01:00:40] fid: 40.0 s\n[01:02:00] classify_cnn: 80.5 s\n"
    )
    measured = {"fid": 45.0}
    refuse = lambda left_s: window.evaluation_refusal(  # noqa: E731
        config, tmp_path, "real_mnist", left_s, measured
    )
    assert refuse(55) is None and refuse(54) == "real_mnist: fid takes 55 s, 54 s left"
    assert measured == {"sample": 10.0, "fid": 45.0, "classify_cnn": 80.5}  # the longest kept
    scores = cfg.evaluation_dir(config, tmp_path / "results/smoke", "real_mnist")
    (scores / "evaluate_progress.json").parent.mkdir(parents=True)
    (scores / "evaluate_progress.json").write_text(json.dumps({"done": {"fid": {}}}))
    assert refuse(54) is None  # fid saved; logreg never measured: it starts
    done = {"done": {"fid": {}, "logreg": {}, "mlp": {}}}
    (scores / "evaluate_progress.json").write_text(json.dumps(done))
    assert refuse(90) == "real_mnist: classify_cnn takes 90 s, 90 s left"


def test_a_command_is_stopped_at_the_deadline(tmp_path):
    """SIGTERM at the deadline; a command that ignores it is killed after the grace."""
    log = tmp_path / "log"
    begin = time.monotonic()
    assert window.run_until(["sleep", "30"], begin + 1, 5, log, tmp_path) == "deadline"
    assert time.monotonic() - begin < 5
    stubborn = ["bash", "-c", "trap '' TERM; sleep 30"]
    begin = time.monotonic()
    assert window.run_until(stubborn, begin + 1, 1, log, tmp_path) == "deadline"
    assert time.monotonic() - begin < 8
    assert window.run_until(["false"], begin + 60, 1, log, tmp_path) == "failed"
    assert window.run_until(["true"], begin + 60, 1, log, tmp_path) == "done"
    assert log.read_text().count("$ ") == 4


def test_archive_round_trip(tmp_path):
    """What the next call needs comes back byte for byte; what a call rebuilds is left out,
    the training record never."""
    work = tmp_path / "work"
    files = {
        "results/run/e/privacy.json": b'{"epsilon": 1}',
        "results/run/e/private_workspace/checkpoint.pt": os.urandom(300_000),
        "data/trainings/0123.jsonl": b'{"event": "started"}\n',
        ".snakemake/metadata/abc": b"{}",
    }
    rebuilt = {"data/mnist/train.npz": b"x", "results/run/e/samples_seed0.npz": b"y"}
    rebuilt[".snakemake/locks/0.input.lock"] = b""
    for rel, data in {**files, **rebuilt}.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    archive = tmp_path / "out" / "state.tgz"
    size = window.pack(work, archive, ["data/trainings/*"])
    assert size == archive.stat().st_size > 300_000
    assert sorted(p.name for p in archive.parent.iterdir()) == ["state.tgz"]
    window.unpack(archive, fresh := tmp_path / "fresh")
    back = {
        p.relative_to(fresh).as_posix(): p.read_bytes() for p in fresh.rglob("*") if p.is_file()
    }
    assert back == files
    archive.write_bytes(archive.read_bytes()[:100])  # cut short
    with pytest.raises(ValueError, match="not a readable tar.gz"):
        window.unpack(archive, tmp_path / "cut")
    with pytest.raises(FileNotFoundError, match="no archive"):
        window.unpack(tmp_path / "none.tgz", tmp_path / "cut")


def _set_with_real_mnist() -> Path:
    """A committed results set of config/quick.yaml holding real_mnist's cells."""
    for path in sorted(REPO.glob("results-paper-scale/*/provenance.json")):
        if json.loads(path.read_text())["config"] == "config/quick.yaml":
            if (path.parent / "real_mnist" / "fid_seed0.json").is_file():
                return path.parent / "real_mnist"
    pytest.fail("no committed results set of config/quick.yaml with real_mnist")


def test_calls_resume_from_the_archive_and_export_the_finished_cells(tmp_path, capsys, monkeypatch):
    """Call 1 (Snakemake's dry mode): real_mnist's evaluation and mnist_dpsinkhorn's
    training (2,000 steps at the measured rate) would start, mnist_dpmerf (no measured rate)
    waits. Call 2, in a fresh folder from call 1's archive, finds real_mnist's cells (a
    committed run's files) and exports them as a results set with provenance (device,
    commit, date, both calls) that renders; a third call past its deadline starts nothing and
    still packs."""
    exps = "[real_mnist, mnist_dpsinkhorn, mnist_dpmerf]"
    path = _window_file(tmp_path, f"configfile: config/quick.yaml\nexperiments: {exps}\n")
    out = tmp_path / "out"
    monkeypatch.setenv(window.COMMIT_ENV, "abc1234")
    argv = ["--window", str(path), "--archive-out", str(out / "state.tgz"), "--rates", str(RATES)]
    assert (
        window.main([*argv, "--minutes", "5", "--dry-run", "--workdir", str(tmp_path / "w1")]) == 0
    )
    said = capsys.readouterr().out
    assert "call 1: waiting" in said and "real_mnist: would start" in said
    assert "mnist_dpsinkhorn: would start" in said
    assert "mnist_dpmerf: not started: mnist_dpmerf: no measured step rate" in said
    assert "snakemake" in (out / "window.log").read_text()  # Snakemake's output comes back

    config = cfg.load_config([REPO / "config/quick.yaml"])
    work = tmp_path / "w2"
    scores = cfg.evaluation_dir(config, work / "results/quick", "real_mnist")
    shutil.copytree(_set_with_real_mnist(), scores)
    argv2 = [
        *argv,
        "--archive-in",
        str(out / "state.tgz"),
        "--results-set",
        str(out / "real-mnist-cpu"),
    ]
    assert window.main([*argv2, "--minutes", "5", "--dry-run", "--workdir", str(work)]) == 0
    assert "call 2: waiting" in capsys.readouterr().out
    provenance = json.loads((out / "real-mnist-cpu/provenance.json").read_text())
    device = provenance["device"]  # torch's words
    assert device.startswith("cpu, ") and "torch" in device and provenance["commit"] == "abc1234"
    assert provenance["date"] == provenance["calls"][-1]["finished"][:10]
    assert [c["call"] for c in provenance["calls"]] == [1, 2]
    assert provenance["experiments"] == {
        "real_mnist": {"evaluated_in": {"call": 2, "device": device, "commit": "abc1234"}}
    }
    copied = sorted(p.name for p in (out / "real-mnist-cpu/real_mnist").iterdir())
    assert copied == sorted(p.name for p in scores.iterdir())
    render(out / "real-mnist-cpu", [REPO / "config/quick.yaml"])  # it is a results set
    assert "real_mnist" in (out / "real-mnist-cpu/table1.md").read_text().lower()

    argv3 = [*argv, "--archive-in", str(out / "state.tgz"), "--minutes", "0.5"]
    argv3 += ["--results-set", str(out / "real-mnist-cpu")]
    assert window.main(argv3) == 0  # 30 s: within the time kept for stopping and packing
    said = capsys.readouterr().out
    assert "call 3: deadline" in said
    provenance = json.loads((out / "real-mnist-cpu/provenance.json").read_text())
    assert [c["outcome"] for c in provenance["calls"]] == ["waiting", "waiting", "deadline"]
    window.unpack(out / "state.tgz", last := tmp_path / "last")
    state = json.loads((last / window.STATE).read_text())
    assert [c["outcome"] for c in state["calls"]] == ["waiting", "waiting", "deadline"]
    assert state["finished"] == {
        "real_mnist": provenance["experiments"]["real_mnist"]["evaluated_in"]
    }


def test_the_record_store_travels_in_the_archive_unless_another_is_named(
    tmp_path, monkeypatch, capsys
):
    """With no DPSINKHORN_RECORD_STORE the window's trainings record into ``record-store/``
    of the working folder, which the archive keeps; a store named by the environment stays
    where it is."""
    from dpsinkhorn.privacy.record_store import STORE_ENV

    monkeypatch.delenv(STORE_ENV)
    path = _window_file(tmp_path, SMOKE + "experiments: [real_mnist]\n")
    work, out = tmp_path / "w", tmp_path / "out"
    for name in ("record-store/key", "record-store/trainings/t.npz", "r/samples_seed0.npz"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(b"private")
    argv = ["--window", str(path), "--archive-out", str(out / "state.tgz"), "--minutes", "0.5"]
    assert window.main([*argv, "--workdir", str(work)]) == 0
    assert "call 1: deadline" in capsys.readouterr().out
    assert os.environ[STORE_ENV] == str(work / window.STORE_FOLDER)
    window.unpack(out / "state.tgz", last := tmp_path / "last")
    assert (last / "record-store/trainings/t.npz").read_bytes() == b"private"
    assert (last / "record-store/key").is_file() and not (last / "r/samples_seed0.npz").exists()

    monkeypatch.setenv(STORE_ENV, str(tmp_path / "elsewhere"))
    (work / "record-store/trainings/t.npz").unlink()
    assert window.main([*argv, "--workdir", str(work)]) == 0
    window.unpack(out / "state.tgz", again := tmp_path / "again")
    assert not (again / "record-store/trainings").exists()


def test_a_failed_experiment_is_recorded_and_comes_last_in_the_next_call(tmp_path, capsys):
    """Each experiment is its own Snakemake call: one that fails (here a config value the
    workflow refuses) is recorded and the next one starts; the call exits 1; in the next
    call the experiments that failed come after the others."""
    out = tmp_path / "out"
    argv = ["--minutes", "5", "--dry-run", "--config"]
    argv += ["precision=fp8", "--archive-out", str(out / "state.tgz")]
    unmeasured = "start_unmeasured: [mnist_dpsinkhorn, mnist_nonprivate]\n"
    path = _window_file(
        tmp_path, f"{SMOKE}{unmeasured}experiments: [real_mnist, mnist_dpsinkhorn]\n"
    )
    assert window.main([*argv, "--window", str(path)]) == 1
    assert "call 1: failed:real_mnist,mnist_dpsinkhorn" in capsys.readouterr().out
    exps = "[real_mnist, mnist_dpsinkhorn, mnist_nonprivate]"
    path = _window_file(tmp_path, f"{SMOKE}{unmeasured}experiments: {exps}\n")
    assert window.main([*argv, "--window", str(path), "--archive-in", str(out / "state.tgz")]) == 1
    started = [
        Path(line.split()[-1]).parent.name  # each command's last target: in its experiment's folder
        for line in (out / "window.log").read_text().splitlines()
        if line.startswith("$ ")
    ]
    assert started == [
        "real_mnist",
        "mnist_dpsinkhorn",
        "mnist_nonprivate",
        "real_mnist",
        "mnist_dpsinkhorn",
    ]


def test_a_dp_experiment_trained_in_a_call_is_released_into_the_results_set(tmp_path, capsys):
    """A real call: the smoke config's mnist_dpsinkhorn with a secret noise key, trained and
    evaluated on the CPU, exported with its release: the generator the ledger proves, the
    ledger, log, scores and the manifest (whose samples, left behind, it names by hash)."""
    data = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "the MNIST mirror")
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "the Inception weights")
    smoke = (REPO / "config/smoke.yaml").read_text()
    (tmp_path / "c.yaml").write_text(smoke.replace("reproducible: true", "reproducible: false"))
    text = "configfile: c.yaml\nexperiments: [mnist_dpsinkhorn]\n"
    path = _window_file(tmp_path, f"{text}start_unmeasured: [mnist_dpsinkhorn]\n")
    out, work = tmp_path / "out", tmp_path / "w"
    argv = ["--window", str(path), "--archive-out", str(out / "state.tgz")]
    argv += ["--minutes", "30", "--workdir", str(work), "--results-set", str(out / "set")]
    argv += ["--config", f"data_mirror={data}", f"fid_weights={weights}"]
    assert window.main(argv) == 0, (out / "window.log").read_text()[-3000:]
    assert "mnist_dpsinkhorn: done" in capsys.readouterr().out
    provenance = json.loads((out / "set/provenance.json").read_text())
    assert provenance["experiments"]["mnist_dpsinkhorn"]["release"] == "released"
    release = out / "set/mnist_dpsinkhorn/release"
    manifest = json.loads((release / "release_manifest.json").read_text())
    kinds = {f["kind"] for f in manifest["files"]}
    assert kinds == {"ledger", "generator", "train_log", "samples", "scores"}
    config = cfg.load_config([tmp_path / "c.yaml"])
    trained = cfg.experiment_dir(config, work / "results/smoke", "mnist_dpsinkhorn")
    for entry in manifest["files"]:
        file = release / entry["path"]
        if entry["kind"] == "samples":
            assert not file.exists()
        else:
            assert file.read_bytes() == (trained / Path(entry["path"]).name).read_bytes()
            assert fileio.sha256_of(file) == entry["sha256"]
    (ledger,) = [e["path"] for e in manifest["files"] if e["kind"] == "ledger"]
    assert "a secret noise key" in json.loads((release / ledger).read_text())["guarantee"]


def test_a_device_call_reports_device_commit_and_outcome_even_when_nothing_runs(tmp_path):
    """benchmarks/gpu/call.sh with no weights, data or GPU: the window trains only, here
    nothing (past its deadline at once), and call.json still says device, commit, what the
    window did; the archive comes back in parts with the results set, and the next call,
    given them, resumes from them (its call 2)."""
    env = {**os.environ, "MINUTES": "0.5", "COMMIT": "abc1234", "SETS": str(tmp_path / "sets")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for call in (1, 2):
        out = tmp_path / f"out{call}"
        env |= {"OUT": str(out), "INPUTS": str(inputs)}
        subprocess.run(["bash", "benchmarks/gpu/call.sh"], cwd=REPO, env=env, check=True)
        said = json.loads((out / "call.json").read_text())
        assert said["commit"] == "abc1234" and said["device"]
        assert said["stages"]["setup"]["weights"].endswith("--train-only")
        window_stage = said["stages"]["window"]
        assert window_stage["rc"] == "0" and f"call {call}: deadline" in window_stage["summary"]
        assert "fid_precision" not in said["stages"]  # needs the weights
        assert not (out / "state.tgz").exists()
        for part in [*out.glob("state.tgz.part*"), *out.glob("set.tgz.part*")]:
            shutil.copy(part, inputs)  # what the next call is given
        assert list(out.glob("state.tgz.part*")) and list(out.glob("set.tgz.part*"))


def test_a_device_call_joins_the_weights_and_measures_the_fid_precisions(tmp_path):
    """call.sh's FID precision stage on the CPU at a tiny size: the weights come in parts
    (a call's transfer limit), joined and checked; the JSON names each row's errors."""
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "the Inception weights")
    data = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "the MNIST mirror")
    inputs, out = tmp_path / "inputs", tmp_path / "out"
    inputs.mkdir()
    (inputs / "data").symlink_to(data)
    payload = weights.read_bytes()
    for k, start in enumerate(range(0, len(payload), 40 * 2**20)):
        (inputs / f"inception.part{k}").write_bytes(payload[start : start + 40 * 2**20])
    env = {**os.environ, "OUT": str(out), "INPUTS": str(inputs), "STAGES": "fid_precision"}
    env |= {"FID_ARGS": "--num 4 --num-test 4 --device cpu --pytorch-fid-rows 0", "COMMIT": "c"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    subprocess.run(["bash", "benchmarks/gpu/call.sh"], cwd=REPO, env=env, check=True)
    call = json.loads((out / "call.json").read_text())
    assert call["stages"]["setup"]["weights"] == "joined" and "window" not in call["stages"]
    assert call["stages"]["fid_precision"]["rc"] == "0"
    rows = json.loads((out / "fid_precision.json").read_text())["rows"]
    assert set(rows) == {"real_mnist", "results-paper-scale/dpmerf-cpu/mnist_dpmerf/generator.pt"}
    for row in rows.values():
        assert row["tf32"]["absolute_error"] == 0  # the same arithmetic off CUDA
        assert 0 < row["fp16"]["relative_error"] < 1e-2


def test_an_imported_generator_is_evaluated_not_retrained(tmp_path, capsys):
    """A real call on the CPU (the smoke config's evaluation sizes): the committed DP-MERF
    generator is imported, its data prepared alone first (in the same Snakemake call the
    rebuilt data would rerun its training), then only evaluated: the generator and ledger in
    the working folder are still the committed files."""
    data = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "the MNIST mirror")
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "the Inception weights")
    source = REPO / "results-paper-scale/dpmerf-cpu/mnist_dpmerf"
    smoke = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    smoke["experiments"]["mnist_dpmerf"] = {"dataset": "mnist", "method": "dpmerf"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(smoke))
    text = "configfile: c.yaml\nexperiments: [mnist_dpmerf]\n"
    path = _window_file(tmp_path, f"{text}imports: {{mnist_dpmerf: {source}}}\n")
    out, work = tmp_path / "out", tmp_path / "w"
    argv = ["--window", str(path), "--archive-out", str(out / "state.tgz"), "--minutes", "30"]
    argv += ["--workdir", str(work), "--config", f"data_mirror={data}", f"fid_weights={weights}"]
    assert window.main(argv) == 0, (out / "window.log").read_text()[-3000:]
    assert "mnist_dpmerf: done" in capsys.readouterr().out
    config = cfg.load_config([tmp_path / "c.yaml"])
    home = cfg.experiment_dir(config, work / "results/smoke", "mnist_dpmerf")
    for name in ("generator.pt", "privacy.json", "train_log.csv"):
        assert (home / name).read_bytes() == (source / name).read_bytes()
    assert "rule train:" not in (out / "window.log").read_text()
    assert window.finished(config, work, "mnist_dpmerf")
