"""Fréchet Inception Distance (FID): statistics, the distance, statistics files, ``fid-stats``.

The Gaussian statistics (``mu`` [2048], ``sigma`` [2048,2048], float64) of the pool3
features (:mod:`dpsinkhorn.evaluate.inception`) of samples, against those of the real test
split, computed once by ``dpsinkhorn fid-stats``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import scipy.linalg
import torch

from dpsinkhorn import fileio
from dpsinkhorn.evaluate.inception import (
    DEFAULT_BATCH,
    WEIGHTS_FILE_NAME,
    activations,
    hub_cache_file,
    load_inception,
    network_sha256,
    verify_weights,
)
from dpsinkhorn.evaluate.sample import channels_last


def device_statistics(acts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [D] and unbiased covariance [D,D] (float64, as ``np.cov``: centred cross product
    / (N - 1)) of features [N,D], N >= 2, on their device."""
    if acts.ndim != 2 or len(acts) < 2:
        raise ValueError(f"FID statistics need at least 2 images, got {len(acts)}")
    x = acts.double()
    mu = x.mean(dim=0)
    x = x - mu
    return mu, (x.T @ x) / (len(x) - 1)


def statistics(
    images: np.ndarray,
    weights: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    batch_size: int | None = None,
    precision: str = "fp32",
) -> tuple[np.ndarray, np.ndarray]:
    """(mu [2048], sigma [2048,2048]) of the pool3 features of uint8 images [N,H,W(,C)],
    features in ``precision`` (:data:`inception.FID_PRECISIONS`), statistics on the device."""
    model = load_inception(weights, device)
    mu, sigma = device_statistics(activations(images, model, batch_size, precision))
    return mu.cpu().numpy(), sigma.cpu().numpy()


SQRTM_METHODS = ("pytorch_fid", "eigh")
Statistics = tuple[np.ndarray, np.ndarray, int]  # (mu [D], sigma [D,D], num_images)
#: Every key an FID score file holds (:func:`fid_against_reference`); ``dpsinkhorn release``
#: publishes no score file holding another.
RECORD_KEYS = frozenset(
    "fid sqrtm num_images_a num_images_b weights weights_sha256 image_shape a b a_sha256 "
    "b_sha256 seed features".split()
)
#: pytorch-fid's ``eps``: added to both diagonals when sqrtm of the product is not finite
PYTORCH_FID_EPS = 1e-6


def _sqrtm(a: np.ndarray) -> np.ndarray:
    """``scipy.linalg.sqrtm(a)`` (Schur) under every scipy version: pytorch-fid 0.3.0's
    ``sqrtm(a, disp=False)`` fails on scipy 1.18, which removed ``disp``."""
    root = scipy.linalg.sqrtm(a)
    return root[0] if isinstance(root, tuple) else root


