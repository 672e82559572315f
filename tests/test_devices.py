"""dpsinkhorn.devices: one GPU per process with ``auto`` (lock logic on CPU, fake GPU counts)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpsinkhorn import devices

REPO = Path(__file__).resolve().parents[1]

# Claims a GPU of 3 in the lock folder argv[1], prints its index, holds it until stdin closes.
HOLDER = """
import sys
from dpsinkhorn.devices import claim_gpu
print(claim_gpu(3, sys.argv[1], poll_s=0.1), flush=True)
sys.stdin.read()
"""


def release_gpu() -> None:
    """Give this process's claimed GPU back (the kernel drops its lock)."""
    if devices._claimed is not None:
        devices._claimed[1].close()
        devices._claimed = None


@pytest.fixture(autouse=True)
def _release():
    release_gpu()
    yield
    release_gpu()


def holder(lock_dir: Path, jobs_per_gpu: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, devices.JOBS_PER_GPU_ENV: str(jobs_per_gpu)},
    )


def test_processes_get_different_gpus_and_wait_when_all_are_taken(tmp_path):
    first, second, third = holder(tmp_path), holder(tmp_path), holder(tmp_path)
    try:
        taken = {int(p.stdout.readline()) for p in (first, second, third)}
        assert taken == {0, 1, 2}
        fourth = holder(tmp_path)
        time.sleep(1.0)
        assert fourth.poll() is None  # waiting: every GPU is held
        second.stdin.close()  # its process ends and the kernel drops its lock
        second.wait(timeout=30)
        assert fourth.stdout.readline() != ""
        fourth.stdin.close()
        assert fourth.wait(timeout=30) == 0
        assert "all 3 GPUs are in use" in fourth.stderr.read()
    finally:
        for p in (first, second, third):
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=30)


def test_jobs_per_gpu_fills_every_gpu_once_before_any_twice(tmp_path):
    holders = [holder(tmp_path, jobs_per_gpu=2) for _ in range(6)]
    try:
        taken = [int(p.stdout.readline()) for p in holders]
        assert sorted(taken) == [0, 0, 1, 1, 2, 2]
        seventh = holder(tmp_path, jobs_per_gpu=2)
        time.sleep(1.0)
        assert seventh.poll() is None  # both slots of all three GPUs are held
        holders[0].stdin.close()
        holders[0].wait(timeout=30)
        assert int(seventh.stdout.readline()) == taken[0]  # the freed slot's GPU
        seventh.stdin.close()
        assert seventh.wait(timeout=30) == 0
        assert "all 3 GPUs are in use (2 steps each)" in seventh.stderr.read()
    finally:
        for p in holders:
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=30)


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_jobs_per_gpu_must_be_a_positive_integer(monkeypatch, bad):
    monkeypatch.setenv(devices.JOBS_PER_GPU_ENV, bad)
    with pytest.raises(ValueError, match=f"{devices.JOBS_PER_GPU_ENV} must be a positive"):
        devices.jobs_per_gpu()


def test_the_same_process_keeps_its_gpu(tmp_path):
    first = holder(tmp_path)
    try:
        assert int(first.stdout.readline()) == 0
        assert devices.claim_gpu(3, tmp_path) == 1
        assert devices.claim_gpu(3, tmp_path) == 1
        release_gpu()
        assert devices.claim_gpu(3, tmp_path) == 1  # free again
    finally:
        first.stdin.close()
        first.wait(timeout=30)


def test_lock_files_name_physical_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,GPU-abc")
    assert devices._gpu_ids(2) == ["5", "GPU-abc"]
    assert devices.claim_gpu(2, tmp_path) == 0
    assert (tmp_path / "dpsinkhorn-gpu-5.lock").exists()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices._gpu_ids(2) == ["0", "1"]


def test_resolve_device(tmp_path, monkeypatch):
    monkeypatch.setenv(devices.LOCK_DIR_ENV, str(tmp_path))
    assert devices.resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")
    # a name the config's device key refuses, or a GPU this machine lacks: a ValueError
    # naming it (the CLI's one line, exit 2), not torch's traceback
    for name, said in [
        ("tpu", "must be auto, cpu, cuda or cuda:N"),
        ("mps", "must be auto, cpu, cuda or cuda:N"),
        ("cuda:0", "this machine has no CUDA device"),
    ]:
        with pytest.raises(ValueError, match=f"device '{name}': {said}"):
            devices.resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert devices.resolve_device("cuda:3") == torch.device("cuda", 3)
    with pytest.raises(ValueError, match="device 'cuda:4': this machine has 4 CUDA device"):
        devices.resolve_device("cuda:4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert devices.resolve_device("auto") == torch.device("cuda")
    assert not list(tmp_path.iterdir())  # one GPU (e.g. a SLURM job's): nothing claimed
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    first = holder(tmp_path)  # holds GPU 0 (of its 3)
    try:
        assert int(first.stdout.readline()) == 0
        assert devices.resolve_device("auto") == torch.device("cuda", 1)
    finally:
        first.stdin.close()
        first.wait(timeout=30)


@pytest.mark.parametrize(
    "visible, count", [("0,1", 2), ("3", 1), ("", 0), ("0,-1,2", 1), ("GPU-a,GPU-b,GPU-c", 3)]
)
def test_local_gpu_count_follows_cuda_visible_devices(monkeypatch, visible, count):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert devices.local_gpu_count() == count


def test_local_gpu_count_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert devices.local_gpu_count() == 0
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: A (UUID: GPU-1)'\necho 'GPU 1: A (UUID: GPU-2)'\n")
    fake.chmod(0o755)
    assert devices.local_gpu_count() == 2


@pytest.mark.parametrize(
    "visible, per_gpu, resources",
    [("0,1,2", "1", ["gpu=3"]), ("0,1,2", "2", ["gpu=6"]), ("0", "4", ["gpu=4"]), ("", "2", None)],
)
def test_default_profile_caps_gpu_steps_at_the_local_gpus(monkeypatch, visible, per_gpu, resources):
    from snakemake.profiles import ProfileConfigFileParser

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv(devices.JOBS_PER_GPU_ENV, per_gpu)
    with open(REPO / "profiles" / "default" / "config.v8+.yaml") as fh:
        parsed = ProfileConfigFileParser().parse(fh)
    assert parsed.get("resources") == resources
    assert "executor" not in parsed  # it is applied on top of profiles/slurm too
