"""Our fixed-schedule loss against geomloss with its own diameter estimate, on real MNIST.

    python benchmarks/sinkhorn_diameter.py --mirror ../shared/data --generator real \
        --generator untrained \
        --generator ../shared/measurements/h100-83ae335/block_sigma1.5/generator.pt \
        --generator ../shared/measurements/h100-83ae335/perrow_sigma1.5/generator.pt

The official DP-Sinkhorn code calls geomloss's ``SamplesLoss`` without a diameter, so
geomloss estimates one from each call's points (the diagonal of their bounding box).
Training here starts the schedule at a fixed, data-independent diameter. For several
batches (Y: n real training images drawn at random; X: n + n' samples of a generator,
labels balanced: ``untrained`` is the paper's generator at its initialisation, seed 0,
as training starts; ``real`` stands for a perfect generator, n + n' other real images
with their labels; a path is a committed generator.pt) and p in {0, 0.4, 1}, this
prints one JSON line per (generator, batch, p) with geomloss's two estimates and the
relative differences of S and of ∇_X S between our training path
(``semi_debiased_sinkhorn_with_grad``) at each fixed diameter and geomloss at its own
estimate, float64, the paper's cost (l2 + l1, m = 1), λ = 0.05, α_c = 15, scaling 0.5.
The fixed diameters: 59.88, the largest distance between two features (the default,
``ot.loss.feature_diameter``), and 73.39, the diagonal of the feature box. A last line
gives the range over batches per generator, diameter and p.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import torch
from geomloss import SamplesLoss
from geomloss._legacy.sinkhorn_divergence import max_diameter

from dpsinkhorn.data.datasets import to_unit_range
from dpsinkhorn.evaluate.sample import load_generator, sample_generator
from dpsinkhorn.models import ConditionalDCGAN, GeneratorConfig
from dpsinkhorn.ot.loss import (
    conditional_features,
    debias_size,
    feature_diameter,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.ot.solver import mixed_cost

LAMBDA, M, ALPHA_C, SCALING, CLASSES = 0.05, 1.0, 15.0, 0.5, 10


def read_mnist_train(raw: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's training images uint8 [60000,28,28] and labels int64 [60000]."""
    with gzip.open(raw / "train-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(raw / "train-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    return images, labels


def features(images: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    """[N, 784 + 10] float64: images in [-1, 1], then α_c · onehot(label)."""
    x = to_unit_range(images).double()
    return conditional_features(x, torch.as_tensor(labels), CLASSES, ALPHA_C)


def generator(spec: str) -> torch.nn.Module | None:
    """A committed generator.pt, ``untrained``: the paper's generator as initialised, or
    None for ``real`` (X drawn from the real images)."""
    if spec == "real":
        return None
    if spec == "untrained":
        torch.manual_seed(0)
        return ConditionalDCGAN(GeneratorConfig()).eval()
    return load_generator(Path(spec), torch.device("cpu"))


def geomloss_loss(x: torch.Tensor, y: torch.Tensor, n: int, p: float) -> torch.Tensor:
    """S by geomloss with autograd at its own diameter estimate, as the official code calls it."""
    n_prime = debias_size(n, p)
    cost = lambda a, b: mixed_cost(a, b, M)  # noqa: E731
    ot = SamplesLoss(
        "sinkhorn", p=1, blur=LAMBDA, debias=False, scaling=SCALING, backend="tensorized", cost=cost
    )
    x, y = x[None], y[None]
    return (2 * ot(x[:, :n], y) - ot(x[:, :n], x[:, n_prime : n + n_prime]))[0]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=Path("../shared/data"))
    parser.add_argument("--generator", action="append", required=True)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    torch.set_grad_enabled(True)
    real_images, real_labels = read_mnist_train(args.mirror / "MNIST" / "raw")
    fixed = {
        "59.88": feature_diameter(784, ALPHA_C),
        "73.39": (4 * 784 + CLASSES * ALPHA_C**2) ** 0.5,
    }
    n, ranges = args.n, {}
    for spec in args.generator:
        model, rng = generator(spec), np.random.default_rng(0)
        for batch in range(args.batches):
            pick = rng.choice(len(real_labels), n, replace=False)
            y = features(real_images[pick], real_labels[pick])
            if model is None:
                other = rng.choice(len(real_labels), 2 * n, replace=False)
                x_all = features(real_images[other], real_labels[other])
            else:
                with torch.no_grad():
                    gen_images, gen_labels = sample_generator(model, 2 * n, seed=batch)
                x_all = features(gen_images, gen_labels)
            for p in (0.0, 0.4, 1.0):
                rows, n_prime = n + debias_size(n, p), debias_size(n, p)
                x = x_all[:rows].clone().requires_grad_()
                ref = geomloss_loss(x, y, n, p)
                (ref_grad,) = torch.autograd.grad(ref, x)
                cross, other = x[:n].detach(), x[n_prime:rows].detach()
                line = {
                    "generator": spec,
                    "batch": batch,
                    "p": p,
                    "geomloss_diameter": {
                        "data_term": max_diameter(cross, y),
                        "self_term": max_diameter(cross, other),
                    },
                }
                for name, diameter in fixed.items():
                    loss, grad = semi_debiased_sinkhorn_with_grad(
                        x.detach(),
                        y,
                        torch.ones(n, dtype=y.dtype),
                        n,
                        p,
                        LAMBDA,
                        M,
                        scaling=SCALING,
                        diameter=diameter,
                    )
                    found = {
                        "S_rel": abs(loss.item() - ref.item()) / abs(ref.item()),
                        "grad_rel": relative(grad, ref_grad),
                    }
                    line[name] = found
                    for key, value in found.items():
                        low, high = ranges.setdefault(f"{spec} {name} p={p:g} {key}", [1, 0])
                        ranges[f"{spec} {name} p={p:g} {key}"] = [min(low, value), max(high, value)]
                for key, value in line["geomloss_diameter"].items():
                    low, high = ranges.setdefault(f"{spec} geomloss {key}", [1e9, 0])
                    ranges[f"{spec} geomloss {key}"] = [min(low, value), max(high, value)]
                print(json.dumps(line), flush=True)
    print(json.dumps({"range_over_batches": ranges, "batches": args.batches, "n": n}))


if __name__ == "__main__":
    main()
