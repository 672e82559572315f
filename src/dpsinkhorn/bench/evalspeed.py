"""One generator's evaluation timed two ways, and the training step, in one short call:
``dpsinkhorn bench-eval``.

Needs no FID weights: the Inception network is pytorch-fid's architecture with random
weights (:func:`inception.random_inception`; ``--weights`` uses the real one, and then the
FID values mean something). On the same samples of one generator it times, phase by phase:

- ``reference``: today's path (``evaluate`` without ``--fast``): fp32 NCHW Inception,
  statistics by numpy, the batched classifier loop with a host round trip per epoch;
- ``fast``: ``evaluate --fast``: batch norm folded, channels-last, statistics on the device
  (fp32, and each of ``--fid-precisions`` on one seed, with its FID's relative difference),
  the classifier loop of :mod:`dpsinkhorn.evaluate.fastfit` (CUDA graphs on CUDA);
- the classifiers for ``--compare-epochs`` epochs each way (no early stop: seconds per
  epoch and the accuracies after them), and the fast loop at the full protocol
  (``--patience``, ``--max-epochs``), whose wall time is what ``evaluate --fast`` pays;
- the training step of ``--experiment`` (the paper's MNIST setting) in each of
  ``--step-precisions`` (CUDA graphs and the compiled solver on CUDA), on the generator's
  samples (``--step-records`` of another seed) as training data, and a torch.profiler
  table of its kernels.

Writes one JSON (``--out``) of phase seconds and ratios. The reference FID path runs on
``--reference-seeds`` seeds only (it is the slow one); its seconds per seed are compared.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.bench.timing import profile_kernels, sync, time_steps
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate import inception
from dpsinkhorn.evaluate.classifiers import train_logreg_torch, train_torch_batched
from dpsinkhorn.evaluate.classify import to_float
from dpsinkhorn.evaluate.fastfit import train_torch_batched_fast
from dpsinkhorn.evaluate.fid import device_statistics, fid_from_stats, statistics_of_activations
from dpsinkhorn.evaluate.sample import load_generator, sample_generator


def _timed(device: torch.device, fn, *args):
    """(wall seconds, result) of ``fn(*args)``, the device synchronised before and after."""
    sync(device)
    begin = time.perf_counter()
    out = fn(*args)
    sync(device)
    return time.perf_counter() - begin, out


def bench_fid(
    draws: list, ref_images: np.ndarray, net, device: torch.device, args: argparse.Namespace
) -> dict:
    """FID phase times (s) of both paths, the FIDs, and each precision's relative error."""

    def reference(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        acts = inception.activations(images, model=net, batch_size=args.fid_batch)
        return statistics_of_activations(acts)

    def fast(images: np.ndarray, precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
        acts = inception.device_activations(images, net, args.fast_fid_batch, precision)
        return device_statistics(acts)

    def distances(stats: list) -> list[float]:
        return [fid_from_stats(*s, mu_r, s_r, args.sqrtm) for s in stats]

    out: dict = {}
    mu_r, s_r = reference(ref_images)
    ref_seeds = [x for x, _ in draws[: args.reference_seeds]]
    sec, stats = _timed(device, lambda: [reference(x) for x in ref_seeds])
    out["reference_features_s_per_seed"] = sec / len(ref_seeds)
    fast(draws[0][0][:2])  # builds the fast copy of the network
    sec, fast_stats = _timed(device, lambda: [fast(x) for x, _ in draws])
    out["fast_features_s_per_seed"] = sec / len(draws)
    sec, fids = _timed(device, distances, stats)
    out["distance_s_per_seed"] = sec / len(stats)
    fast_fids = distances(fast_stats)
    out["reference_fid"], out["fast_fid"] = fids, fast_fids
    out["fast_fid_relative_difference"] = [
        abs(f / r - 1) for f, r in zip(fast_fids, fids, strict=False)
    ]
    for precision in args.fid_precisions:
        sec, stats_p = _timed(device, fast, draws[0][0], precision)
        value = distances([stats_p])[0]
        out[f"fast_{precision}_features_s_per_seed"] = sec
        out[f"fast_{precision}_fid_seed0"] = value
        out[f"fast_{precision}_fid_relative_difference"] = abs(value / fids[0] - 1)
    seeds = len(draws)
    out["reference_total_s"] = seeds * (
        out["reference_features_s_per_seed"] + out["distance_s_per_seed"]
    )
    out["fast_total_s"] = seeds * (out["fast_features_s_per_seed"] + out["distance_s_per_seed"])
    out["features_ratio"] = out["reference_features_s_per_seed"] / out["fast_features_s_per_seed"]
    return out


def bench_classifiers(draws, test, seeds, device: torch.device, args, out: dict, save) -> dict:
    """Log-Reg once; MLP/CNN per epoch both ways over ``compare_epochs`` and the fast loop
    at the full protocol: seconds, epochs, accuracies. Fills ``out`` and calls ``save()``
    after each classifier. The class count is the largest label + 1 (``evaluate`` without
    ``--dataset``), so any generator's classes fit, not only MNIST's 10."""
    classes = 1 + max(int(y.max()) for y in [*(y for _, y in draws), test[1]])
    xs = [torch.from_numpy(to_float(x)).to(device) for x, _ in draws]
    ys = [torch.from_numpy(y).to(device) for _, y in draws]
    x_test = torch.from_numpy(to_float(test[0])).to(device)
    y_test = torch.from_numpy(test[1]).to(device)
    sec, res = _timed(device, train_logreg_torch, xs, ys, x_test, y_test, classes, args.max_iter)
    out["logreg_s"], out["logreg_accuracy"] = sec, [r["accuracy"] for r in res]
    save()
    e = args.compare_epochs
    for model in args.classifiers:
        common = (model, xs, ys, x_test, y_test, classes, seeds)
        for path, fn in (("reference", train_torch_batched), ("fast", train_torch_batched_fast)):
            sec, res = _timed(device, fn, *common, e, e + 1, args.batch_size)
            out[f"{model}_{path}_s_per_epoch"] = sec / e
            out[f"{model}_{path}_accuracy_after_{e}_epochs"] = [r["accuracy"] for r in res]
        out[f"{model}_epoch_ratio"] = (
            out[f"{model}_reference_s_per_epoch"] / out[f"{model}_fast_s_per_epoch"]
        )
        full = (args.max_epochs, args.patience, args.batch_size)
        sec, res = _timed(device, train_torch_batched_fast, *common, *full)
        out[f"{model}_fast_full_s"] = sec
        out[f"{model}_fast_full_epochs"] = [r["epochs"] for r in res]
        out[f"{model}_fast_full_accuracy"] = [r["accuracy"] for r in res]
        epochs = max(r["epochs"] for r in res)
        out[f"{model}_reference_full_s_estimate"] = epochs * out[f"{model}_reference_s_per_epoch"]
        save()
    return out


def bench_step(images: np.ndarray, labels: np.ndarray, device: torch.device, args) -> dict:
    """Steps/s of the training step per precision (CUDA graphs and the compiled solver on
    CUDA) and a torch.profiler table of the last one."""
    from dpsinkhorn import config as config_lib
    from dpsinkhorn.train.trainer import Trainer

    cfg = config_lib.load_config(args.config)
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to benchmark")
    cuda = device.type == "cuda"
    out: dict = {"experiment": args.experiment, "cuda_graphs": cuda, "compile_solver": cuda}
    for precision in args.step_precisions:
        trainer = Trainer(spec, images, labels, device, cuda, cuda, precision)
        out[f"{precision}_steps_per_s"] = time_steps(trainer.step, device, args.steps, args.warmup)
        if args.profile_steps and precision == args.step_precisions[-1]:
            out[f"{precision}_profile"] = profile_kernels(trainer.step, device, args.profile_steps)
    return out


def _section(result: dict, key: str, save, fn, *args) -> None:
    """``result[key] = fn(*args)``, or ``{"error": ...}`` if it raises; then ``save(result)``,
    so a crash or a deadline later in a short GPU call keeps what was measured."""
    try:
        result[key] = fn(*args)
    except Exception as err:  # noqa: BLE001 -- one failed section must not lose the others
        partial = result[key] if isinstance(result.get(key), dict) else {}
        result[key] = {**partial, "error": f"{type(err).__name__}: {err}".splitlines()[0][:500]}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    save(result)


def check_args(args: argparse.Namespace) -> None:
    """Refuse before any work what a section would fail on only after the sections before it
    had spent the call's time: repeated seeds, fewer than 2 samples (FID, hold-out), a count
    below 1 (``--reference-seeds`` 0 divided the FID section's seconds by zero)."""
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds needs distinct seeds, got {args.seeds}")
    least = {
        "--num": (args.num, 2),
        "--num-test": (args.num_test, 2),
        "--reference-seeds": (args.reference_seeds, 1),
        "--compare-epochs": (args.compare_epochs, 1),
        "--max-epochs": (args.max_epochs, 1),
        "--patience": (args.patience, 1),
        "--batch-size": (args.batch_size, 1),
        "--max-iter": (args.max_iter, 1),
    }
    for name, (value, low) in least.items():
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")


def run(args: argparse.Namespace, save=lambda result: None) -> dict:
    """Everything in the module docstring; returns the JSON's dict. ``save(result)`` is
    called after each section with what is measured so far."""
    check_args(args)
    device = resolve_device(args.device)
    start = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result: dict = {"settings": {k: v for k, v in vars(args).items() if k != "handler"}}
    result.update(
        device=f"{device} ({name})", torch=torch.__version__, threads=torch.get_num_threads()
    )
    gen = load_generator(Path(args.generator), device)
    sec, draws = _timed(device, lambda: [sample_generator(gen, args.num, s) for s in args.seeds])
    if args.test:
        test = fileio.load_samples(args.test)
        test = (test[0][: args.num_test], test[1][: args.num_test])
    else:  # the generator's samples of another seed stand in for the real test set
        test = sample_generator(gen, args.num_test, 10_000)
    phases = {"sample_s": sec}
    if args.weights:
        net = inception.load_inception(args.weights, device)
    else:
        net = inception.random_inception(test[0][:16], device)
    result["inception"] = "real weights" if args.weights else "random weights (timing only)"
    _section(result, "fid", save, bench_fid, draws, test[0], net, device, args)
    result["classifiers"] = {}  # filled classifier by classifier, each saved
    _section(
        result,
        "classifiers",
        save,
        bench_classifiers,
        draws,
        test,
        args.seeds,
        device,
        args,
        result["classifiers"],
        lambda: save(result),
    )
    if args.step_precisions:
        step_data = sample_generator(gen, args.step_records, 20_000)
        _section(result, "train_step", save, bench_step, *step_data, device, args)
    fid, cls = result["fid"], result["classifiers"]
    models = args.classifiers
    if "error" not in fid and "error" not in cls:
        common = phases["sample_s"] + cls["logreg_s"]
        phases["reference_s"] = (
            common
            + fid["reference_total_s"]
            + sum(cls[f"{m}_reference_full_s_estimate"] for m in models)
        )
        phases["fast_s"] = (
            common + fid["fast_total_s"] + sum(cls[f"{m}_fast_full_s"] for m in models)
        )
        phases["ratio"] = phases["reference_s"] / phases["fast_s"]
    result["evaluation"] = phases
    result["wall_s"] = time.perf_counter() - start
    save(result)
    return result


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench-eval``."""
    p = subparsers.add_parser(
        "bench-eval", help="time one generator's evaluation (reference vs fast) and the step"
    )
    p.add_argument("--generator", required=True, help="generator.pt (e.g. a committed one)")
    p.add_argument("--out", required=True, help="the JSON of phase times and ratios")
    p.add_argument("--device", default="auto")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--num", type=int, default=60_000, help="samples per seed")
    p.add_argument("--num-test", type=int, default=10_000, help="test / reference images")
    p.add_argument("--test", default=None, help="real test.npz (default: generator samples)")
    p.add_argument("--weights", default=None, help="real Inception weights (default: random)")
    p.add_argument("--reference-seeds", type=int, default=1, help="seeds of the slow FID path")
    p.add_argument("--fid-batch", type=int, default=None, help="reference Inception batch")
    p.add_argument("--fast-fid-batch", type=int, default=None, help="fast Inception batch")
    p.add_argument("--fid-precisions", nargs="*", default=["tf32", "bf16", "fp16"])
    p.add_argument("--sqrtm", default="pytorch_fid", choices=["pytorch_fid", "eigh"])
    p.add_argument("--classifiers", nargs="*", default=["mlp", "cnn"])
    p.add_argument("--compare-epochs", type=int, default=3)
    p.add_argument("--max-epochs", type=int, default=1000)
    p.add_argument("--patience", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-iter", type=int, default=5000, help="Log-Reg L-BFGS iterations")
    p.add_argument("--config", nargs="+", default=["config/config.yaml"])
    p.add_argument("--experiment", default="mnist_dpsinkhorn")
    p.add_argument("--step-precisions", nargs="*", default=["tf32", "bf16"])
    p.add_argument("--step-records", type=int, default=60_000, help="the step's training data")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--profile-steps", type=int, default=20)
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    result = run(args, save=lambda partial: fileio.write_json(args.out, partial))
    print(json.dumps(result["evaluation"]))
    return 0
