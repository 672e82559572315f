"""FID on real MNIST with pytorch-fid's real Inception weights.

On CPU the network runs at ~5-8 images/s and each FID value costs a 2048x2048
matrix square root (~10-20 s), so the module uses ~310 images and 3 FID values.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from dpsinkhorn import cli, fid, io

DEVICE = "cpu"


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    """``dpsinkhorn ARGV`` in-process through ``cli.main``; returns the exit code.

    Command modules that other contributors have not written yet are left out of
    the parser (once they all exist this is exactly the real CLI).
    """
    present = [m for m in cli.COMMAND_MODULES if importlib.util.find_spec(f"dpsinkhorn.{m}")]
    monkeypatch.setattr(cli, "COMMAND_MODULES", present)
    return cli.main


@pytest.fixture(scope="module")
def mnist_test(data_mirror: Path) -> tuple[np.ndarray, np.ndarray]:
    """Real MNIST test set: images uint8 [10000,28,28], labels int64 [10000]."""
    raw = data_mirror / "MNIST" / "raw"
    with gzip.open(raw / "t10k-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    return images, labels


@pytest.fixture(scope="module")
def features(mnist_test, fid_weights: Path) -> dict[str, np.ndarray]:
    """Pool3 features [80,2048] of two disjoint real subsets and of pixel-shuffled real images."""
    images = mnist_test[0]
    rng = np.random.default_rng(0)
    sets = {
        "real_a": images[:80],
        "real_b": images[80:160],
        "shuffled": rng.permuted(images[80:160].reshape(80, -1), axis=1).reshape(80, 28, 28),
    }
    return {k: fid.activations(v, fid_weights, DEVICE, batch_size=50) for k, v in sets.items()}


def _fid(features: dict[str, np.ndarray], a: str, b: str) -> float:
    stats_a = fid.statistics_of_activations(features[a])
    stats_b = fid.statistics_of_activations(features[b])
    return fid.fid_from_stats(*stats_a, *stats_b)


def test_activations_shape_and_dtype(features):
    acts = features["real_a"]
    assert acts.shape == (80, 2048) and acts.dtype == np.float64
    assert np.isfinite(acts).all() and acts.min() >= 0  # pool3 follows a ReLU


def test_real_vs_real_is_much_smaller_than_real_vs_shuffled_pixels(features):
    real = _fid(features, "real_a", "real_b")
    shuffled = _fid(features, "real_a", "shuffled")
    print(f"FID real/real {real:.2f}, real/shuffled pixels {shuffled:.2f}")
    assert real > 1.0  # two different finite samples
    assert real < 0.3 * shuffled


def test_grayscale_and_rgb_inputs_agree(mnist_test, fid_weights):
    gray = mnist_test[0][:2]
    acts = [
        fid.activations(x, fid_weights, DEVICE)
        for x in (gray, gray[..., None], np.repeat(gray[..., None], 3, axis=-1))
    ]
    np.testing.assert_allclose(acts[1], acts[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(acts[2], acts[0], rtol=0, atol=1e-6)


def test_same_network_as_pytorch_fid_download_path(mnist_test, fid_weights, tmp_path, monkeypatch):
    """weights=None uses pytorch-fid's own InceptionV3 from the torch hub cache."""
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    (cache / fid.WEIGHTS_FILE_NAME).symlink_to(fid_weights.resolve())
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(fid, "_MODELS", {})
    images = mnist_test[0][:2]
    ours = fid.activations(images, fid_weights, DEVICE)
    theirs = fid.activations(images, None, DEVICE)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_no_weights_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    for var in ("https_proxy", "HTTPS_PROXY"):  # any download fails at once, online or not
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(fid, "_MODELS", {})
    with pytest.raises(FileNotFoundError, match="not in the torch hub cache") as err:
        fid.load_inception(None, DEVICE)
    assert "fid_weights" in str(err.value) and "FID_WEIGHTS=" in str(err.value)


def test_missing_weights_path_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "inception.pth"
    with pytest.raises(FileNotFoundError, match="fid_weights") as err:
        fid.load_inception(missing, DEVICE)
    assert str(missing) in str(err.value)
    assert fid.WEIGHTS_FILE_NAME in str(err.value)


