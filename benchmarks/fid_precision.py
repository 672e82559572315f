"""FID error of each faster Inception arithmetic against IEEE fp32, for several generators and
the real-data row, as the workflow computes FID (samples of one seed against the real test
set's fp32 statistics); writes one JSON, saved after every row, so a deadline keeps what
was measured.

    python benchmarks/fid_precision.py --weights pt_inception-2015-12-05-6726825d.pth \\
        --data-mirror DIR --generators a/generator.pt b/generator.pt --out fid_precision.json

Each row: FID in fp32 and, per precision, the FID, its absolute and relative error, the
feature seconds and whether both errors are within ``--max-absolute-error`` and
``--max-relative-error`` (a row outside stays fp32). ``bound``: per precision the largest
errors over the rows and the rows outside. ``real_<dataset>``: ``--num`` records of the
training split drawn as the real-data row's samples are (``evaluate.sample.sample_real``),
FID about 1-2. The distance is computed on the device (``--sqrtm eigh``). ``pytorch_fid``
(after every precision row, for the first ``--pytorch-fid-rows`` rows, default the
real-data row): the same images' FID by the reference path, pytorch-fid's own forward
(unfolded, NCHW, fp32) and distance (tests/oracles.py), and the fp32 fast path's errors
against it. Defaults: the paper's protocol (60,000 samples, seed 0, the whole test set).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from dpsinkhorn import fileio
from dpsinkhorn.data.datasets import prepare
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate import inception
from dpsinkhorn.evaluate.fid import device_statistics, fid_from_stats
from dpsinkhorn.evaluate.sample import generate, load_generator, sample_real

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from oracles import pytorch_fid_activations, pytorch_fid_statistics  # noqa: E402


def features_statistics(images, net, device, precision: str, batch: int | None):
    """(seconds, (mu, sigma) on the device) of the pool3 features of uint8 ``images`` in
    ``precision``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    stats = device_statistics(inception.activations(images, net, batch, precision))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin, stats


def errors(value: float, reference: float, args) -> dict:
    """``value``'s absolute and relative error against ``reference`` and whether both are
    within ``--max-absolute-error`` and ``--max-relative-error``."""
    absolute, relative = abs(value - reference), abs(value / reference - 1)
    within = absolute <= args.max_absolute_error and relative <= args.max_relative_error
    return {"absolute_error": absolute, "relative_error": relative, "within": within}


def pytorch_fid(images, test_stats, net, device, batch: int) -> tuple[float, float]:
    """(seconds, FID) of uint8 ``images`` by pytorch-fid's own forward and distance against
    ``test_stats`` (the test set's, by the same path)."""
    from pytorch_fid.fid_score import calculate_frechet_distance

    begin = time.perf_counter()
    images = images.cpu().numpy() if torch.is_tensor(images) else images
    acts = pytorch_fid_activations(images, device=device, batch_size=batch, model=net)
    fid = calculate_frechet_distance(*pytorch_fid_statistics(acts), *test_stats)
    return time.perf_counter() - begin, float(fid)


def bound(rows: dict, precisions: list[str]) -> dict:
    """Per precision: the largest absolute and relative FID error over ``rows`` and the rows
    outside the bound (which stay fp32)."""
    return {
        precision: {
            "max_absolute_error": max(row[precision]["absolute_error"] for row in rows.values()),
            "max_relative_error": max(row[precision]["relative_error"] for row in rows.values()),
            "rows_outside": [name for name, row in rows.items() if not row[precision]["within"]],
        }
        for precision in precisions
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", required=True, help="pytorch-fid's Inception weights file")
    p.add_argument("--data-mirror", required=True, help="folder of <Dataset>/raw/*.gz")
    p.add_argument("--dataset", default="mnist", help="the generators' dataset")
    p.add_argument("--generators", nargs="*", default=[], help="generator.pt files")
    p.add_argument("--precisions", nargs="+", default=["tf32", "fp16"])
    p.add_argument("--num", type=int, default=60_000, help="samples per row")
    p.add_argument("--num-test", type=int, default=None, help="test images (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sqrtm", default="eigh", choices=["pytorch_fid", "eigh"])
    p.add_argument("--fid-batch", type=int, default=None, help="Inception batch")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-absolute-error", type=float, default=0.05, help="bound checked")
    p.add_argument("--max-relative-error", type=float, default=0.01, help="bound checked")
    p.add_argument("--pytorch-fid-rows", type=int, default=1, help="rows checked by pytorch-fid")
    p.add_argument("--out", required=True, help="the JSON written")
    args = p.parse_args(argv)
    unknown = set(args.precisions) - set(inception.FID_PRECISIONS)
    if unknown or min(args.num, args.num_test or 2) < 2 or args.pytorch_fid_rows < 0:
        p.error(
            f"--precisions from {inception.FID_PRECISIONS}; --num, --num-test at least 2; "
            "--pytorch-fid-rows at least 0"
        )

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"settings": vars(args), "device": f"{name} (torch {torch.__version__})", "rows": {}}
    with tempfile.TemporaryDirectory() as root:
        splits = prepare(args.dataset, Path(root), Path(args.data_mirror))
        test = fileio.load_samples(splits["test"])[0][: args.num_test]
        rows = {f"real_{args.dataset}": sample_real(splits["train"], args.num, args.seed)[0]}
    net = inception.load_inception(args.weights, device)
    seconds, (mu_r, sigma_r) = features_statistics(test, net, device, "fp32", args.fid_batch)
    result["reference"] = {"images": len(test), "fp32_features_s": seconds}
    for path in args.generators:
        generator = load_generator(Path(path), device)
        rows[path] = generate(generator, args.num, args.seed)[0]  # on the device
    for row, images in rows.items():
        seconds, stats = features_statistics(images, net, device, "fp32", args.fid_batch)
        reference = fid_from_stats(*stats, mu_r, sigma_r, args.sqrtm)
        out = result["rows"][row] = {"fp32": {"fid": reference, "features_s": seconds}}
        for precision in args.precisions:
            seconds, stats = features_statistics(images, net, device, precision, args.fid_batch)
            value = fid_from_stats(*stats, mu_r, sigma_r, args.sqrtm)
            out[precision] = {"fid": value, **errors(value, reference, args), "features_s": seconds}
        result["bound"] = bound(result["rows"], args.precisions)
        fileio.write_json(args.out, result)
    batch = args.fid_batch or 200
    if checked := list(rows)[: args.pytorch_fid_rows]:  # the reference path, at full size
        acts = pytorch_fid_activations(test, device=device, batch_size=batch, model=net)
        test_stats = pytorch_fid_statistics(acts)
    for row in checked:
        seconds, value = pytorch_fid(rows[row], test_stats, net, device, batch)
        fast = result["rows"][row]["fp32"]["fid"]
        result["rows"][row]["pytorch_fid"] = {"fid": value, **errors(fast, value, args)}
        result["rows"][row]["pytorch_fid"]["seconds"] = seconds
        fileio.write_json(args.out, result)
    for precision, worst in result["bound"].items():
        print(f"{precision}: {worst}")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
