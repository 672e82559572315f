"""Time one generator's evaluation phase by phase, as ``dpsinkhorn evaluate`` runs them, and
each FID precision's error against IEEE fp32; writes one JSON (saved after every section,
so a deadline keeps what was measured).

    python benchmarks/evaluate_phases.py --generator GENERATOR.pt --out phases.json \\
        --device cuda                      # defaults: the paper's protocol, random weights

Without ``--weights`` the Inception network has random weights (timing only; the FID
errors then say little); without ``--test`` the generator's samples of another seed stand
in for the real test set. Classes: the largest label + 1 (any generator's classes fit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate import classifiers, inception
from dpsinkhorn.evaluate.classify import to_float
from dpsinkhorn.evaluate.fid import device_statistics, fid_from_stats
from dpsinkhorn.evaluate.sample import generate, load_generator, sample_generator


def timed(device: torch.device, fn, *args):
    """(wall seconds, result) of ``fn(*args)``, the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    out = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin, out


def fid_phase(draws: list, test_images: np.ndarray, net, device, args) -> dict:
    """Seconds per seed of the features and the distance in fp32; each other precision's
    seconds and FID relative error on the first seed."""

    def stats(images: np.ndarray, precision: str = "fp32"):
        return device_statistics(inception.activations(images, net, args.fid_batch, precision))

    mu_r, s_r = stats(test_images)
    sec, per_seed = timed(device, lambda: [stats(x) for x, _ in draws])
    out = {"fp32_features_s_per_seed": sec / len(draws)}
    sec, fids = timed(device, lambda: [fid_from_stats(*s, mu_r, s_r, args.sqrtm) for s in per_seed])
    out |= {"distance_s_per_seed": sec / len(draws), "fp32_fid": fids}
    for precision in args.fid_precisions:
        sec, s = timed(device, stats, draws[0][0], precision)
        value = fid_from_stats(*s, mu_r, s_r, args.sqrtm)
        out[precision] = {
            "features_s_seed0": sec,
            "fid_seed0": value,
            "fid_absolute_error": abs(value - fids[0]),
            "fid_relative_error": abs(value / fids[0] - 1),
        }
    return out


def classifier_phase(draws: list, test: tuple, device, args, out: dict, save) -> dict:
    """Each classifier at the protocol, all seeds together: seconds, epochs, accuracies."""
    classes = 1 + max(int(y.max()) for y in [*(y for _, y in draws), test[1]])
    xs = [to_float(x, device=device) for x, _ in draws]
    ys = [torch.from_numpy(y).to(device) for _, y in draws]
    x_test = to_float(test[0], device=device)
    y_test = torch.from_numpy(test[1]).to(device)
    for model in args.classifiers:
        if model == "logreg":
            fit = (classifiers.train_logreg, xs, ys, x_test, y_test, classes, args.max_iter)
        else:
            fit = (classifiers.train_batched, model, xs, ys, x_test, y_test, classes, args.seeds)
            fit += (args.max_epochs, args.patience, args.batch_size)
        sec, res = timed(device, *fit)
        out[model] = {
            "s": sec,
            "epochs": [r["epochs"] for r in res],
            "accuracy": [r["accuracy"] for r in res],
        }
        save()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generator", required=True, help="generator.pt")
    p.add_argument("--out", required=True, help="the JSON of phase seconds")
    p.add_argument("--device", default="auto")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--num", type=int, default=60_000, help="samples per seed")
    p.add_argument("--num-test", type=int, default=10_000, help="test / reference images")
    p.add_argument("--test", default=None, help="real test.npz (default: generator samples)")
    p.add_argument("--weights", default=None, help="real Inception weights (default: random)")
    p.add_argument("--fid-batch", type=int, default=None, help="Inception batch")
    p.add_argument("--fid-precisions", nargs="*", default=["tf32", "bf16", "fp16"])
    p.add_argument("--sqrtm", default="eigh", choices=["pytorch_fid", "eigh"])
    p.add_argument("--classifiers", nargs="*", default=["logreg", "mlp", "cnn"])
    p.add_argument("--max-epochs", type=int, default=1000)
    p.add_argument("--patience", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-iter", type=int, default=5000, help="Log-Reg L-BFGS iterations")
    args = p.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or min(args.num, args.num_test) < 2:
        p.error("--seeds must be distinct, --num and --num-test at least 2")

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result: dict = {"settings": vars(args), "device": f"{device} ({name})"}
    result["torch"] = torch.__version__

    def save() -> None:
        fileio.write_json(args.out, result)

    gen = load_generator(Path(args.generator), device)
    sec, draws = timed(device, lambda: [generate(gen, args.num, s) for s in args.seeds])
    result["sample_s"] = sec
    if args.test:
        images, labels = fileio.load_samples(args.test)
        test = (images[: args.num_test], labels[: args.num_test])
    else:
        test = sample_generator(gen, args.num_test, 10_000)
    if args.weights:
        net = inception.load_inception(args.weights, device)
    else:
        net = inception.random_inception(test[0][:16], device)
    result["inception"] = "real weights" if args.weights else "random weights (timing only)"
    save()
    result["fid"] = fid_phase(draws, test[0], net, device, args)
    save()
    result["classifiers"] = {}
    classifier_phase(draws, test, device, args, result["classifiers"], save)
    fid = result["fid"]["fp32_features_s_per_seed"] + result["fid"]["distance_s_per_seed"]
    classify = sum(c["s"] for c in result["classifiers"].values())
    result["total_s"] = result["sample_s"] + len(draws) * fid + classify
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