def test_statistics_file_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    mu, sigma = rng.normal(size=4), np.eye(4)
    fid.save_statistics(tmp_path / "s.npz", mu, sigma, 7)
    mu2, sigma2, num = fid.load_statistics(tmp_path / "s.npz")
    np.testing.assert_array_equal(mu2, mu)
    np.testing.assert_array_equal(sigma2, sigma)
    assert num == 7 and list(tmp_path.iterdir()) == [tmp_path / "s.npz"]


def test_subsample_is_seeded_and_checked():
    images = np.arange(10 * 2 * 2, dtype=np.uint8).reshape(10, 2, 2)
    a, b = fid.subsample(images, 4, seed=3), fid.subsample(images, 4, seed=3)
    np.testing.assert_array_equal(a, b)
    assert len({x.tobytes() for x in a}) == 4  # without replacement
    with pytest.raises(ValueError, match="cannot take 11 images out of 10"):
        fid.subsample(images, 11, seed=0)


def test_cli_self_fid_is_zero_and_stats_file_matches_samples(
    mnist_test, fid_weights, tmp_path, run_cli
):
    """fid-stats on a seeded subset, then FID of that statistics file against the same subset."""
    images, labels = mnist_test
    samples = tmp_path / "s.npz"
    io.save_samples(samples, images[300:330], labels[300:330])
    common = ["--weights", str(fid_weights), "--device", DEVICE, "--seed", "3"]
    ref, out = tmp_path / "ref.npz", tmp_path / "fid.json"
    stats_cmd = ["fid-stats", "--samples", str(samples), "--num", "20", "--out", str(ref)]
    assert run_cli([*stats_cmd, *common]) == 0
    argv = ["fid", "--a", str(ref), "--b", str(samples), "--num-b", "20", "--out", str(out)]
    assert run_cli([*argv, *common]) == 0

    result = json.loads(out.read_text())
    assert set(result) >= {"fid", "num_images_a", "num_images_b", "weights"}
    assert result["num_images_a"] == result["num_images_b"] == 20
    assert result["weights"] == str(fid_weights)
    assert isinstance(result["fid"], float) and abs(result["fid"]) < 1e-3

    mu, sigma, num = fid.load_statistics(ref)
    mu_direct, sigma_direct, num_direct = fid.input_statistics(
        samples, num=20, seed=3, weights=fid_weights, device=DEVICE
    )
    assert num == num_direct == 20
    np.testing.assert_allclose(mu, mu_direct, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sigma, sigma_direct, rtol=1e-10, atol=1e-12)


def _write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


BAD_CASES = ["float_images", "label_mismatch", "missing_file", "too_many", "subsample_stats"]


@pytest.mark.parametrize("case", [*BAD_CASES, "missing_weights"])
def test_cli_bad_input_exits_2_without_output(
    case, mnist_test, fid_weights, tmp_path, run_cli, capsys
):
    images, labels = mnist_test
    good = tmp_path / "good.npz"
    io.save_samples(good, images[:5], labels[:5])
    a, extra, weights = good, [], fid_weights
    if case == "float_images":
        a = _write_npz(tmp_path / "f.npz", images=images[:5] / 255.0, labels=labels[:5])
    elif case == "label_mismatch":
        a = _write_npz(tmp_path / "l.npz", images=images[:5], labels=labels[:4])
    elif case == "missing_file":
        a = tmp_path / "missing.npz"
    elif case == "too_many":
        extra = ["--num-a", "6"]
    elif case == "subsample_stats":
        a, extra = tmp_path / "stats.npz", ["--num-a", "2"]
        fid.save_statistics(a, np.zeros(3), np.eye(3), 5)
    else:
        weights = tmp_path / "no_such_weights.pth"
    out = tmp_path / "out.json"
    argv = ["fid", "--a", str(a), "--b", str(good), "--out", str(out), "--weights", str(weights)]
    assert run_cli([*argv, *extra, "--device", DEVICE]) == 2
    assert not out.exists()
    named = weights if case == "missing_weights" else a
    assert str(named) in capsys.readouterr().err
