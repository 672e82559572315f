"""Faults and bad input: locks, damaged files, full disks, memory, signals."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dpsinkhorn import fileio
from dpsinkhorn.data import datasets as data
from dpsinkhorn.train.run import train
from dpsinkhorn.train.signals import INTERRUPTED_EXIT_CODE, Preempted
from dpsinkhorn.train.workspace import WORKSPACE

ROOT = Path(__file__).resolve().parents[1]
# reproducible: two runs of one config draw the same noise (the byte-identity test needs it)
TINY = {
    "channels": [16, 8, 4],
    "steps": 12,
    "checkpoint_every": 4,
    "log_every": 2,
    "reproducible": True,
}


def make_config(tmp_path: Path, data_dir: Path, name: str = "config.yaml", **experiment) -> Path:
    cfg = {
        "run_name": "faults",
        "data_dir": str(data_dir),
        "device": "cpu",
        "training_defaults": dict(TINY),
        "experiments": {"e": {"dataset": "mnist", "table1_row": "paper", **experiment}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def spec_of(path: Path) -> dict:
    from dpsinkhorn import config as config_lib

    return config_lib.experiment(config_lib.load_config(path), "e")


def train_cmd(cfg: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dpsinkhorn",
        "train",
        "--config",
        str(cfg),
        "--experiment",
        "e",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert path.exists(), f"{path} did not appear"


def test_second_writer_of_an_output_folder_is_refused(tmp_path, prepared_data):
    """Two real `dpsinkhorn train` processes, same --out: the second is refused by name."""
    first_cfg = make_config(tmp_path, prepared_data, "a.yaml", steps=100000, sigma=1.5)
    second_cfg = make_config(tmp_path, prepared_data, "b.yaml", steps=4, sigma=0.8)
    out = tmp_path / "run"
    first = subprocess.Popen(train_cmd(first_cfg, out), stdout=subprocess.PIPE, text=True)
    try:
        wait_for(out / ".dpsinkhorn.lock", first)
        time.sleep(1.0)
        second = subprocess.run(train_cmd(second_cfg, out), capture_output=True, text=True)
        assert second.returncode == 2, second.stderr
        err = second.stderr.strip()
        assert len(err.splitlines()) == 1, err
        assert f"output folder {out} is in use by pid {first.pid}" in err
        assert not (out / "generator.pt").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    # The killed holder's lock: the next run takes it over and finishes.
    holder = subprocess.Popen(train_cmd(first_cfg, out), stdout=subprocess.PIPE, text=True)
    lock = out / ".dpsinkhorn.lock"
    deadline = time.time() + 120
    while str(holder.pid) not in lock.read_text() and time.time() < deadline:
        time.sleep(0.2)
    holder.kill()
    holder.communicate(timeout=60)
    assert str(holder.pid) in lock.read_text()  # SIGKILL: no release, a stale record
    done = subprocess.run(train_cmd(second_cfg, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"taking over the lock of pid {holder.pid}" in done.stdout
    assert json.loads((out / "privacy.json").read_text())["sigma"] == 0.8


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_checkpoint_is_one_line_and_not_retried(tmp_path, prepared_data, damage):
    cfg = make_config(tmp_path, prepared_data)
    out = tmp_path / "run"
    with pytest.raises(Preempted):
        train(spec_of(cfg), out, prepared_data, device="cpu", stop_after=4, progress=False)
    ckpt = out / WORKSPACE / "checkpoint.pt"
    raw = ckpt.read_bytes()
    ckpt.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else b"\0" * 1000 + raw[1000:])
    result = subprocess.run(train_cmd(cfg, out), capture_output=True, text=True)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"checkpoint {ckpt} is damaged" in err and "delete it" in err
    # A workflow retry (attempt 2) repeats the stop at once instead of failing again.
    t0 = time.perf_counter()
    retry = subprocess.run(train_cmd(cfg, out, "--attempt", "2"), capture_output=True, text=True)
    assert retry.returncode == 2 and "not retried" in retry.stderr
    assert time.perf_counter() - t0 < 60


def test_truncated_sample_file_is_one_line_error(tmp_path):
    path = tmp_path / "s.npz"
    fileio.save_samples(path, np.zeros((50, 28, 28), np.uint8), np.zeros(50, np.int64))
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ValueError, match="not a readable .npz sample file"):
        fileio.load_samples(path)
    assert not isinstance(zipfile.BadZipFile(), ValueError)  # what escaped before


def test_no_space_names_the_file_and_no_generator_without_ledger(
    tmp_path, prepared_data, monkeypatch
):
    cfg = make_config(tmp_path, prepared_data, steps=4)
    out = tmp_path / "run"
    real_write = fileio._write_synced

    def full_on_ledger(tmp: Path, payload: bytes) -> None:
        if tmp.name.startswith(".privacy."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(tmp, payload)

    monkeypatch.setattr(fileio, "_write_synced", full_on_ledger)
    with pytest.raises(fileio.NoSpaceError, match=f"no space left on device while writing {out}"):
        train(spec_of(cfg), out, prepared_data, device="cpu", progress=False)
    assert not (out / "generator.pt").exists() and not (out / "privacy.json").exists()
    assert not list(out.glob(".*.tmp*"))
    monkeypatch.setattr(fileio, "_write_synced", real_write)
    record = train(spec_of(cfg), out, prepared_data, device="cpu", progress=False)
    assert (out / "generator.pt").exists() and record["steps"] == 4


def test_generator_bytes_are_deterministic_and_hashed(tmp_path, prepared_data):
    cfg = make_config(tmp_path, prepared_data, steps=4)
    records, blobs = [], []
    for run in ("a", "b"):
        records.append(
            train(spec_of(cfg), tmp_path / run, prepared_data, device="cpu", progress=False)
        )
        blobs.append((tmp_path / run / "generator.pt").read_bytes())
    assert blobs[0] == blobs[1]
    ledger = json.loads((tmp_path / "a" / "privacy.json").read_text())
    assert ledger["content_sha256"] == hashlib.sha256(blobs[0]).hexdigest()
    assert ledger["threads"] == torch.get_num_threads()


def test_stale_checkpoint_temp_is_removed(tmp_path, prepared_data):
    cfg = make_config(tmp_path, prepared_data, steps=4)
    out = tmp_path / "run"
    (out / WORKSPACE).mkdir(parents=True)
    stale = out / WORKSPACE / ".checkpoint.abc123.tmp.pt"
    stale.write_bytes(b"half a checkpoint")
    train(spec_of(cfg), out, prepared_data, device="cpu", progress=False)
    assert not stale.exists()


#: Writes never finished: held, so that no clean-up of theirs runs (as under SIGKILL).
_KILLED_WRITERS: list = []


def _killed_write(path: Path) -> Path:
    """The temporary file a writer killed mid-write (SIGKILL: no cleanup runs) leaves."""
    writing = fileio.atomic_path(path)
    tmp = writing.__enter__()  # never left; a collected one would remove its file
    _KILLED_WRITERS.append(writing)
    tmp.write_bytes(b"half a file")
    return tmp


def test_stale_temps_under_a_folder_are_removed_and_nothing_else(tmp_path):
    """What the workflow's cleanup after a finished run removes: the temporary files of
    atomic writers, anywhere under the folder; every other file and folder stays."""
    stale = [
        _killed_write(tmp_path / "e" / "generator.pt"),
        _killed_write(tmp_path / "e" / "samples_seed0.npz"),
        _killed_write(tmp_path / "tables" / "table1.md"),
        _killed_write(tmp_path / "reproduction"),  # a name without a suffix
    ]
    names = (
        "generator.pt",
        ".dpsinkhorn.lock",
        ".dpsinkhorn.stopped",
        ".notes.tmp",
        "x.abcdefgh.tmp.npz",
        ".x.abcdefgh.tmp.a.b",
    )
    kept = [tmp_path / "e" / name for name in names]
    for path in kept:
        path.write_bytes(b"kept")
    folder = tmp_path / ".published.tmp-123" / ".a.abcdefgh.tmp"  # a release's temporary folder
    folder.mkdir(parents=True)
    assert sorted(fileio.remove_stale_temps_under(tmp_path)) == sorted(stale)
    assert not any(p.exists() for p in stale)
    assert all(p.read_bytes() == b"kept" for p in kept) and folder.is_dir()


def test_a_finished_run_removes_temps_in_its_own_folders_only(tmp_path, monkeypatch):
    """The workflow's cleanup (Snakefile onsuccess) looks in the run's results folder, its
    datasets' prepared folders and its DP releases' kept copies under data_dir; another
    run's prepared data and kept copies there stay, since its writers may be running."""
    from dpsinkhorn import config as config_lib
    from dpsinkhorn.config.workflow import killed_writers_folders, remove_killed_writers_temps
    from dpsinkhorn.privacy import trainings

    monkeypatch.chdir(tmp_path)
    config = config_lib.load_config(make_config(tmp_path, Path("data")))
    data, results = Path("data"), Path("results") / config["run_name"]
    records = data / trainings.RECORD_DIR

    def kept_copy(out: str) -> Path:
        return trainings.finished_copy_dir(records, out)

    ours = [
        _killed_write(results / "e" / "generator.pt"),
        _killed_write(results / "nonprivate" / "fid_ref_mnist.npz"),
        _killed_write(data / "mnist" / "train.npz"),
        _killed_write(kept_copy(str((results / "e").resolve())) / "generator.pt"),
    ]
    theirs = [
        _killed_write(data / "fmnist" / "train.npz"),
        _killed_write(data / "digits-0123456789abcdef" / "test.npz"),
        _killed_write(kept_copy(str((tmp_path / "other" / "e").resolve())) / "privacy.json"),
    ]
    remove_killed_writers_temps(*killed_writers_folders(config, results, kept_copy))
    assert not any(p.exists() for p in ours)
    assert all(p.exists() for p in theirs)


