"""The fast classifier loop (``evaluate.fastfit``) gives the reference loop's results on
the CPU: the same arithmetic, early stopping on the device, also when the stop is read an
epoch late. Tiny sets of real MNIST images, a few epochs."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsinkhorn.evaluate import classifiers, classify, fastfit


@pytest.fixture(scope="module")
def sets(data_mirror: Path) -> tuple[list, list, torch.Tensor, torch.Tensor]:
    """Two training sets of 120 real MNIST images (float32 [N,1,28,28]) and a test set of 100."""
    raw = data_mirror / "MNIST" / "raw"
    with gzip.open(raw / "t10k-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:340]
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)[:340]
    x = torch.from_numpy(classify.to_float(images))
    y = torch.from_numpy(labels)
    return [x[:120], x[120:240]], [y[:120], y[120:240]], x[240:], y[240:]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("lag", [0, 1])
def test_fast_loop_equals_reference_loop_on_cpu(model, lag, sets):
    xs, ys, x_test, y_test = sets
    args = (model, xs, ys, x_test, y_test, 10, [3, 4], 12, 2, 32)
    reference = classifiers.train_torch_batched(*args)
    fast = fastfit.train_torch_batched_fast(*args, lag=lag)
    for r, f in zip(reference, fast, strict=True):
        assert set(r) | set(f) <= classify.RECORD_KEYS  # what a release may publish
        assert f.pop("fast_loop") == {"cuda_graphs": False, "stop_read_lag_epochs": lag}
        assert f == r
    assert any(r["epochs"] < 12 for r in reference)  # early stopping was exercised
    assert len({r["epochs"] for r in reference}) == 2 or model == "cnn"


def test_fast_needs_batched_and_graphs_need_cuda(sets):
    xs, ys, x_test, y_test = sets
    with pytest.raises(ValueError, match="batched"):
        classify.train_and_evaluate_seeds(
            "mlp",
            [(np.zeros((4, 28, 28), np.uint8), np.arange(4))],
            np.zeros((4, 28, 28), np.uint8),
            np.arange(4),
            [0],
            fast=True,
            device="cpu",
        )
    with pytest.raises(ValueError, match="CUDA"):
        fastfit.train_torch_batched_fast(
            "mlp", xs, ys, x_test, y_test, 10, [0, 1], 1, 1, 32, cuda_graphs=True
        )
