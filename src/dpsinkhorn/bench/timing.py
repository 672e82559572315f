"""Wall-clock and per-kernel timing of a step function, with the device synchronised."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    """Wait until ``device`` has run all queued work (a no-op except on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, device: torch.device, steps: int, warmup: int) -> float:
    """Steps per second of ``step()`` over ``steps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return steps / (time.perf_counter() - start)


def profile_kernels(step, device: torch.device, steps: int, top: int = 25) -> dict:
    """Device time per step of each kernel of a warmed-up ``step()`` by torch.profiler,
    which records a CUDA graph's kernels one by one (on a CPU: ATen ops). Returns
    ``{"steps", "device_us_per_step", "wall_us_per_step", "kernels": [{"name",
    "us_per_step", "calls_per_step", "share"}]}`` for the ``top`` kernels by device time.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall = time.perf_counter() - start
    rows = []
    for event in prof.key_averages():
        if cuda:
            us = getattr(event, "self_device_time_total", None)
            if us is None:  # older torch
                us = event.self_cuda_time_total
            if event.device_type != torch.autograd.DeviceType.CUDA or us <= 0:
                continue
        else:
            us = event.self_cpu_time_total
            if us <= 0 or event.key.startswith("ProfilerStep"):
                continue
        rows.append({"name": event.key, "us": us, "calls": event.count})
    total = sum(r["us"] for r in rows)
    rows.sort(key=lambda r: -r["us"])
    kernels = [
        {
            "name": r["name"][:120],
            "us_per_step": r["us"] / steps,
            "calls_per_step": r["calls"] / steps,
            "share": r["us"] / total if total else 0.0,
        }
        for r in rows[:top]
    ]
    return {
        "steps": steps,
        "device_us_per_step": total / steps,
        "wall_us_per_step": wall / steps * 1e6,
        "kernels": kernels,
    }
