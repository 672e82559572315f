"""What one training step costs: wall-clock and per-kernel time with the device synchronised,
ATen operations, host synchronisations and GFLOP (counted below autograd), and the time of
its parts alone (each generator layer; the Sinkhorn iterations, eager and compiled)."""

from __future__ import annotations

import math
import time

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dpsinkhorn.devices import resolve_device
from dpsinkhorn.models import ConditionalDCGAN, GeneratorConfig
from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.loss import debias_size, feature_diameter

# Ops that make the host wait for the device on CUDA: .item() and data-dependent shapes.
SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero")


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations run below autograd (forward and backward), views and
    profiler marks excluded: each is at least one kernel launch on a GPU. ``syncs`` counts
    those in ``SYNCING_OPS`` outside optimiser steps (there they read the optimiser's
    step counter, on the host unless ``capturable``: no wait for a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0
        self._in_optimizer = False

    def __enter__(self):
        def flag(value):
            return lambda *_: setattr(self, "_in_optimizer", value)

        self._hooks = [
            register_optimizer_step_pre_hook(flag(True)),
            register_optimizer_step_post_hook(flag(False)),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.namespace != "profiler":  # profiler marks: no kernel
            self.ops += 1
        if func.name().split(".")[0] in SYNCING_OPS and not self._in_optimizer:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


def count_ops(step, flops: bool = True) -> dict:
    """ATen operations, host synchronisations and (``flops``) GFLOP of one call of ``step``:
    ``torch.utils.flop_counter``'s count of the convolutions and matrix products. Not for
    a sweep: that counter counts vmap's grouped convolutions K times over."""
    with OpCounter() as counter:
        step()
    result = {"ops_per_step": counter.ops, "host_syncs_per_step": counter.syncs}
    if flops:
        with FlopCounterMode(display=False) as flop_counter:
            step()
        result["gflop_per_step"] = flop_counter.get_total_flops() / 1e9
    return result


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


def generator_layer_profile(
    spec: dict, device: str, repeats: int = 20, warmup: int = 3
) -> list[dict]:
    """Forward + backward time of each generator layer on one step's batch (n + n' rows),
    each on its own detached input (the times add up to the generator's share of a step);
    ``gflop_per_s``: ``FlopCounterMode``'s count of forward + backward over that time."""
    dev = resolve_device(device)
    rows = int(spec["batch_size"]) + debias_size(int(spec["batch_size"]), spec["p"])
    config = GeneratorConfig(
        latent_dim=spec["latent_dim"], embed_dim=spec["embed_dim"], channels=tuple(spec["channels"])
    )
    model = ConditionalDCGAN(config).to(dev)
    z, labels = model.sample_inputs(rows, device=dev)
    x = torch.cat([z, model.embedding(labels)], dim=1)[:, :, None, None].detach()
    profile = []
    for index, layer in enumerate(model.net):
        inp = x.detach().requires_grad_()

        def forward_backward(layer=layer, inp=inp):
            out = layer(inp)
            out.backward(torch.ones_like(out))

        seconds = 1.0 / time_steps(forward_backward, dev, repeats, warmup)
        row = {"layer": index, "kind": type(layer).__name__, "input": list(inp.shape)}
        row["ms_forward_backward"] = seconds * 1e3
        with FlopCounterMode(display=False) as counter:
            forward_backward()
        if counter.get_total_flops():
            row["gflop_per_s"] = counter.get_total_flops() / seconds / 1e9
        profile.append(row)
        x = layer(inp).detach()
    return profile


def solver_iteration_times(
    spec: dict,
    capacity: int,
    image_numel: int,
    dev: torch.device,
    repeats: int = 50,
    warmup: int = 3,
) -> dict:
    """Milliseconds of one step's Sinkhorn iterations (``ot.sinkhorn_iterations``), eager
    and through ``torch.compile``, on the step's batched problem: [2, n, max(capacity, n)]
    (data term and self term), the paper's schedule, random costs of the features' scale.
    The compile itself is not timed (``compile_s`` reports it)."""
    n = int(spec["batch_size"])
    rows = max(capacity, n)
    g = torch.Generator(device=dev).manual_seed(0)
    cost = torch.rand(2, n, rows, generator=g, device=dev) * 1.5e3
    a_log = torch.full((2, n), -math.log(n), device=dev)
    b_log = torch.full((2, rows), -math.log(rows), device=dev)
    temperatures = tuple(
        ot.temperature_schedule(
            feature_diameter(image_numel, spec["alpha_c"], spec["cost"]),
            spec["entropy_reg"],
            spec["sinkhorn_scaling"],
        )
    )
    compiled = ot.compiled(ot.sinkhorn_iterations)
    start = time.perf_counter()
    compiled(cost, a_log, b_log, temperatures)
    sync(dev)
    compile_s = time.perf_counter() - start
    times = {}
    for name, fn in (("eager", ot.sinkhorn_iterations), ("compiled", compiled)):
        rate = time_steps(lambda fn=fn: fn(cost, a_log, b_log, temperatures), dev, repeats, warmup)
        times[f"{name}_ms"] = 1e3 / rate
    return {
        "shape": [2, n, rows],
        "iterations": len(temperatures) + 1,
        "compile_s": compile_s,
        **times,
    }
