"""How much memory a training step needs, and a refusal when the device cannot hold it.

A step's peak (float32): the real features N × D (D = pixels + classes), the Sinkhorn
solve's [n, capacity] and [n, n] matrices (:data:`SINKHORN_MATRICES` copies each), and the
generator's activations for n + n' rows (measured). A setting is refused only when the
estimate exceeds the memory available.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

SINKHORN_MATRICES = 14  # float32 [n, capacity + n] matrices alive at a step's peak
FLOAT = 4  # bytes


class TooLargeError(ValueError):
    """A setting needs more memory than the device has; names the config ``key``."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def activation_bytes_per_row(model: torch.nn.Module, rows: int = 4) -> float:
    """Bytes that autograd saves for the backward pass, per generated row.

    The difference of forward passes of ``rows`` and ``2 * rows`` rows through a copy of
    ``model`` (its statistics and the run's random stream untouched).
    """
    probe = copy.deepcopy(model)
    device = next(probe.parameters()).device
    draws = torch.Generator(device=device).manual_seed(0)

    def saved_bytes(num: int) -> int:
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += t.numel() * t.element_size()
            return t

        inputs = probe.sample_inputs(num, draws, device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = probe(*inputs)
        return saved + out.numel() * out.element_size()

    return max(saved_bytes(2 * rows) - saved_bytes(rows), 0) / rows


def step_bytes(
    n: int,
    n_prime: int,
    capacity: int,
    num_records: int,
    feature_dim: int,
    bytes_per_row: float,
) -> int:
    """Estimated peak bytes of a training step (see the module docstring)."""
    sinkhorn = SINKHORN_MATRICES * FLOAT * n * (capacity + n)
    return int(num_records * feature_dim * FLOAT + sinkhorn + bytes_per_row * (n + n_prime))


def available_bytes(device: torch.device) -> int | None:
    """Memory a run may use on ``device``: free GPU memory, or the host's available
    memory (within a cgroup limit, as under SLURM); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    limits = []
    with contextlib.suppress(OSError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        limits += [int(line.split()[1]) * 1024 for line in meminfo if "MemAvailable:" in line]
    for limit, usage in (
        ("memory.max", "memory.current"),  # cgroup v2, then v1
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            text = Path("/sys/fs/cgroup", limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            try:
                limits.append(int(text) - int(Path("/sys/fs/cgroup", usage).read_text()))
            except (OSError, ValueError):
                limits.append(int(text))
    return min(limits) if limits else None


def check_fits(need: int, device: torch.device, what: str) -> None:
    """Raise ``TooLargeError`` (key ``batch_size``) when ``need`` bytes exceed what
    ``device`` has available; ``what`` names the run and its setting."""
    have = available_bytes(device)
    if have is None or need <= have:
        return
    raise TooLargeError(
        "batch_size",
        f"{what} needs about {need / 2**30:.1f} GiB per training step (Sinkhorn matrices "
        f"[n, n + capacity] and generator activations, dpsinkhorn.train.memory), but "
        f"{device} has {have / 2**30:.1f} GiB available; lower batch_size",
    )
