"""Every training of private data is counted, and a finished DP generator is never retrained
silently (``privacy.trainings``, ``train.workspace.RunFiles``, ``report.privacy_summary``).

Case: two configs give the name ``clothes`` to different data (scikit-learn's digits, and
a damaged copy). The second config's failing data job must not delete the first's prepared
data (Snakemake removes a failed job's outputs); a plain rerun of the first, unchanged
experiment must not retrain it with fresh noise; an explicit retrain is counted, and
``privacy_summary.json`` composes every training of the source, across run folders.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import digits_arrays, write_digits_npz

from dpsinkhorn import cli
from dpsinkhorn import config as config_lib
from dpsinkhorn.config.targets import TRAINING_FILES, results_dir
from dpsinkhorn.privacy import trainings
from dpsinkhorn.report.privacy_summary import privacy_summary
from dpsinkhorn.train.run import train
from dpsinkhorn.train.signals import Preempted

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_window", REPO / "benchmarks/gpu/window.py")
window = importlib.util.module_from_spec(_spec)  # the GPU-window tool's pack and resume
_spec.loader.exec_module(window)
BIN = Path(sys.executable).parent
DIGITS = [str(d) for d in range(10)]
#: A tiny DP generator on the digits: seconds on one core.
TINY = {
    "steps": 4,
    "batch_size": 50,
    "sigma": 1.5,
    "channels": [8, 4, 2],
    "log_every": 2,
    "checkpoint_every": 2,
    "reproducible": False,
}


def _config(workdir: Path, npz: Path, run: str) -> Path:
    config = {
        "run_name": run,
        "data_dir": "data",
        "device": "cpu",
        "seeds": [0],
        "datasets": {
            "clothes": {"path": str(npz), "classes": DIGITS, "image_size": 28, "resize": True}
        },
        "training_defaults": TINY,
        "experiments": {"clothes_dp": {"dataset": "clothes", "table1_row": "paper"}},
    }
    path = workdir / f"{run}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _snakemake(workdir: Path, configfile: Path, *args: str, **env: str):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **env}
    return subprocess.run(
        [
            str(BIN / "snakemake"),
            *args,
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(workdir),
            "-c",
            "1",
            "--configfile",
            str(configfile),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _snakemake_data(workdir: Path, configfile: Path) -> subprocess.CompletedProcess:
    return _snakemake(workdir, configfile, "--until", "data")


def test_a_second_config_of_the_same_name_never_deletes_the_first_ones_data(tmp_path):
    good = write_digits_npz(tmp_path / "clothes.npz")
    damaged = tmp_path / "copy" / "clothes.npz"
    damaged.parent.mkdir()
    damaged.write_bytes(good.read_bytes()[:1000])  # a truncated copy
    first, second = _config(tmp_path, good, "first"), _config(tmp_path, damaged, "second")
    done = _snakemake_data(tmp_path, first)
    assert done.returncode == 0, done.stderr[-3000:]
    prepared = sorted((tmp_path / "data").glob("*/train.npz"))
    assert len(prepared) == 1
    before = {p: p.read_bytes() for p in prepared[0].parent.iterdir()}
    failed = _snakemake_data(tmp_path, second)
    assert failed.returncode != 0  # the damaged copy is refused
    for path, content in before.items():  # the first config's files: still there, unchanged
        assert path.is_file() and path.read_bytes() == content, path
    cfg = config_lib.load_config([str(first)])
    assert prepared[0].parent.name == config_lib.prepared_folder_of(cfg, "clothes")
    other = config_lib.load_config([str(second)])
    assert config_lib.prepared_folder_of(other, "clothes") != prepared[0].parent.name


@pytest.fixture
def digits_spec() -> dict:
    return config_lib.make_experiment("clothes_dp", dataset="mnist", **TINY)


def _train(spec, out, records, **kw):
    return train(
        spec, out, train_data=digits_28(), progress=False, record_dir=records, device="cpu", **kw
    )


def digits_28() -> tuple[np.ndarray, np.ndarray]:
    images, labels = digits_arrays()
    big = np.kron(images, np.ones((1, 3, 3), np.uint8))  # [N, 24, 24]
    return np.pad(big, ((0, 0), (2, 2), (2, 2))), labels.astype(np.int64)


def test_a_finished_dp_experiment_is_not_retrained_unless_asked_and_then_counted(
    tmp_path, digits_spec
):
    out, records = tmp_path / "run" / "clothes_dp", tmp_path / "trainings"
    first = _train(digits_spec, out, records)
    (out / "generator.pt").unlink()  # as Snakemake removes a job's outputs before a rerun
    copy = trainings.finished_copy_dir(records, str(out.resolve()))
    shutil.rmtree(copy)  # without the kept copy of its release, nothing to publish again
    with pytest.raises(trainings.RetrainRefused, match="clothes_dp.*not its settings"):
        _train(digits_spec, out, records)
    assert not (out / "private_workspace").exists()  # refused before anything was written
    changed = {**digits_spec, "sigma": 2.0}
    with pytest.raises(trainings.RetrainRefused, match="changed: settings sigma"):
        _train(changed, out, records)
    second = _train(changed, out, records, retrain=True)
    assert second["content_sha256"] != first["content_sha256"]
    fingerprint = trainings.data_fingerprint(*digits_28())
    (record,) = records.glob("*.jsonl")
    assert record.name == f"{fingerprint[:16]}.jsonl"
    runs = trainings.source_trainings(records, fingerprint)
    assert [(t["finished"], t["retrain"], t["steps"]) for t in runs] == [
        (True, False, 4),
        (True, True, 4),
    ]
    both = trainings.composed(runs)
    assert both["trainings"] == 2 and both["retrained"] == 1
    assert both["epsilon_composed"] > max(first["epsilon"], second["epsilon"])


def test_a_finished_training_whose_outputs_were_removed_is_published_again(tmp_path, digits_spec):
    """SLURM cancels a job as Snakemake stores a finished training's outputs, the
    job fails and Snakemake removes them; the workspace went at finish. The retry publishes
    the kept copy of that release again (same bytes, the record's content_sha256), with no
    new training; a retrain asked for while the folder holds it trains anew."""
    out, records = tmp_path / "run" / "clothes_dp", tmp_path / "trainings"
    first = _train(digits_spec, out, records)
    before = {name: (out / name).read_bytes() for name in TRAINING_FILES}
    for name in TRAINING_FILES:
        (out / name).unlink()
    again = _train(digits_spec, out, records)
    assert {name: (out / name).read_bytes() for name in TRAINING_FILES} == before
    assert again == first and not (out / "private_workspace").exists()
    fingerprint = trainings.data_fingerprint(*digits_28())
    (done,) = trainings.source_trainings(records, fingerprint)
    assert done["finished"] and done["content_sha256"] == first["content_sha256"]
    third = _train(digits_spec, out, records, retrain=True)
    assert third["content_sha256"] != first["content_sha256"]
    runs = trainings.source_trainings(records, fingerprint)
    assert [(t["finished"], t["retrain"]) for t in runs] == [(True, False), (True, True)]


def _trained_by_cli(tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    """The digits prepared and ``clothes_dp`` trained by the CLI in ``tmp_path`` (the
    working folder now); returns the config and the train command's arguments."""
    npz = write_digits_npz(tmp_path / "clothes.npz")
    configfile = _config(tmp_path, npz, "cli")
    monkeypatch.chdir(tmp_path)
    assert (
        cli.main(["data", "--dataset", "clothes", "--root", "data", "--config", str(configfile)])
        == 0
    )
    args = [
        "train",
        "--config",
        str(configfile),
        "--experiment",
        "clothes_dp",
        "--out",
        "results/cli/clothes_dp",
        "--no-progress",
    ]
    assert cli.main(args) == 0
    return configfile, args


def test_the_cli_refuses_with_one_line_and_retrains_with_the_flag(tmp_path, capsys, monkeypatch):
    configfile, args = _trained_by_cli(tmp_path, monkeypatch)
    assert cli.main(args) == 0  # the same finished release, published again: no training
    assert "published again the finished training" in capsys.readouterr().out
    out = str((tmp_path / "results/cli/clothes_dp").resolve())
    shutil.rmtree(trainings.finished_copy_dir(tmp_path / "data" / "trainings", out))
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "clothes_dp" in err[0] and "--retrain" in err[0], err
    assert cli.main([*args, "--retrain"]) == 0
    # Another run folder of another config trains the same data: the same record.
    assert cli.main([*args[:-2], "results/other/clothes_dp", "--no-progress"]) == 0
    cfg = config_lib.load_config([str(configfile)])
    (summary,) = privacy_summary(cfg, "results/cli")["datasets"]
    every = summary["all_trainings"]
    assert every["trainings"] == 3 and every["retrained"] == 1 and every["run_folders"] == 2
    assert summary["releases"] == 1
    assert every["epsilon_composed"] > summary["epsilon_composed"]
    assert any("trained 3 times" in w for w in summary["warnings"]), summary["warnings"]


def test_a_workflow_rerun_that_is_refused_keeps_the_finished_generator(tmp_path):
    """A finished secret-key DP experiment of a workflow is never lost to a refused rerun.
    Changed settings: Snakemake is refused while it reads the workflow (one line naming the
    experiment and the key), before it could remove the outputs to rerun the job. Rewritten
    prepared data: the train job is rerun and refused, and the train rule's update()
    outputs make Snakemake put the generator, ledger and log back, byte for byte.
    DPSINKHORN_RETRAIN=<exp> then retrains it, and the record counts both trainings."""
    npz = write_digits_npz(tmp_path / "clothes.npz")
    configfile = _config(tmp_path, npz, "wf")
    target = "results/wf/clothes_dp/generator.pt"
    done = _snakemake(tmp_path, configfile, target)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "results" / "wf" / "clothes_dp"
    before = {name: (folder / name).read_bytes() for name in TRAINING_FILES}
    log = tmp_path / "results" / "wf" / "logs" / "train_clothes_dp.log"
    config = yaml.safe_load(configfile.read_text())
    changed = {**config, "training_defaults": {**config["training_defaults"], "sigma": 2.0}}
    changed_file = tmp_path / "changed.yaml"
    changed_file.write_text(yaml.safe_dump({**changed, "run_name": "wf"}, sort_keys=False))

    refused = _snakemake(tmp_path, changed_file, target)
    assert refused.returncode != 0
    assert "experiment clothes_dp" in refused.stderr and "settings sigma" in refused.stderr
    assert "DPSINKHORN_RETRAIN=clothes_dp" in refused.stderr, refused.stderr[-3000:]
    assert {name: (folder / name).read_bytes() for name in TRAINING_FILES} == before

    (prepared,) = (tmp_path / "data").glob("clothes-*/train.npz")
    os.utime(prepared)  # as if prepared again: newer than the generator, the job reruns
    rerun = _snakemake(tmp_path, configfile, target)  # same data: the same release again
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "published again the finished training" in log.read_text()
    assert {name: (folder / name).read_bytes() for name in TRAINING_FILES} == before

    again = _snakemake(tmp_path, changed_file, target, DPSINKHORN_RETRAIN="clothes_dp")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (folder / "generator.pt").read_bytes() != before["generator.pt"]
    (record,) = (tmp_path / "data" / "trainings").glob("*.jsonl")
    runs = trainings.trainings(trainings.read(record))
    assert [(t["finished"], t["retrain"], t["spec"]["sigma"]) for t in runs] == [
        (True, False, 1.5),
        (True, True, 2.0),
    ]

    # Other data under the same name: the rerun is refused and Snakemake puts the files
    # back; the next plain run says whose files they are instead of "nothing to be done".
    kept = {name: (folder / name).read_bytes() for name in TRAINING_FILES}
    images, labels = digits_arrays()
    np.savez(npz, images=images[:-50], labels=labels[:-50])
    refused = _snakemake(tmp_path, changed_file, target)
    said = log.read_text()  # not whether the data changed: a bit of the private data
    assert refused.returncode != 0 and "or its training data changed" in said
    assert "the training data (other content)" not in said and record.stem not in said
    assert {name: (folder / name).read_bytes() for name in TRAINING_FILES} == kept
    plain = _snakemake(tmp_path, changed_file, target)
    assert plain.returncode != 0 and "Nothing to be done" not in plain.stderr
    note = folder / ".dpsinkhorn.stopped"
    shown = f"{note.relative_to(tmp_path)}"
    said = plain.stderr
    assert shown in said and "holds the files of an earlier" in said, said[-3000:]
    assert "--touch" in said
    note.unlink()  # keep them as they are: the note gone, the files marked up to date
    assert _snakemake(tmp_path, changed_file, target, "--touch").returncode == 0
    kept_run = _snakemake(tmp_path, changed_file, target)
    assert kept_run.returncode == 0 and "Nothing to be done" in kept_run.stderr


# ------------------------------------------------------ the record across GPU window calls

WINDOW_CONFIG = """\
run_name: window
data_dir: {data_dir}
device: cpu
seeds: [0]
experiments:
  mnist_dpsinkhorn: {{dataset: mnist, table1_row: paper, sigma: 1.5}}
"""


def _window(tmp_path: Path, data_dir: str) -> dict:
    """A window file (and its config) that trains mnist_dpsinkhorn."""
    (tmp_path / "c.yaml").write_text(WINDOW_CONFIG.format(data_dir=data_dir))
    (tmp_path / "w.yaml").write_text("configfile: c.yaml\nexperiments: [mnist_dpsinkhorn]\n")
    return window.load_window(tmp_path / "w.yaml")


def _next_call(loaded: dict, workdir: Path, fresh: Path) -> Path:
    """What the window tool does between two calls: pack ``workdir`` with its own code and
    patterns, unpack the archive into a ``fresh`` folder (window.main)."""
    archive = workdir.parent / f"{workdir.name}.tar.gz"
    window.pack(workdir, archive, loaded["keep"])
    window.unpack(archive, fresh)
    return fresh


def _out(loaded: dict, workdir: Path) -> Path:
    config = config_lib.load_config([loaded["config_path"]])
    return config_lib.experiment_dir(config, workdir / results_dir(config), "mnist_dpsinkhorn")


@pytest.mark.parametrize("where", ["kept", "lost"])
def test_a_training_split_over_window_calls_is_one_training_and_never_retrained(
    tmp_path, where, monkeypatch
):
    """A DP training stopped at a checkpoint in one window call and finished in the next,
    each call in a fresh folder rebuilt from the last one's archive (the window's own pack,
    exclude patterns and unpack): the record holds one finished training of the experiment,
    one noise stream (one id) counted at its steps, and a retrain in a third call is
    refused. ``kept``: the record under the working folder's data/, all of which the
    archive leaves out but the record; ``lost``: the record is gone before the second
    call (its started event lost): the resumed and finished events alone still count it.
    Each call trains in its own working folder, as Snakemake's ``-d`` runs the jobs."""
    loaded = _window(tmp_path, "data")
    spec = config_lib.make_experiment("mnist_dpsinkhorn", dataset="mnist", **TINY)
    first = tmp_path / "call1"
    records = lambda workdir: workdir / "data" / trainings.RECORD_DIR  # noqa: E731
    (first / "data" / "mnist").mkdir(parents=True)
    (first / "data" / "mnist" / "train.npz").write_bytes(b"prepared arrays")
    monkeypatch.chdir(first)
    with pytest.raises(Preempted):
        _train(spec, _out(loaded, first), records(first), stop_after=2)
    second = _next_call(loaded, first, tmp_path / "call2")
    assert not (second / "data" / "mnist").exists()  # the prepared data is still left out
    if where != "lost":
        assert sorted(p.name for p in (second / "data" / "trainings").iterdir()) == [
            p.name for p in records(first).iterdir()
        ]
    if where == "lost":
        shutil.rmtree(records(second))
    monkeypatch.chdir(second)
    ledger = _train(spec, _out(loaded, second), records(second))
    assert not (_out(loaded, second) / "private_workspace").exists()

    third = _next_call(loaded, second, tmp_path / "call3")
    fingerprint = trainings.data_fingerprint(*digits_28())
    events = trainings.read(trainings.record_file(records(third), fingerprint))
    assert {e["training"] for e in events} == {events[0]["training"]}  # one noise stream
    # A record lost before the resume: the resumed training records its own "started".
    order = ["started", "finished"] if where == "lost" else ["started", "resumed", "finished"]
    assert [e["event"] for e in events] == order
    assert all(e["experiment"] == "mnist_dpsinkhorn" and e["private"] for e in events)
    (done,) = trainings.source_trainings(records(third), fingerprint)
    assert (done["experiment"], done["finished"], done["steps"]) == ("mnist_dpsinkhorn", True, 4)
    assert done["content_sha256"] == ledger["content_sha256"]
    counted = trainings.composed([done])
    assert (counted["trainings"], counted["finished"], counted["unfinished"]) == (1, 1, 0)
    assert counted["epsilon_composed"] == pytest.approx(ledger["epsilon"], rel=1e-9)
    monkeypatch.chdir(third)
    (_out(loaded, third) / "generator.pt").unlink()  # a retrain from step 0 in a later call
    with pytest.raises(trainings.RetrainRefused, match="mnist_dpsinkhorn.*not its settings"):
        _train(spec, _out(loaded, third), records(third))
    planned = [
        ("mnist_dpsinkhorn", str(_out(loaded, third).resolve()), {**done["spec"], "sigma": 2.0})
    ]
    with pytest.raises(trainings.RetrainRefused, match="changed: settings sigma"):
        trainings.refuse_changed_settings(records(third), planned)


def test_the_record_merges_per_id_whatever_events_survive(tmp_path):
    """A finished event alone (its started one lost) is one finished training of its
    experiment, refused a retrain; an unfinished training counts at its planned steps; a
    line that is no training event is a one-line error naming it."""
    identity = {
        "experiment": "e",
        "out": str(tmp_path / "gone" / "e"),
        "out_rel": "../run/e",
        "spec": {"sigma": 1.5},
        "private": True,
        "reproducible": False,
        "q": 0.01,
        "noise_multiplier": 1.5,
        "delta": 1e-5,
        "accountant": "rdp",
        "steps_planned": 100,
        "retrain": False,
    }
    records = tmp_path / "data" / "trainings"
    trainings.append(
        records,
        "ab" * 32,
        {"event": "finished", "training": "t1", **identity, "steps": 100, "epsilon": 1.0},
    )
    trainings.append(
        records,
        "ab" * 32,
        {"event": "resumed", "training": "t2", **identity, "retrain": True, "start_step": 40},
    )
    merged = trainings.source_trainings(records, "ab" * 32)
    assert [(t["training"], t["finished"], t["steps"], t["retrain"]) for t in merged] == [
        ("t1", True, 100, False),
        ("t2", False, 100, True),
    ]
    out = str((records / "../run/e").resolve())  # where out_rel points now: the folder moved
    assert trainings.output_folder(merged[0], records) == out
    with pytest.raises(trainings.RetrainRefused, match="experiment e finished"):
        trainings.check_retrain(records, out, "e", {"sigma": 1.5}, False)
    record = trainings.record_file(records, "ab" * 32)
    with record.open("a") as fh:
        fh.write('{"event": "finished"}\n')
    with pytest.raises(ValueError, match=r"line 3 of a record file is not a training event") as err:
        trainings.read(record)
    # named by its folder: the file's name is 64 bits of the private data's sha256
    assert record.stem not in str(err.value) and str(records) in str(err.value)


# ----------------------------------------------------- records that lack what a writer records

#: The mechanism every writer records in each event of a DP training.
MECHANISM_KEYS = ("q", "noise_multiplier", "delta")


def test_a_training_whose_record_lacks_its_experiment_or_mechanism_is_refused(
    tmp_path, capsys, monkeypatch
):
    """A training none of whose events names its experiment (a ``finished`` event without
    its identity, or a lone ``republished``) or says whether it is private, or a DP training
    whose events lack its mechanism, is never skipped nor guessed at (its epsilon would go
    uncounted): reading the record fails in one line naming its folder (not its file, 64 bits
    of the private data's sha256), so a training, a retrain and the summary all stop (CLI:
    exit 2)."""
    configfile, args = _trained_by_cli(tmp_path, monkeypatch)
    records = tmp_path / "data" / "trainings"
    (record,) = records.glob("*.jsonl")
    events = trainings.read(record)
    (done,) = [e for e in events if e["event"] == "finished"]
    out = str((tmp_path / "results/cli/clothes_dp").resolve())
    bare = ("event", "training", "time", "steps", "epsilon", "content_sha256")
    lone = {"event": "republished", "training": done["training"], "out": out}
    for lacks, damaged in (
        ("names its experiment", [{k: done[k] for k in bare}]),
        ("names its experiment", [lone]),
        (
            "says whether it is private",
            [{k: v for k, v in e.items() if k != "private"} for e in events],
        ),
        (
            "records its mechanism (q, noise_multiplier, delta, steps)",
            [{k: v for k, v in e.items() if k not in MECHANISM_KEYS} for e in events],
        ),
    ):
        record.write_text("".join(json.dumps(e) + "\n" for e in damaged))
        with pytest.raises(ValueError, match=rf"line 1: no event of training \w+ {lacks[:12]}"):
            trainings.read(record)
        with pytest.raises(ValueError, match="data/trainings: line 1"):
            trainings.check_retrain(records, out, "clothes_dp", {}, True)
        capsys.readouterr()
        for command in (
            [*args, "--retrain"],
            ["privacy-summary", "--config", str(configfile), "--results", "results/cli"],
        ):
            assert cli.main(command) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and lacks in err[0], err
            assert "the training record in data/trainings" in err[0] and record.stem not in err[0]
