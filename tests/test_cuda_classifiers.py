"""The classifier loop on CUDA (skipped without one): the step replayed from a CUDA graph
follows the eager loop within the seed-to-seed spread, and a capture that fails falls back
to eager steps and says so (``training_loop.cuda_graph_error``)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dpsinkhorn.evaluate import classifiers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _data(k: int = 2, n: int = 600):
    g = torch.Generator().manual_seed(0)
    proto = torch.rand(10, 1, 28, 28, generator=g)
    xs, ys = [], []
    for _ in range(k):
        y = torch.randint(0, 10, (n,), generator=g)
        xs.append((proto[y] + 0.3 * torch.rand(n, 1, 28, 28, generator=g)).cuda())
        ys.append(y.cuda())
    y_test = torch.randint(0, 10, (300,), generator=g)
    x_test = (proto[y_test] + 0.3 * torch.rand(300, 1, 28, 28, generator=g)).cuda()
    return xs, ys, x_test, y_test.cuda()


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_graphed_loop_learns_like_the_eager_one(model):
    xs, ys, x_test, y_test = _data()
    common = (model, xs, ys, x_test, y_test, 10, [0, 1], 6, 2, 64)
    graphed = classifiers.train_batched(*common, cuda_graphs=True)
    eager = classifiers.train_batched(*common, cuda_graphs=False)
    assert all(r["training_loop"]["cuda_graphs"] for r in graphed)
    for g, e in zip(graphed, eager, strict=True):
        assert g["accuracy"] > 0.5 and abs(g["accuracy"] - e["accuracy"]) < 0.1


def test_a_refused_capture_falls_back_to_eager_steps(monkeypatch):
    @contextlib.contextmanager
    def refuse(graph, *args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    monkeypatch.setattr(torch.cuda, "graph", refuse)
    xs, ys, x_test, y_test = _data()
    records = classifiers.train_batched(
        "mlp", xs, ys, x_test, y_test, 10, [0, 1], 6, 2, 64, cuda_graphs=True
    )
    for r in records:
        assert r["training_loop"]["cuda_graphs"] is False
        assert "not permitted" in r["training_loop"]["cuda_graph_error"]
        assert r["accuracy"] > 0.5


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_fid_beside_the_graphed_classifier_gives_the_sequential_results(model, monkeypatch):
    """``evaluate.job.run_phases`` on CUDA: Inception features (fp16, as the fast FID path)
    on one stream beside the classifier (its step captured into a CUDA graph meanwhile) on
    another give what the two give one after the other (deterministic cuDNN for the
    comparison)."""
    import numpy as np

    from dpsinkhorn.evaluate import inception, job

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    xs, ys, x_test, y_test = _data()
    images = np.random.default_rng(0).integers(0, 256, (64, 28, 28), np.uint8)
    net = inception.random_inception(images[:8], "cuda")
    resident = torch.from_numpy(images).cuda()

    def features() -> dict:
        return {"features": inception.activations(resident, net, 16, "fp16").cpu()}

    def classifier() -> dict:
        records = classifiers.train_batched(model, xs, ys, x_test, y_test, 10, [0, 1], 6, 2, 64)
        return {"records": records}

    device = torch.device("cuda")
    sequential = job.run_phases([features, classifier], False, device)
    concurrent = job.run_phases([features, classifier], True, device)
    assert torch.equal(sequential[0]["features"], concurrent[0]["features"])
    assert all(r["training_loop"]["cuda_graphs"] for r in concurrent[1]["records"])
    assert sequential[1] == concurrent[1]
