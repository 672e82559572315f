"""Profile the batched classifier's training step (``evaluate.classifiers.BatchedRun.step``,
every seed at once) with torch.profiler; writes the top ops by self time and the step's
milliseconds as one JSON and prints them as a table. For the CNN it also measures a
candidate step, ``grouped`` (:class:`GroupedCNN`), beside the product's ``vmap`` one.

    python benchmarks/profile_classifier.py --device cuda --out cnn_profile.json
    python benchmarks/profile_classifier.py --device cpu --num 2000 --steps 10 --out p.json
    python benchmarks/profile_classifier.py --variants grouped --out grouped.json

Defaults: the paper's protocol (CNN, five seeds x 128 images a step, 60,000 images a seed).
Images are random MNIST-shaped uint8 [28,28] with 10 classes (the step's cost does not
depend on the pixels) unless ``--data`` names a train.npz. On CUDA each step is also timed
replayed from a CUDA graph, as ``train_batched`` runs it. The JSON's ``variants`` holds per
step its ms per step and top ops.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np
import torch
from torch import nn

from dpsinkhorn import fileio
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.classifiers import BatchedRun, GraphedStep
from dpsinkhorn.evaluate.classify import to_float


class GroupedCNN:
    """The CNN of ``run`` (a :class:`BatchedRun` of model ``cnn``) for all K seeds kept in
    the layout [b, K*C, H, W] end to end: each conv one grouped conv (``groups=K``, weights
    [K*Cout, Cin, kh, kw], views of ``run.params``), relu, max-pool and dropout per channel,
    the last linear one batched matmul per seed. It shares ``run``'s parameters, batches,
    loss and train/eval mode (``run.base``); :meth:`step` is a drop-in for ``run.step``."""

    def __init__(self, run: BatchedRun) -> None:
        if run.name != "cnn":
            raise ValueError(f"the grouped step is for the cnn, got {run.name!r}")
        self.run, self.k, self.device = run, run.k, run.device
        self.conv1, self.pool, self.drop, self.conv2 = (run.base[i] for i in (0, 2, 3, 4))

    def _conv(self, conv: nn.Conv2d, key: str, h: torch.Tensor) -> torch.Tensor:
        weight, bias = self.run.params[f"{key}.weight"], self.run.params[f"{key}.bias"]
        return nn.functional.conv2d(
            h, weight.flatten(0, 1), bias.flatten(), conv.stride, conv.padding, groups=self.k
        )

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [K, b, classes] of the batches ``idx`` [K, b] (each seed's own images)."""
        run, f = self.run, nn.functional
        x = run.x_fit[run.rows.T, idx.T]  # one gather into [b, K, C, H, W]
        h = x.flatten(1, 2)  # [b, K*C, H, W], a view
        p, training = self.drop.p, run.base.training
        h = f.dropout(self.pool(f.relu(self._conv(self.conv1, "0", h))), p, training)
        h = f.dropout(self.pool(f.relu(self._conv(self.conv2, "4", h))), p, training)
        z = h.unflatten(1, (self.k, -1)).flatten(2)  # [b, K, 64*H/4*W/4], a view
        weight, bias = run.params["9.weight"], run.params["9.bias"]  # [K, cls, F], [K, cls]
        return torch.baddbmm(bias[:, None, :], z.transpose(0, 1), weight.transpose(1, 2))

    def step(self, optimizer: torch.optim.Optimizer, idx: torch.Tensor) -> None:
        """One optimizer step of all K models on ``idx`` [K, b], ``run.step``'s loss and
        update (``BatchedRun.update``)."""
        self.run.update(optimizer, self.logits(idx), idx)


# the steps measured: the product's (vmapped functional_call) and the grouped candidate
VARIANTS = {"vmap": lambda run: run, "grouped": GroupedCNN}


