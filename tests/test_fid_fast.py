"""The fast FID path (``evaluate --fast``: batch norm folded, channels-last, statistics on
the device) against today's reference path, with the real Inception weights on real
MNIST images: features within 1e-5 of the largest, FID within 1e-5 relative (the issue's
tolerance is 1e-3). Few images: Inception runs at a few images per second on this CPU."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

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
        fid.fid_against_reference(images[:12], reference, "s.npz", fid_weights, "cpu",
                                  sqrtm="eigh", fast=fast)
        for fast in (False, True)
    ]  # fmt: skip
    assert abs(records[1]["fid"] / records[0]["fid"] - 1) < 1e-5
    assert set(records[0]) | set(records[1]) <= fid.RECORD_KEYS  # what a release may publish
    assert "features" not in records[0] and records[1]["features"].startswith("fast (fp32")
    assert records[1]["weights_sha256"] == records[0]["weights_sha256"]


def test_lower_precision_needs_the_fast_path(images, fid_weights):
    with pytest.raises(ValueError, match="--fast"):
        fid.statistics(images[:2], fid_weights, "cpu", precision="bf16")
    with pytest.raises(ValueError, match="unknown FID precision"):
        fid.statistics(images[:2], fid_weights, "cpu", fast=True, precision="int8")