def frechet_distance_pytorch_fid(
    mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray
) -> float:
    """pytorch-fid 0.3.0's ``calculate_frechet_distance`` step by step on current scipy:
    ||mu1 - mu2||^2 + tr s1 + tr s2 - 2 tr sqrtm(s1 s2) (s1, s2 + 1e-6 I where the root is
    not finite; an imaginary diagonal above 1e-3 is a ``ValueError``). mu [D], s [D,D]."""
    mu1, mu2 = np.atleast_1d(mu1), np.atleast_1d(mu2)
    s1, s2 = np.atleast_2d(s1), np.atleast_2d(s2)
    diff = mu1 - mu2
    covmean = _sqrtm(s1.dot(s2))
    if not np.isfinite(covmean).all():
        offset = np.eye(s1.shape[0]) * PYTORCH_FID_EPS
        print(f"fid calculation produces singular product; adding {PYTORCH_FID_EPS} to diagonal")
        covmean = _sqrtm((s1 + offset).dot(s2 + offset))
    if np.iscomplexobj(covmean):
        if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
            raise ValueError(
                f"FID: sqrtm(s1 s2) has imaginary component {np.max(np.abs(covmean.imag))}"
            )
        covmean = covmean.real
    return float(diff.dot(diff) + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def trace_sqrt_product(s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """tr sqrt(s1 s2) of symmetric PSD float64 s1, s2 [D,D], exact, on their device.

    s1 = B B^T with B = V_r diag(sqrt(w_r)) [D,r] over the r eigenvalues of s1 above
    rounding (w_i > D eps max w, numpy's ``matrix_rank`` threshold); the nonzero eigenvalues
    of s1 s2 are those of the PSD [r,r] B^T s2 B (rounding's negatives clipped to 0). For
    N < D samples r <= N - 1: the second solve is small."""
    w, v = torch.linalg.eigh(s1)
    kept = w > len(w) * torch.finfo(torch.float64).eps * w.max().clamp(min=0)
    b = v[:, kept] * w[kept].sqrt()  # [D,r]: s1 = b b^T
    m = b.T @ s2 @ b
    return torch.linalg.eigvalsh((m + m.T) / 2).clamp(min=0).sqrt().sum()


def fid_from_stats(mu1, s1, mu2, s2, method: str = "pytorch_fid") -> float:
    """Fréchet distance between Gaussians N(mu1, s1) and N(mu2, s2) (mu [D], s [D,D], numpy
    or torch). ``method`` computes tr sqrt(s1 s2): ``"pytorch_fid"``, on the host as
    published FIDs do (:func:`frechet_distance_pytorch_fid`); ``"eigh"``, exact for PSD
    covariances, in float64 on the tensors' device (:func:`trace_sqrt_product`). Their
    agreement: tests/test_fid.py."""
    if method not in SQRTM_METHODS:
        raise ValueError(f"unknown FID sqrtm method {method!r}; choose from {SQRTM_METHODS}")
    if mu1.shape != mu2.shape or s1.shape != s2.shape or tuple(s1.shape) != tuple(mu1.shape) * 2:
        raise ValueError(
            f"FID statistics do not match: mu {tuple(mu1.shape)} vs {tuple(mu2.shape)}, "
            f"sigma {tuple(s1.shape)} vs {tuple(s2.shape)}"
        )
    stats = (mu1, s1, mu2, s2)
    if method == "pytorch_fid":
        arrays = [x.cpu().numpy() if torch.is_tensor(x) else x for x in stats]
        return frechet_distance_pytorch_fid(*arrays)
    device = next((x.device for x in stats if torch.is_tensor(x)), torch.device("cpu"))
    mu1, s1, mu2, s2 = (torch.as_tensor(x, dtype=torch.float64, device=device) for x in stats)
    s1, s2 = (s1 + s1.T) / 2, (s2 + s2.T) / 2
    diff = mu1 - mu2
    return float(diff @ diff + s1.trace() + s2.trace() - 2 * trace_sqrt_product(s1, s2))


def save_statistics(
    path: str | os.PathLike,
    mu: np.ndarray,
    sigma: np.ndarray,
    num_images: int,
    image_shape: tuple[int, ...] | None = None,
    weights_sha256: str | None = None,
    source_sha256: str | None = None,
) -> None:
    """Write a statistics file atomically: ``mu`` [D], ``sigma`` [D,D] float64,
    ``num_images`` and, when given, the images' ``image_shape`` [H,W,C], the network's
    ``weights_sha256`` (:func:`check_same_inputs`) and ``source_sha256``, the sample file's
    (``dpsinkhorn release`` publishes an FID only against the public test split's)."""
    given = {"source_sha256": source_sha256, "weights_sha256": weights_sha256}
    extra = {k: np.asarray(v) for k, v in given.items() if v is not None}
    if image_shape is not None:
        extra["image_shape"] = np.asarray(image_shape, np.int64)
    with fileio.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(
            fh,
            mu=np.asarray(mu, np.float64),
            sigma=np.asarray(sigma, np.float64),
            num_images=np.int64(num_images),
            **extra,
        )


def load_statistics(path: str | os.PathLike) -> Statistics:
    """Read and validate a statistics file: (mu [D], sigma [D,D] float64, num_images); any
    other file (a sample file) is refused in one line, before any feature is computed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FID statistics file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            mu, sigma, num = npz["mu"], npz["sigma"], npz["num_images"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not an FID statistics file (mu, sigma, num_images)") from err
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)) or num.shape != ():
        raise ValueError(
            f"{path}: statistics must be mu [D], sigma [D,D], num_images scalar; got "
            f"{mu.shape}, {sigma.shape}, {num.shape}"
        )
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f"{path}: statistics contain NaN or inf")
    return mu.astype(np.float64), sigma.astype(np.float64), int(num)


def statistics_metadata(path: str | os.PathLike) -> dict:
    """``{"image_shape": [H,W,C] | None, "weights_sha256": str | None, "source_sha256":
    str | None}`` of a statistics file (None where the file predates these fields)."""
    with np.load(Path(path), allow_pickle=False) as npz:
        found = {k: npz[k] for k in ("image_shape", "weights_sha256", "source_sha256") if k in npz}
    meta = {k: str(found[k]) if k in found else None for k in ("weights_sha256", "source_sha256")}
    shape = found.get("image_shape")
    return {"image_shape": None if shape is None else [int(v) for v in shape]} | meta


def subsample(images: np.ndarray, num: int | None, seed: int, where: str = "images") -> np.ndarray:
    """A seeded random subset of ``num`` images without replacement (all if ``num`` is None)."""
    if num is None:
        return images
    if not 2 <= num <= len(images):
        raise ValueError(f"{where}: cannot take {num} images out of {len(images)} (need >= 2)")
    index = np.random.default_rng(seed).choice(len(images), size=num, replace=False)
    return images[index]


def check_same_inputs(paths: list[Path], meta: list[dict], network_sha: str | None) -> str | None:
    """Refuse sides of different image shapes or networks; return the network's SHA-256."""
    shapes = [m["image_shape"] for m in meta]
    if None not in shapes and shapes[0] != shapes[1]:
        raise ValueError(
            f"FID needs images of one shape [H,W,C]: {paths[0]} has {shapes[0]}, "
            f"{paths[1]} has {shapes[1]}"
        )
    hashes = {m["weights_sha256"] for m in meta} - {None}
    if network_sha is not None:
        hashes.add(network_sha)
    if len(hashes) > 1:
        raise ValueError(
            f"FID inputs come from different Inception weights (SHA-256 {sorted(hashes)}): "
            f"{paths[0]}, {paths[1]}; recompute the statistics with one weights file"
        )
    return next(iter(hashes), None)


def fid_against_reference(
    images: np.ndarray | torch.Tensor,
    reference: str | os.PathLike,
    name: str,
    weights: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    batch_size: int | None = None,
    sqrtm: str = "pytorch_fid",
    precision: str = "fp32",
) -> dict:
    """The FID record of uint8 images [N,H,W(,C)] (host or device), saved as the sample
    file ``name``, against the statistics file ``reference``: ``fid``, the sizes, the
    verified weights' SHA-256, the image shape and both inputs by path and SHA-256
    (``dpsinkhorn release`` binds a score to its inputs). Sides of other image shapes or
    weights are refused before any feature. ``sqrtm``: :func:`fid_from_stats`'s ``method``."""
    if sqrtm not in SQRTM_METHODS:
        raise ValueError(f"unknown FID sqrtm method {sqrtm!r}; choose from {SQRTM_METHODS}")
    paths = [Path(name), Path(reference)]
    images = channels_last(images, name)
    mu_b, s_b, n_b = load_statistics(paths[1])
    shape = [int(v) for v in images.shape[1:]]
    meta = [{"image_shape": shape, "weights_sha256": None}, statistics_metadata(paths[1])]
    network_sha = None
    if weights is not None and Path(weights).is_file():
        network_sha = verify_weights(weights)
    check_same_inputs(paths, meta, network_sha)
    model = load_inception(weights, device)
    mu_a, s_a = device_statistics(activations(images, model, batch_size, precision))
    if network_sha is None:  # pytorch-fid's download, verified on loading
        network_sha = network_sha256(weights)
    return {
        "fid": fid_from_stats(mu_a, s_a, mu_b, s_b, method=sqrtm),
        "sqrtm": sqrtm,
        "num_images_a": len(images),
        "num_images_b": n_b,
        "weights": str(weights) if weights is not None else f"pytorch-fid ({hub_cache_file()})",
        "weights_sha256": check_same_inputs(paths, meta, network_sha),
        "image_shape": shape,
        "a": str(paths[0]),
        "b": str(paths[1]),
        "a_sha256": fileio.sha256_of(paths[0]) if paths[0].is_file() else None,
        "b_sha256": fileio.sha256_of(paths[1]),
        "seed": 0,
        "features": f"{precision}; batch norm folded, channels-last",
    }


# ----------------------------------------------------------------------------- CLI


def _cmd_fid_stats(args: argparse.Namespace) -> int:
    images, _ = fileio.load_samples(args.samples)
    images = subsample(
        fileio.channels_last(images, args.samples), args.num, args.seed, args.samples
    )
    mu, sigma = statistics(images, args.weights, args.device, args.batch_size)
    sha = network_sha256(args.weights)  # verified when the network was loaded
    source = fileio.sha256_of(args.samples)
    save_statistics(args.out, mu, sigma, len(images), images.shape[1:], sha, source)
    print(f"FID statistics of {len(images)} images from {args.samples} -> {args.out}")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fid-stats``."""
    p = subparsers.add_parser("fid-stats", help="Inception statistics of a sample file")
    p.add_argument("--samples", required=True, help="sample file")
    p.add_argument("--out", required=True, help="output statistics .npz (mu, sigma, num_images)")
    p.add_argument("--num", type=int, default=None, help="random subset size")
    p.add_argument("--seed", type=int, default=0, help="seed of the random subset")
    p.add_argument("--weights", default=None, help=f"path to pytorch-fid's {WEIGHTS_FILE_NAME}")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"images per Inception batch (default {DEFAULT_BATCH['cuda']} on a GPU, "
        f"{DEFAULT_BATCH['cpu']} on a CPU)",
    )
    p.set_defaults(handler=_cmd_fid_stats)