def seconds_per_step(device: torch.device, step, batches, steps: int) -> float:
    """Wall seconds per call of ``step`` over ``steps`` batches, the device synchronised."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    for idx in itertools.islice(batches, steps):
        step(idx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - begin) / steps


def top_ops(prof: torch.profiler.profile, cuda: bool, steps: int, top: int) -> list[dict]:
    """The ``top`` ops by self time (device time on CUDA, else CPU time), microseconds per
    step, each with its share of the total."""
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events)
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    return [
        {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "self_us_per_step": getattr(e, key) / steps,
            "share": getattr(e, key) / total,
        }
        for e in events[:top]
    ]


def measure(device: torch.device, model, params: list, batches, args) -> dict:
    """``model.step`` (Adam, as ``train_batched`` sets it) timed eagerly and, on CUDA,
    replayed from a CUDA graph, then profiled eagerly: ms per step and the top ops."""
    cuda = device.type == "cuda"
    optimizer = torch.optim.Adam(params)

    def eager(idx: torch.Tensor) -> None:
        model.step(optimizer, idx)

    seconds_per_step(device, eager, batches, args.warmup)
    result = {"eager_ms_per_step": 1e3 * seconds_per_step(device, eager, batches, args.steps)}
    if cuda:
        graphed = GraphedStep(model, torch.optim.Adam(params, capturable=True), args.batch_size)
        seconds_per_step(device, graphed, batches, args.warmup)
        result["graphed_ms_per_step"] = 1e3 * seconds_per_step(device, graphed, batches, args.steps)
        result["cuda_graph_error"] = graphed.error
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        seconds_per_step(device, eager, batches, args.steps)
    return result | {"top_ops": top_ops(prof, cuda, args.steps, args.top)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written")
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    p.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=None,
        help="steps measured (default: both for the cnn, vmap for the mlp)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--num", type=int, default=60_000, help="images per seed")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--data", default=None, help="a train.npz (default: random images)")
    p.add_argument("--warmup", type=int, default=10, help="steps before timing")
    p.add_argument("--steps", type=int, default=100, help="steps timed and profiled")
    p.add_argument("--top", type=int, default=20, help="ops listed")
    args = p.parse_args(argv)
    if args.num < 20 or min(args.steps, args.warmup, args.batch_size) < 1:
        p.error("--num at least 20; --steps, --warmup, --batch-size at least 1")
    args.variants = args.variants or (list(VARIANTS) if args.model == "cnn" else ["vmap"])
    if args.model != "cnn" and "grouped" in args.variants:
        p.error(f"--variants grouped is for --model cnn, not {args.model}")

    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    if args.data:
        images, labels = fileio.load_samples(args.data)
        images, labels = images[: args.num], labels[: args.num]
    else:
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (args.num, 28, 28), np.uint8)
        labels = rng.integers(0, 10, args.num)
    x, y = to_float(images, device=device), torch.from_numpy(labels).to(device)
    k = len(args.seeds)
    classes = int(labels.max()) + 1
    run = BatchedRun(args.model, [x] * k, [y] * k, classes, args.seeds, args.batch_size)
    batches = (  # full batches of epoch after epoch
        idx
        for epoch in iter(run.epoch_batches, None)
        for idx in epoch
        if idx.shape[1] == args.batch_size
    )
    result = {
        "settings": vars(args),
        "device": f"{device} ({torch.cuda.get_device_name(device) if cuda else 'cpu'})",
        "torch": torch.__version__,
        "variants": {},
    }
    for name in args.variants:  # each its own Adam over the one set of parameters
        model = VARIANTS[name](run)
        params = list(run.params.values())
        result["variants"][name] = measure(device, model, params, batches, args)
    fileio.write_json(args.out, result)
    for name, measured in result["variants"].items():
        width = max(len(r["op"][:60]) for r in measured["top_ops"])
        print(f"{name}:\n{'op':<{width}}  calls/step  self us/step  share")
        for r in measured["top_ops"]:
            line = f"{r['calls_per_step']:10.1f}  {r['self_us_per_step']:12.1f}  {r['share']:5.1%}"
            print(f"{r['op'][:60]:<{width}}  {line}")
    for name, measured in result["variants"].items():
        times = {k: v for k, v in measured.items() if k.endswith("ms_per_step")}
        print(f"{name}:", ", ".join(f"{k} {v:.3f}" for k, v in times.items()))
    print("->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