@pytest.mark.parametrize("batch_size", [60000, 100000])
def test_oversized_batch_is_refused_naming_key_and_file(tmp_path, prepared_data, batch_size):
    cfg = make_config(tmp_path, prepared_data, batch_size=batch_size)
    result = subprocess.run(train_cmd(cfg, tmp_path / "run"), capture_output=True, text=True)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{cfg}: experiments.e.batch_size: batch_size {batch_size}" in err


def test_damaged_extracted_idx_is_never_read(tmp_path, data_mirror):
    root = tmp_path / "data"
    data.prepare("mnist", root, mirror=data_mirror)
    good = data.load_split(root, "mnist", "train")[0].copy()
    idx = root / "torchvision" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    idx.write_bytes(b"\0\0\x08\x03" + bytes(255 for _ in range(100000)))  # beside the archives
    data.prepare("mnist", root, mirror=data_mirror)
    assert np.array_equal(data.load_split(root, "mnist", "train")[0], good)


def test_sigint_stops_a_snakemake_run_and_keeps_the_checkpoint(tmp_path, data_mirror):
    """Ctrl-C (SIGINT to the process group) during training: the checkpoint is kept,
    training is not restarted, Snakemake stops."""
    cfg = {
        "run_name": "sig",
        "data_dir": str(tmp_path / "data"),
        "data_mirror": str(data_mirror),
        "device": "cpu",
        "training_defaults": {**TINY, "steps": 100000, "checkpoint_every": 100000},
        "experiments": {"e": {"dataset": "mnist", "table1_row": "paper"}},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    snakemake = Path(sys.executable).parent / "snakemake"
    proc = subprocess.Popen(
        [
            str(snakemake),
            "-s",
            str(ROOT / "Snakefile"),
            "--profile",
            str(ROOT / "profiles/default"),
            "--configfile",
            "cfg.yaml",
            "-c2",
            "results/sig/e/generator.pt",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    log = tmp_path / "results/sig/logs/train_e.log"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and "/100000" in log.read_text():  # a training step is done
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output
    assert "interrupted (SIGINT)" in log.read_text()
    assert (tmp_path / "results/sig/e" / WORKSPACE / "checkpoint.pt").exists()
    assert output.count("Shell command: exec dpsinkhorn train") == 1, output
    assert f"exit status {INTERRUPTED_EXIT_CODE}" in output or "130" in output, output
