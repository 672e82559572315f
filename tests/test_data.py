"""dpsinkhorn.data.datasets on the real MNIST / Fashion-MNIST archives (no mocks of data)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsinkhorn.data import datasets as data
from dpsinkhorn.data.catalog import dataset_info
from dpsinkhorn.fileio import md5_of

ARCHIVES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]


@pytest.fixture
def mnist_mirror_copy(tmp_path: Path, data_mirror: Path) -> Path:
    """A writable copy of the mirror holding only MNIST/raw/*.gz."""
    mirror = tmp_path / "mirror"
    shutil.copytree(data_mirror / "MNIST" / "raw", mirror / "MNIST" / "raw")
    for path in (mirror / "MNIST" / "raw").iterdir():
        path.chmod(0o644)  # the shared copy is read-only
    return mirror


def assert_no_outputs(root: Path, dataset: str = "mnist") -> None:
    """Neither split (nor a temporary file) was written under ``root/dataset``."""
    folder = root / dataset
    assert not (folder / "train.npz").exists() and not (folder / "test.npz").exists()
    assert not folder.exists() or not list(folder.glob(".*"))


# ----------------------------------------------------------------------------- info


def test_dataset_info() -> None:
    mnist, fmnist = dataset_info("mnist"), dataset_info("fmnist")
    assert (mnist.folder, fmnist.folder) == ("MNIST", "FashionMNIST")
    assert mnist.class_names == tuple("0123456789")
    assert fmnist.class_names[0] == "T-shirt/top" and fmnist.class_names[-1] == "Ankle boot"
    for info in (mnist, fmnist):
        assert info.num_classes == len(info.class_names) == 10
        assert info.image_shape == (1, 28, 28)
        assert [name for name, _ in info.archives()] == ARCHIVES


def test_unknown_dataset_names_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'cifar'.*fmnist, mnist"):
        dataset_info("cifar")
    with pytest.raises(ValueError, match="cifar"):
        data.prepare("cifar", tmp_path)
    with pytest.raises(ValueError, match="cifar"):
        data.load_split(tmp_path, "cifar", "train")


# -------------------------------------------------------------------------- prepare


@pytest.mark.parametrize("dataset", ["mnist", "fmnist"])
def test_prepared_splits(prepared_data: Path, dataset: str) -> None:
    for split, n in (("train", 60000), ("test", 10000)):
        images, labels = data.load_split(prepared_data, dataset, split)
        assert images.shape == (n, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (n,) and labels.dtype == np.int64
        assert labels.min() == 0 and labels.max() == 9
        counts = np.bincount(labels, minlength=10)
        assert counts.min() > 0.08 * n and counts.max() < 0.12 * n  # balanced-ish
        assert images.max() == 255 and images.min() == 0
    # MNIST digits: black background, white strokes; mean pixel is about 33
    if dataset == "mnist":
        assert 30 < images.mean() < 36


def test_rerun_is_safe_and_identical(prepared_data: Path, data_mirror: Path) -> None:
    raw = prepared_data / "torchvision" / "MNIST" / "raw"
    archive_mtimes = {p.name: p.stat().st_mtime_ns for p in raw.glob("*.gz")}
    before = data.load_split(prepared_data, "mnist", "test")
    paths = data.prepare("mnist", prepared_data, mirror=data_mirror)
    assert paths == {
        "train": prepared_data / "mnist" / "train.npz",
        "test": prepared_data / "mnist" / "test.npz",
    }
    after = data.load_split(prepared_data, "mnist", "test")
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    # verified archives are not copied again; no temporary files are left behind
    assert {p.name: p.stat().st_mtime_ns for p in raw.glob("*.gz")} == archive_mtimes
    assert not list((prepared_data / "mnist").glob(".*"))


def test_an_extracted_file_is_never_trusted(tmp_path: Path, prepared_data: Path) -> None:
    """A truncated extracted file (torchvision's, or an interrupted extraction) beside the
    archives is not read: the splits come from the MD5-checked archives."""
    root = tmp_path / "root"
    shutil.copytree(prepared_data / "torchvision" / "MNIST", root / "torchvision" / "MNIST")
    extracted = root / "torchvision" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    extracted.write_bytes(b"\0\0\x08\x01" + bytes(5000))
    data.prepare("mnist", root)  # no mirror needed: the verified archives are already there
    images, labels = data.load_split(root, "mnist", "test")
    expected = data.load_split(prepared_data, "mnist", "test")
    np.testing.assert_array_equal(labels, expected[1])
    np.testing.assert_array_equal(images, expected[0])


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_archive_is_named(tmp_path: Path, mnist_mirror_copy: Path, damage: str) -> None:
    bad = mnist_mirror_copy / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz"
    content = bytearray(bad.read_bytes())
    if damage == "truncate":
        content = content[: len(content) // 2]
    else:
        content[1000:1010] = bytes(b ^ 0xFF for b in content[1000:1010])
    bad.write_bytes(bytes(content))
    root = tmp_path / "root"
    with pytest.raises(ValueError, match="corrupt archive") as excinfo:
        data.prepare("mnist", root, mirror=mnist_mirror_copy)
    assert str(bad) in str(excinfo.value)
    assert "data_mirror" in str(excinfo.value)
    assert_no_outputs(root)
    # the bad copy never lands in torchvision's folder
    assert not (root / "torchvision" / "MNIST" / "raw" / bad.name).exists()


def test_missing_archive_is_named(tmp_path: Path, mnist_mirror_copy: Path) -> None:
    missing = mnist_mirror_copy / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    missing.unlink()
    root = tmp_path / "root"
    with pytest.raises(FileNotFoundError) as excinfo:
        data.prepare("mnist", root, mirror=mnist_mirror_copy)
    assert str(missing) in str(excinfo.value)
    assert "place the official file" in str(excinfo.value)
    assert_no_outputs(root)


def test_gzip_that_fails_to_extract(
    tmp_path: Path, mnist_mirror_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive whose MD5 matches the expected list but does not decompress.

    Real archives cannot be like that, so the expected MD5 of one file is patched to
    the damaged file's MD5: this reaches torchvision's extraction step.
    """
    import torchvision.datasets

    bad = mnist_mirror_copy / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:2000])
    resources = [
        (src, md5_of(bad) if Path(src).name == bad.name else md5)
        for src, md5 in torchvision.datasets.MNIST.resources
    ]
    monkeypatch.setattr(torchvision.datasets.MNIST, "resources", resources)
    root = tmp_path / "root"
    with pytest.raises(ValueError, match="cannot be extracted") as excinfo:
        data.prepare("mnist", root, mirror=mnist_mirror_copy)
    raw = root / "torchvision" / "MNIST" / "raw"
    assert str(raw / bad.name) in str(excinfo.value)
    assert_no_outputs(root)
    assert not (raw / "t10k-labels-idx1-ubyte").exists()  # no partial extraction left


def test_offline_download_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mirror, a failed download says the machine is offline and how to fix it."""
    import torchvision.datasets

    # an address that refuses connections: behaves like an offline machine, deterministically
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(FileNotFoundError, match="offline.*data_mirror.*DATA="):
        data.prepare("mnist", tmp_path)
    assert_no_outputs(tmp_path)


def test_load_split_missing_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dpsinkhorn data --dataset fmnist"):
        data.load_split(tmp_path, "fmnist", "test")
    with pytest.raises(ValueError, match="split"):
        data.load_split(tmp_path, "fmnist", "validation")


# ---------------------------------------------------------------------- conversions


def test_unit_range_round_trip_all_values() -> None:
    values = np.arange(256, dtype=np.uint8)
    images = np.broadcast_to(values[:, None, None], (256, 2, 3)).copy()
    x = data.to_unit_range(images)
    assert x.dtype == torch.float32 and x.shape == (256, 1, 2, 3)
    assert x.min().item() == -1.0 and x.max().item() == 1.0
    assert torch.all(x[1:, 0, 0, 0] > x[:-1, 0, 0, 0])  # strictly increasing
    back = data.from_unit_range(x)
    assert back.dtype == np.uint8 and back.shape == (256, 2, 3)
    np.testing.assert_array_equal(back, images)


def test_unit_range_channels_last_and_clamping() -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(4, 5, 6, 3), dtype=np.uint8)
    x = data.to_unit_range(rgb)
    assert x.shape == (4, 3, 5, 6)
    assert torch.equal(x[:, 2], data.to_unit_range(rgb[..., 2])[:, 0])
    np.testing.assert_array_equal(data.from_unit_range(x), rgb)
    # also accepts a uint8 tensor
    assert torch.equal(data.to_unit_range(torch.from_numpy(rgb)), x)
    out = data.from_unit_range(torch.tensor([-3.0, -1.0, 0.0, 1.0, 7.0]).view(1, 1, 1, 5))
    np.testing.assert_array_equal(out, [[[0, 0, 128, 255, 255]]])


def test_unit_range_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        data.to_unit_range(np.zeros((2, 28, 28), dtype=np.float32))
    with pytest.raises(ValueError, match="C in"):
        data.from_unit_range(torch.zeros(2, 2, 28, 28))
    with pytest.raises(ValueError, match="NaN"):
        data.from_unit_range(torch.full((1, 1, 2, 2), float("nan")))


def test_prepared_images_survive_conversion(prepared_data: Path) -> None:
    images, _ = data.load_split(prepared_data, "fmnist", "test")
    x = data.to_unit_range(images[:500])
    assert x.shape == (500, 1, 28, 28)
    np.testing.assert_array_equal(data.from_unit_range(x), images[:500])


# ------------------------------------------------------------------------------ CLI


def test_cli_writes_files(tmp_path: Path, data_mirror: Path, run_cli, capsys) -> None:
    root = tmp_path / "root"
    argv = ["data", "--dataset", "mnist", "fmnist", "--root", str(root)]
    argv += ["--mirror", str(data_mirror), "--dataset", "mnist"]  # repeated: done once
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    for dataset in ("mnist", "fmnist"):
        for split in ("train", "test"):
            path = root / dataset / f"{split}.npz"
            assert path.is_file() and str(path) in out
    assert len(out.strip().splitlines()) == 4


def test_cli_bad_mirror_exit_code(tmp_path: Path, run_cli, capsys) -> None:
    argv = ["data", "--dataset", "mnist", "--root", str(tmp_path), "--mirror", str(tmp_path / "x")]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and str(tmp_path / "x" / "MNIST" / "raw") in err
    assert len(err.strip().splitlines()) == 1
    assert_no_outputs(tmp_path)


def test_cli_rejects_unknown_dataset(run_cli, capsys) -> None:
    assert run_cli(["data", "--dataset", "cifar"]) == 2
    assert "--dataset cifar: unknown dataset" in capsys.readouterr().err
