"""The fast FID path (``evaluate --fast``: batch norm folded, channels-last, statistics on
the device) against today's reference path, with the real Inception weights on real
MNIST images: features within 1e-5 of the largest, FID within 1e-5 relative (the issue's
tolerance is 1e-3). Few images: Inception runs at a few images per second on this CPU."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsinkhorn.evaluate import fid, inception


@pytest.fixture(scope="module")
def images(data_mirror: Path) -> np.ndarray:
    """24 real MNIST test images, uint8 [24,28,28]."""
    with gzip.open(data_mirror / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz") as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:24].copy()


def test_fast_fid_equals_the_reference_fid(images, fid_weights, tmp_path):
    reference = tmp_path / "ref.npz"
    mu, sigma = fid.statistics(images[12:], fid_weights, "cpu")
    fid.save_statistics(reference, mu, sigma, 12)
    acts = inception.activations(images[:12], fid_weights, "cpu")
    model = inception.load_inception(fid_weights, "cpu")
    fast_acts = inception.device_activations(images[:12], model, batch_size=5).double().numpy()
    assert np.abs(fast_acts - acts).max() <= 1e-5 * np.abs(acts).max()
    mu_f, sigma_f = fid.device_statistics(inception.device_activations(images[:12], model))
    mu_r, sigma_r = fid.statistics_of_activations(acts)
    assert np.allclose(mu_f, mu_r, rtol=0, atol=1e-5) and np.allclose(sigma_f, sigma_r, atol=1e-5)
    records = [
        fid.fid_against_reference(
            images[:12], reference, "s.npz", fid_weights, "cpu", sqrtm="eigh", fast=fast
        )
        for fast in (False, True)
    ]
    assert abs(records[1]["fid"] / records[0]["fid"] - 1) < 1e-5
    assert set(records[0]) | set(records[1]) <= fid.RECORD_KEYS  # what a release may publish
    assert "features" not in records[0] and records[1]["features"].startswith("fast (fp32")
    assert records[1]["weights_sha256"] == records[0]["weights_sha256"]


def test_lower_precision_needs_the_fast_path(images, fid_weights):
    with pytest.raises(ValueError, match="--fast"):
        fid.statistics(images[:2], fid_weights, "cpu", precision="bf16")
    with pytest.raises(ValueError, match="unknown FID precision"):
        fid.statistics(images[:2], fid_weights, "cpu", fast=True, precision="int8")


def test_fid_stats_fast_equals_the_reference_statistics(images, fid_weights, tmp_path, run_cli):
    """The workflow's reference statistics follow ``evaluation.fast`` (``fid-stats --fast``),
    so both sides of an evaluation's FID come from the same arithmetic."""
    samples = tmp_path / "s.npz"
    np.savez(samples, images=images[:6], labels=np.zeros(6, dtype=np.int64))
    stats = {}
    for name, extra in (("reference", []), ("fast", ["--fast"])):
        stats[name] = tmp_path / f"{name}.npz"
        argv = [
            "fid-stats",
            "--samples",
            str(samples),
            "--out",
            str(stats[name]),
            "--weights",
            str(fid_weights),
            "--device",
            "cpu",
            *extra,
        ]
        assert run_cli(argv) == 0
    ref, fast = np.load(stats["reference"]), np.load(stats["fast"])
    assert np.allclose(fast["mu"], ref["mu"], rtol=0, atol=1e-5)
    assert np.allclose(fast["sigma"], ref["sigma"], rtol=0, atol=1e-5)


def _cudnn_tf32_switch():
    """(read cuDNN's fp32 convolution setting, its IEEE value, its TF32 value), in torch's
    new (``cudnn.conv.fp32_precision``) or old (``cudnn.allow_tf32``) form."""
    conv = torch.backends.cudnn.conv
    if hasattr(conv, "fp32_precision"):
        return (lambda: conv.fp32_precision), "ieee", "tf32"
    return (lambda: torch.backends.cudnn.allow_tf32), False, True


@pytest.mark.parametrize("fast", [False, True])
def test_the_fid_network_convolves_without_tf32(images, fast):
    """Both feature paths run with cuDNN's TF32 off (IEEE fp32 on a GPU too: with TF32 the
    paths' FIDs differed by 0.12-0.2% on an H100); the switch is restored after."""
    from dpsinkhorn.evaluate.inception import activations, device_activations, random_inception

    state, ieee, _ = _cudnn_tf32_switch()
    model = random_inception(images[:4])
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append(state()))
    net = inception.fast_network(model)
    net.blocks[0].register_forward_pre_hook(lambda *_: seen.append(state()))
    before = state()
    if fast:
        device_activations(images[:2], model)
    else:
        activations(images[:2], model=model)
    assert seen and all(s == ieee for s in seen) and state() == before


def test_tf32_precision_convolves_in_tf32_and_equals_fp32_on_the_cpu(images):
    """``--fid-precision tf32``: cuDNN may convolve in TF32 inside the call (the switch is
    restored after); on a CPU, where cuDNN does not convolve, the features are fp32's bit for
    bit. Its FID difference from IEEE fp32 is a GPU measurement (``bench-eval``)."""
    from dpsinkhorn.evaluate.inception import device_activations, random_inception

    state, _, tf32 = _cudnn_tf32_switch()
    model = random_inception(images[:4])
    seen = []
    inception.fast_network(model).blocks[0].register_forward_pre_hook(
        lambda *_: seen.append(state())
    )
    before = state()
    features = device_activations(images[:3], model, precision="tf32")
    assert seen and all(s == tf32 for s in seen) and state() == before
    assert torch.equal(features, device_activations(images[:3], model, precision="fp32"))
