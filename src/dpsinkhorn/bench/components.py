"""Timing of a step's parts alone: each generator layer, and the Sinkhorn iterations
(eager and compiled)."""

from __future__ import annotations

import math
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from dpsinkhorn.bench.timing import sync, time_steps
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.models import ConditionalDCGAN, GeneratorConfig
from dpsinkhorn.ot import solver as ot
from dpsinkhorn.ot.loss import debias_size, feature_diameter


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
