"""Which device a step runs on: ``auto`` on a machine with several GPUs claims a free one
(:func:`claim_gpu`); under SLURM each job sees only its own GPU, so nothing is claimed."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

#: Lock files go here (default: the system's temporary folder).
LOCK_DIR_ENV = "DPSINKHORN_GPU_LOCK_DIR"
#: Steps that may share one GPU (default 1; profiles/default caps the GPU steps at GPUs x
#: this, and ``auto`` hands out every GPU's first slot before any second one).
JOBS_PER_GPU_ENV = "DPSINKHORN_JOBS_PER_GPU"

_claimed: tuple[int, IO] | None = None  # (index, open lock file) of this process


def resolve_device(name: str = "auto"):
    """``auto`` -> a free CUDA device (:func:`claim_gpu`), else cpu; ``cpu``, ``cuda`` and
    ``cuda:N`` as given. A ValueError naming the device for any other name, and for a CUDA
    device this machine does not have."""
    import torch

    if name != "auto":
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {name!r}: must be auto, cpu, cuda or cuda:N")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this machine has no CUDA device (use cpu or auto)")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ValueError(f"device {name!r}: this machine has {count} CUDA device(s)")
        return device
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 1:
        return torch.device("cuda")
    return torch.device("cuda", claim_gpu(count))


def jobs_per_gpu() -> int:
    """``DPSINKHORN_JOBS_PER_GPU`` (a positive integer; 1 when unset or empty)."""
    raw = os.environ.get(JOBS_PER_GPU_ENV) or "1"
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{JOBS_PER_GPU_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir())


def _gpu_ids(count: int) -> list[str]:
    """Names of the visible GPUs 0..count-1 for lock files: physical ids where known."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else []
    return [ids[i] if i < len(ids) and ids[i] else str(i) for i in range(count)]


def claim_gpu(count: int, directory: Path | None = None, poll_s: float = 2.0) -> int:
    """Index of a GPU (of ``count``) this process now holds, the same on every call; waits
    while all are taken. Held: an exclusive ``flock`` (the kernel drops it when the process
    exits) on a slot's lock file, ``dpsinkhorn-gpu-<id>.lock``, then ``...<id>.<slot>.lock``."""
    global _claimed
    if _claimed is not None:
        return _claimed[0]
    directory = Path(directory or lock_dir())
    directory.mkdir(parents=True, exist_ok=True)
    ids, slots, said = _gpu_ids(count), jobs_per_gpu(), False
    while True:
        for slot in range(slots):
            for index, gpu in enumerate(ids):
                name = f"dpsinkhorn-gpu-{gpu}" + (f".{slot}" if slot else "") + ".lock"
                handle = open(directory / name, "a")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                _claimed = (index, handle)
                return index
        if not said:
            said = True
            each = f" ({slots} steps each)" if slots > 1 else ""
            print(
                f"dpsinkhorn: all {count} GPUs are in use{each}; waiting for one", file=sys.stderr
            )
        time.sleep(poll_s)


def local_gpu_count() -> int:
    """NVIDIA GPUs visible to this machine's processes, without importing torch:
    ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``'s, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        # A negative index hides that GPU and every one after it.
        return next((i for i, v in enumerate(ids) if v.startswith("-")), len(ids))
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())
