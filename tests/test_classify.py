"""Classifiers of appendix D.2 trained on real MNIST images, tested on real ones: the one
batched trainer against the oracles (scikit-learn's Log-Reg, a plain per-seed torch loop)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from oracles import sklearn_logreg, train_one_seed

from dpsinkhorn.evaluate import classifiers, classify

DEVICE = "cpu"
FAST = {"max_epochs": 5, "patience": 2}  # mlp/cnn: a few epochs are enough on real data


def _read_idx(raw: Path, prefix: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """First ``n`` images uint8 [n,28,28] and labels int64 [n] of an MNIST idx pair."""
    with gzip.open(raw / f"{prefix}-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(raw / f"{prefix}-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)[:n]
    return images, labels


def _one(model, x, y, x_test, y_test, seed, **kw) -> dict:
    """One seed's record of :func:`classify.train_and_evaluate_seeds`."""
    return classify.train_and_evaluate_seeds(model, [(x, y)], x_test, y_test, [seed], **kw)[0]


@pytest.fixture(scope="module")
def mnist(data_mirror: Path) -> tuple[np.ndarray, ...]:
    """(train images, train labels, test images, test labels): 2000 and 1000 real MNIST."""
    raw = data_mirror / "MNIST" / "raw"
    return (*_read_idx(raw, "train", 2000), *_read_idx(raw, "t10k", 1000))


@pytest.mark.parametrize("model", classifiers.MODELS)
def test_accuracy_well_above_chance(model, mnist):
    result = _one(model, *mnist, seed=0, device=DEVICE, **FAST)
    print(f"{model}: accuracy {result['accuracy']:.3f} in {result['seconds']:.1f} s")
    # measured on CPU with seed 0: logreg 0.858, mlp 0.830, cnn 0.844 (chance 0.1)
    assert result["accuracy"] > 0.8
    assert result["model"] == model and result["seed"] == 0
    assert result["num_train"] == 2000 and result["num_test"] == 1000
    assert result["num_classes"] == 10 and result["seconds"] > 0
    if model == "logreg":
        assert result["holdout_accuracy"] is None and result["converged"]
    else:
        assert result["num_holdout"] == 200 and 0.5 < result["holdout_accuracy"] <= 1
        assert 1 <= result["best_epoch"] <= result["epochs"] <= FAST["max_epochs"]


def test_same_seed_same_result(mnist):
    """Same seed -> same hold-out split, initialisation, batches and dropout masks."""
    x, y, x_test, y_test = mnist
    runs = [
        _one("cnn", x[:500], y[:500], x_test, y_test, seed=7, device=DEVICE, max_epochs=2)
        for _ in range(2)
    ]
    for run in runs:
        run.pop("seconds")
    assert runs[0] == runs[1]


def test_early_stopping_keeps_the_best_holdout_epoch(mnist):
    x, y, x_test, y_test = mnist
    result = _one(
        "mlp", x[:300], y[:300], x_test, y_test, seed=1, device=DEVICE, max_epochs=200, patience=3
    )
    assert result["epochs"] < 200
    assert result["epochs"] == result["best_epoch"] + 3


def test_cnn_takes_rgb_32x32():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(40) % 3
    result = _one(
        "cnn", images, labels, images[:10], labels[:10], seed=0, device=DEVICE, max_epochs=1
    )
    assert 0 <= result["accuracy"] <= 1 and result["num_classes"] == 3


def test_bad_arguments_are_clear_errors(mnist):
    x, y, x_test, y_test = mnist
    with pytest.raises(ValueError, match="unknown classifier 'svm'"):
        _one("svm", x, y, x_test, y_test, seed=0)
    with pytest.raises(ValueError, match="differ from the test images"):
        _one("mlp", x, y, x_test[:, :27], y_test, seed=0)
    with pytest.raises(ValueError, match="num_classes=5"):
        _one("mlp", x, y, x_test, y_test, seed=0, num_classes=5)


# ----------------------------------------------------------------------------- class count


def test_labels_outside_the_dataset_classes_are_refused(mnist):
    """A 42 among MNIST labels is refused, not trained as a 43-class classifier."""
    x, y, x_test, y_test = mnist
    labels = y[:50].copy()
    labels[7] = 42
    assert classify.resolve_num_classes("mnist") == 10
    with pytest.raises(ValueError, match="outside the 10 classes"):
        _one(
            "mlp",
            x[:50],
            labels,
            x_test,
            y_test,
            seed=0,
            device=DEVICE,
            num_classes=classify.resolve_num_classes("mnist"),
        )


def test_workflow_evaluates_each_generator_in_one_job(tmp_path):
    """Dry run of the shipped paper config: one evaluate job per experiment, all seeds and
    its dataset's classifiers, with --dataset (the class count)."""
    import re
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    snakemake = Path(sys.executable).parent / "snakemake"
    cmd = [str(snakemake), "-s", str(repo / "Snakefile"), "-d", str(tmp_path), "-n", "-p"]
    cmd += ["results/paper/tables/table1.md", "--configfile", str(repo / "config" / "config.yaml")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [s for s in out.stdout.splitlines() if "dpsinkhorn evaluate " in s]
    line = next(s for s in lines if " results/paper/mnist_dpsinkhorn/generator.pt" in s)
    assert "--seed 0 1 2 3 4" in line and "--dataset mnist" in line
    assert "--classifiers logreg mlp cnn" in line and "--num 60000" in line
    assert "--scores-dir results/paper/mnist_dpsinkhorn " in line
    real = next(s for s in lines if "--real-data" in s and "--dataset fmnist" in s)
    assert "/fmnist/train.npz" in real
    assert not re.search(r"dpsinkhorn (sample|fid|classify) ", out.stdout)  # no per-step jobs


def test_batched_seeds_agree_with_the_oracles(mnist):
    """Five seeds trained together: MLP (no dropout) exactly as the plain per-seed loop;
    CNN (its dropout masks come from one stream for all seeds) within the seed-to-seed
    spread of the per-seed loop; Log-Reg (torch's L-BFGS on scikit-learn's objective)
    within half a point of scikit-learn's for every seed."""
    x, y, x_test, y_test = mnist
    sets = [(x[400 * k : 400 * (k + 1)], y[400 * k : 400 * (k + 1)]) for k in range(5)]
    seeds = list(range(5))
    kw = {"device": DEVICE, "max_epochs": 3, "patience": 2, "num_classes": 10}
    xt, yt = classify.to_float(x_test), torch.from_numpy(y_test)
    for model in ("logreg", "mlp", "cnn"):
        batched = classify.train_and_evaluate_seeds(model, sets, x_test, y_test, seeds, **kw)
        assert all(r["batched_seeds"] == 5 and r["seed"] == k for k, r in enumerate(batched))
        assert all(r["device"] == DEVICE for r in batched)
        assert all(set(r) <= classify.RECORD_KEYS for r in batched)  # what a release publishes
        if model == "logreg":
            oracle = [
                sklearn_logreg(classify.to_float(xs).numpy(), ys, xt.numpy(), y_test, 5000)
                for xs, ys in sets
            ]
        else:
            oracle = [
                train_one_seed(
                    model,
                    classify.to_float(xs),
                    torch.from_numpy(ys),
                    xt,
                    yt,
                    10,
                    seed,
                    kw["max_epochs"],
                    kw["patience"],
                    128,
                )
                for (xs, ys), seed in zip(sets, seeds, strict=True)
            ]
        a = np.array([r["accuracy"] for r in oracle])
        b = np.array([r["accuracy"] for r in batched])
        spread = a.std(ddof=1)
        print(f"{model}: oracle {a}, batched {b}, seed spread (std) {spread:.4f}")
        if model == "logreg":
            assert all(r["converged"] for r in oracle + batched)
            assert np.all(np.abs(b - a) <= 0.005)
        elif model == "mlp":
            np.testing.assert_array_equal(b, a)
            for r, o in zip(batched, oracle, strict=True):
                assert (r["best_epoch"], r["epochs"]) == (o["best_epoch"], o["epochs"])
                assert r["holdout_accuracy"] == o["holdout_accuracy"]
        else:
            assert spread > 0
            assert abs(b.mean() - a.mean()) <= spread
            assert np.all(np.abs(b - a) <= 3 * spread)
    with pytest.raises(ValueError, match="training sets of one size"):
        classify.train_and_evaluate_seeds(
            "mlp", [sets[0], (x[:10], y[:10])], x_test, y_test, [0, 1], **kw
        )


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_reading_the_stop_an_epoch_late_changes_no_result(model, mnist):
    """On CUDA the loop reads whether every seed has stopped one epoch late (``lag`` 1): a
    stopped seed is frozen, so the extra epoch changes no record. Graphs need CUDA."""
    x, y, x_test, y_test = mnist
    xs = [classify.to_float(x[120 * k : 120 * (k + 1)]) for k in range(2)]
    ys = [torch.from_numpy(y[120 * k : 120 * (k + 1)]) for k in range(2)]
    xt, yt = classify.to_float(x_test[:100]), torch.from_numpy(y_test[:100])
    args = (model, xs, ys, xt, yt, 10, [3, 4], 12, 2, 32)
    records = [classifiers.train_batched(*args, lag=lag) for lag in (0, 1)]
    for lag, run in enumerate(records):
        for r in run:
            assert r.pop("training_loop") == {"cuda_graphs": False, "stop_read_lag_epochs": lag}
    assert records[0] == records[1]
    assert any(r["epochs"] < 12 for r in records[0])  # early stopping was exercised
    with pytest.raises(ValueError, match="CUDA"):
        classifiers.train_batched(*args, cuda_graphs=True)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_cpu_test_accuracy_seed_by_seed_equals_the_vmapped_one(model, mnist):
    """On the CPU a shared test set is scored seed by seed in channels-last layout: the
    same accuracies as the vmapped path (the logits differ by rounding only), and no
    random number is drawn for it."""
    import torch

    x, y, x_test, y_test = mnist
    x, x_test, y, y_test = (
        classify.to_float(x),
        classify.to_float(x_test),
        *map(torch.from_numpy, (y, y_test)),
    )
    xs = [x[200 * k : 200 * (k + 1)] for k in range(3)]
    ys = [y[200 * k : 200 * (k + 1)] for k in range(3)]
    run = classifiers.BatchedRun(model, xs, ys, 10, [4, 0, 9], 64)
    optimizer = torch.optim.Adam(list(run.params.values()))
    for idx in run.epoch_batches():
        run.step(optimizer, idx)
    xt, yt = x_test, y_test
    state = torch.random.get_rng_state()
    seed_by_seed = run.accuracy(xt, yt, shared=True)
    assert torch.equal(state, torch.random.get_rng_state())
    vmapped = run.accuracy(xt.expand(3, *xt.shape), yt.expand(3, *yt.shape), shared=False)
    assert seed_by_seed.dtype == torch.float64 and len(set(seed_by_seed.tolist())) == 3
    assert torch.equal(seed_by_seed, vmapped), (seed_by_seed, vmapped)
