"""Own datasets (config ``datasets:``): scikit-learn's digits as an image folder and as an
.npz, prepared into ``{train,test}.npz`` at 28, 32 and 64 px; every bad input is one line
naming the file, exit 2 through the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import REPO, digits_arrays, write_digits_imagefolder, write_digits_npz
from PIL import Image

from dpsinkhorn.config import experiment, load_config, prepared_folder_of, validate
from dpsinkhorn.data.catalog import dataset_info
from dpsinkhorn.data.datasets import load_split
from dpsinkhorn.data.owndata import DatasetError, prepare_own

N_DIGITS = 1797


def widths(settings: dict) -> dict:
    """The generator widths a 64 px dataset needs (the 5-layer DCGAN: four); none otherwise."""
    return {"channels": [512, 256, 128, 64]} if settings.get("image_size") == 64 else {}


def entry(path: Path, **settings) -> dict:
    """A validated ``datasets.digits`` entry (schema defaults filled)."""
    cfg = validate(
        {
            "datasets": {"digits": {"path": str(path), **settings}},
            "experiments": {"e": {"dataset": "digits", **widths(settings)}},
        },
        "test",
    )
    return cfg["datasets"]["digits"]


def write_config(tmp_path: Path, source: Path, batch_size: int = 50, **settings) -> Path:
    cfg = {
        "data_dir": str(tmp_path / "data"),
        "datasets": {"digits": {"path": str(source), "resize": True, **settings}},
        "experiments": {"e": {"dataset": "digits", "batch_size": batch_size, **widths(settings)}},
    }
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory) -> Path:
    return write_digits_imagefolder(tmp_path_factory.mktemp("digits") / "folder")


@pytest.fixture(scope="module")
def digits_split_folder(tmp_path_factory) -> Path:
    return write_digits_imagefolder(tmp_path_factory.mktemp("digits") / "split", split=True)


# ------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("size", [28, 32, 64])
def test_image_folder_sizes_labels_and_held_out_split(digits_folder, tmp_path, size) -> None:
    definition = entry(digits_folder, image_size=size, resize=True)
    paths = prepare_own("digits", definition, tmp_path)
    (x, y), (xt, yt) = (
        load_split(tmp_path, "digits", "train"),
        load_split(tmp_path, "digits", "test"),
    )
    n_test = round(N_DIGITS * 0.1)
    assert x.shape == (N_DIGITS - n_test, size, size) and xt.shape == (n_test, size, size)
    assert x.dtype == np.uint8 and y.dtype == np.int64
    # Every record lands in one split with its own label: per-class totals are the digits'.
    _, labels = digits_arrays()
    assert np.array_equal(np.bincount(np.concatenate([y, yt])), np.bincount(labels))
    record = json.loads((paths["train"].parent / "dataset.json").read_text())
    assert record["classes"] == [str(d) for d in range(10)]
    assert record["classes_from"] == "folder names"
    assert record["split"]["test"] == "held out" and record["split"]["split_seed"] == 0
    assert (record["num_train"], record["num_test"]) == (len(y), len(yt))
    assert "bilinear" in record["resize"] and f"{size}x{size}" in record["resize"]


def test_resized_pixels_follow_the_source(digits_folder, tmp_path) -> None:
    """Each prepared record is the PIL bilinear resize of its PNG, in the documented order:
    class folders sorted, files sorted, test = the first round(N * 0.1) of the seeded
    permutation, both splits in source order."""
    prepare_own("digits", entry(digits_folder, image_size=28, resize=True), tmp_path)
    x, y = load_split(tmp_path, "digits", "train")
    images, labels = digits_arrays()
    order = np.concatenate([np.flatnonzero(labels == d) for d in range(10)])  # files 0000.png...
    train = order[np.sort(np.random.default_rng(0).permutation(N_DIGITS)[180:])]
    expected = np.stack(
        [
            np.asarray(Image.fromarray(images[i]).resize((28, 28), Image.Resampling.BILINEAR))
            for i in train
        ]
    )
    assert np.array_equal(y, labels[train])
    assert np.array_equal(x, expected)


def test_split_seed_gives_the_same_split(digits_folder, tmp_path) -> None:
    splits = []
    for run, seed in enumerate([3, 3, 4]):
        prepare_own(
            "digits",
            entry(digits_folder, image_size=28, resize=True, split_seed=seed),
            tmp_path / str(run),
        )
        splits.append(load_split(tmp_path / str(run), "digits", "test"))
    assert np.array_equal(splits[0][0], splits[1][0]) and np.array_equal(splits[0][1], splits[1][1])
    assert not np.array_equal(splits[0][0], splits[2][0])


def test_given_test_folder_and_declared_classes(digits_split_folder, tmp_path) -> None:
    classes = [f"digit {d}" for d in range(10)]
    definition = entry(digits_split_folder, image_size=32, resize=True)
    prepare_own("digits", definition, tmp_path)
    (x, y), (xt, yt) = (
        load_split(tmp_path, "digits", "train"),
        load_split(tmp_path, "digits", "test"),
    )
    assert len(xt) == len(range(0, N_DIGITS, 5)) and len(x) + len(xt) == N_DIGITS
    _, labels = digits_arrays()
    assert np.array_equal(np.bincount(yt, minlength=10), np.bincount(labels[::5], minlength=10))
    assert np.array_equal(
        np.bincount(y, minlength=10),
        np.bincount(labels, minlength=10) - np.bincount(labels[::5], minlength=10),
    )
    (folder,) = tmp_path.glob("digits-*")  # <name>-<entry hash> (config.prepared_folder)
    record = json.loads((folder / "dataset.json").read_text())
    assert record["split"] == {"test": "given"}
    # Declared names that are not the folder names: the folders are refused, by name.
    with pytest.raises(DatasetError, match=r"train/0: class folder '0' is not among"):
        prepare_own("digits", entry(digits_split_folder, classes=classes, resize=True), tmp_path)


def test_npz_one_to_three_channels(tmp_path) -> None:
    npz = write_digits_npz(tmp_path / "digits.npz")
    classes = [str(d) for d in range(10)]
    definition = entry(npz, classes=classes, image_size=64, channels=3, resize=True)
    prepare_own("digits", definition, tmp_path / "data")
    x, y = load_split(tmp_path / "data", "digits", "train")
    assert x.shape == (N_DIGITS - 180, 64, 64, 3)
    assert np.array_equal(x[..., 0], x[..., 1]) and np.array_equal(x[..., 0], x[..., 2])
    info = dataset_info("digits", definition)
    assert (info.num_classes, info.image_shape, info.source) == (10, (3, 64, 64), f"npz {npz}")


def test_experiment_carries_its_dataset_definition(digits_folder) -> None:
    cfg = validate(
        {
            "datasets": {"digits": {"path": str(digits_folder), "title": "Digits"}},
            "experiments": {"e": {"dataset": "digits"}, "m": {"dataset": "mnist"}},
        },
        "test",
    )
    exp = experiment(cfg, "e")
    info = dataset_info(exp["dataset"], exp["dataset_definition"])
    assert (info.title, info.num_classes, info.image_shape) == ("Digits", 10, (1, 32, 32))
    assert "dataset_definition" not in experiment(cfg, "m")


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("datasets", "dataset", "message"),
    [
        ({}, "digits", "experiments.e.dataset: bad value 'digits': must be one of mnist, fmnist"),
        ({"d": {"path": "x.npz"}}, "d", "datasets.d.classes: an .npz dataset needs its class list"),
        ({"mnist": {"path": "x"}}, "mnist", "datasets.mnist: bad name 'mnist'"),
        ({"d": {"path": "x", "image_size": 48}}, "d", "datasets.d.image_size: bad value 48"),
        # a class name is a folder name (sample files, PNG folders): refused before training
        (
            {"d": {"path": "x", "classes": ["a/b", "c"]}},
            "d",
            "datasets.d.classes: bad value: class name 'a/b' is not usable as a folder name",
        ),
        (
            {"d": {"path": "x.npz", "classes": ["a", ".."]}},
            "d",
            "datasets.d.classes: bad value: class name '..'",
        ),
    ],
)
def test_config_errors_name_the_key(datasets, dataset, message) -> None:
    with pytest.raises(ValueError) as excinfo:
        validate({"datasets": datasets, "experiments": {"e": {"dataset": dataset}}}, "c.yaml")
    assert f"c.yaml: {message}" in str(excinfo.value)


# ------------------------------------------------------------------------------ bad input


def _png(path: Path, size: int = 28, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size)).save(path)


def _bad_folder(tmp_path: Path, case: str) -> tuple[Path, Path, dict]:
    """(source, the file the error must name, entry settings) of one bad input."""
    root = tmp_path / "src"
    for i in range(3):
        _png(root / "a" / f"{i}.png")
    settings: dict = {"image_size": 28, "resize": False}
    if case == "no images":
        root = tmp_path / "empty"
        root.mkdir()
        return root, root, settings
    if case == "empty class":
        (root / "b").mkdir()
        return root, root / "b", settings
    if case == "mixed sizes":
        _png(root / "a" / "9.png", size=30)
        return root, root / "a" / "9.png", settings
    if case == "mixed modes":
        _png(root / "a" / "9.png", mode="RGB")
        return root, root / "a" / "9.png", settings
    if case == "undeclared class":
        _png(root / "z" / "0.png")
        return root, root / "z", {**settings, "classes": ["a"]}
    if case == "16-bit resized":  # PIL would clip its pixels to 0..255, not scale them
        _png(root / "a" / "9.png", mode="I;16")
        return root, root / "a" / "9.png", {**settings, "resize": True}
    if case == "corrupt":
        (root / "a" / "5.png").write_bytes(b"\x89PNG not really")
        return root, root / "a" / "5.png", settings
    if case == "a val folder beside train":  # the split layout reads train/ and test/ only
        split = tmp_path / "split"
        split.mkdir()
        root.rename(split / "train")
        _png(split / "val" / "a" / "0.png")
        return split, split / "val", settings
    if case == "corrupt, its name with a line break":
        (root / "a" / "bad\nname.png").write_bytes(b"\x89PNG not really")
        return root, root / "a" / "bad\nname.png", settings
    if case == "a broken link":  # left out without a word before
        (root / "a" / "3.png").symlink_to(tmp_path / "moved.png")
        return root, root / "a" / "3.png", settings
    if case == "a file that is no .npz":  # said 'image folder not found' of a file
        path = tmp_path / "digits.npy"
        np.save(path, np.zeros((3, 28, 28), np.uint8))
        return path, path, settings
    if case == "a class folder no folder of samples can take":  # refused only by training
        _png(root / "b\\c" / "0.png")
        return root, root, settings
    if case == "an image beside the class folders":  # left out without a word before
        _png(root / "loose.png")
        return root, root / "loose.png", settings
    if case == "a linked folder inside a class folder":  # rglob does not read it
        _png(tmp_path / "more" / "0.png")
        (root / "a" / "more").symlink_to(tmp_path / "more", target_is_directory=True)
        return root, root / "a" / "more", settings
    if case == "truncated":
        data = (root / "a" / "0.png").read_bytes()
        (root / "a" / "0.png").write_bytes(data[: len(data) // 2])
        return root, root / "a" / "0.png", settings
    raise AssertionError(case)


def _bad_npz(tmp_path: Path, case: str) -> tuple[Path, Path, dict]:
    path = tmp_path / "bad.npz"
    images, labels = np.zeros((4, 28, 28), np.uint8), np.arange(4)
    arrays = {
        "no labels": {"images": images},
        "no images": {"labels": labels},
        "lengths": {"images": images, "labels": labels[:3]},
        "label out of classes": {"images": images, "labels": labels},  # 4 labels, 3 classes
        "float images": {"images": images.astype(np.float32), "labels": labels},
        "a side of 0 pixels": {"images": np.zeros((4, 0, 28), np.uint8), "labels": labels % 3},
    }
    if case == "not an npz":
        path.write_bytes(b"PK garbage")
    else:
        np.savez(path, **arrays[case])
    resize = case == "a side of 0 pixels"  # without resize: refused as another size
    return path, path, {"image_size": 28, "classes": ["a", "b", "c"], "resize": resize}


@pytest.mark.parametrize(
    "case",
    [
        "no images",
        "empty class",
        "mixed sizes",
        "mixed modes",
        "16-bit resized",
        "undeclared class",
        "corrupt",
        "truncated",
        "a broken link",
        "a file that is no .npz",
        "a class folder no folder of samples can take",
        "a val folder beside train",
        "an image beside the class folders",
        "a linked folder inside a class folder",
        "corrupt, its name with a line break",
        "npz:no labels",
        "npz:no images",
        "npz:lengths",
        "npz:label out of classes",
        "npz:float images",
        "npz:a side of 0 pixels",
        "npz:not an npz",
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, run_cli, capsys, case) -> None:
    if case.startswith("npz:"):
        source, named, settings = _bad_npz(tmp_path, case.removeprefix("npz:"))
    else:
        source, named, settings = _bad_folder(tmp_path, case)
    config = write_config(tmp_path, source, batch_size=2, **settings)
    root = tmp_path / "data"
    argv = ["data", "--dataset", "digits", "--root", str(root), "--config", str(config)]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(named).replace("\n", "\\n") in err, err  # a line break in it: escaped
    assert "allow_pickle" not in err, err  # no unsafe way out is offered
    if case == "a file that is no .npz":
        assert "a file, not an image folder (a dataset file must be an .npz)" in err, err
    assert not list(root.glob("digits*/train.npz"))


def test_dataset_smaller_than_the_batch(digits_folder, tmp_path, run_cli, capsys) -> None:
    config = write_config(tmp_path, digits_folder, batch_size=2000, image_size=28)
    root = tmp_path / "data"
    argv = ["data", "--dataset", "digits", "--root", str(root), "--config", str(config)]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{root}/digits-" in err and "batch_size 2000 of experiment e" in err
    assert not list(root.glob("digits*/train.npz"))
    # The same config with a batch that fits prepares it.
    config = write_config(tmp_path, digits_folder, batch_size=50, image_size=28)
    argv[-1] = str(config)
    assert run_cli(argv) == 0
    assert load_split(root, "digits", "train")[0].shape == (N_DIGITS - 180, 28, 28)


def test_unknown_own_dataset_without_config(run_cli, capsys) -> None:
    assert run_cli(["data", "--dataset", "digits"]) == 2
    assert "--dataset digits: unknown dataset" in capsys.readouterr().err


def test_changed_definition_is_refused(digits_folder, tmp_path, run_cli, capsys) -> None:
    config = write_config(tmp_path, digits_folder, image_size=28)
    argv = [
        "data",
        "--dataset",
        "digits",
        "--root",
        str(tmp_path / "d"),
        "--config",
        str(config),
        "--definition-sha256",
        "0" * 16,
    ]
    assert run_cli(argv) == 2
    assert "datasets.digits changed since the workflow read it" in capsys.readouterr().err


# ------------------------------------------------------------------------------ workflow

TRAIN = "train.npz"


def test_snakemake_dry_run_resolves_an_own_dataset(digits_folder, tmp_path) -> None:
    """The data rule of an own dataset reads its folder and passes --config with its hash."""
    config = write_config(tmp_path, digits_folder, image_size=28)
    snakemake = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{snakemake.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [
            str(snakemake),
            str(
                tmp_path
                / "data"
                / prepared_folder_of(load_config([config]), "digits")
                / "train.npz"
            ),
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "-n",
            "-p",
            "--configfile",
            str(config),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "dpsinkhorn data --dataset digits" in output and "--definition-sha256" in output
    assert str(digits_folder) in output  # the source folder is the rule's input


def test_plan_costs_an_own_dataset_once_prepared(digits_folder, tmp_path, run_cli, capsys):
    """`dpsinkhorn plan` on an own dataset: refused in one line until it is prepared (its
    training size fixes q = B / N and so the steps a target ε allows); then the steps solved
    from target ε and the training time at a given rate, as for a built-in dataset."""
    import json

    from dpsinkhorn.config import experiment, load_config
    from dpsinkhorn.plan import resolved_steps
    from dpsinkhorn.privacy.budget import budget_of

    config = write_config(tmp_path, digits_folder, image_size=28)
    cfg = yaml.safe_load(config.read_text())
    cfg["experiments"]["e"].update(target_epsilon=10, sigma=1.0, steps=None)
    config.write_text(yaml.safe_dump(cfg))
    plan = ["plan", "--config", str(config), "--steps-per-s", "5", "--json"]
    assert run_cli(plan) == 2
    err = capsys.readouterr().err
    assert "dataset 'digits': its training size is known once it is prepared" in err
    assert err.count("\n") == 1
    data = ["data", "--dataset", "digits", "--root", str(tmp_path / "data"), "--config"]
    assert run_cli([*data, str(config)]) == 0
    capsys.readouterr()
    assert run_cli(plan) == 0
    (row,) = json.loads(capsys.readouterr().out)["training"]
    spec = experiment(load_config([config]), "e")
    _, steps = budget_of(spec, N_DIGITS - 180)  # the held-out 10% left out
    assert row["steps"] == steps == resolved_steps(spec, {"num_train": N_DIGITS - 180})
    assert row["hours"] == pytest.approx(steps / 5 / 3600)
    # a damaged dataset.json: one line naming it
    (record,) = (tmp_path / "data").glob("digits-*/dataset.json")
    record.write_text("{")
    assert run_cli(plan) == 2
    err = capsys.readouterr().err
    assert f"{record}: not JSON" in err and err.count("\n") == 1


def test_data_prepares_into_the_configs_data_dir(digits_folder, tmp_path, run_cli, monkeypatch):
    """`dpsinkhorn data --dataset NAME --config my.yaml` (OWN_DATA.md, without --root)
    prepares into the config's data_dir, where `dpsinkhorn train` and `plan` read it; an
    own split not prepared yet names the command that prepares it, --config included."""
    monkeypatch.chdir(tmp_path)  # where a default ./data would go
    config = write_config(tmp_path, digits_folder, image_size=28)
    cfg = yaml.safe_load(config.read_text())
    cfg["data_dir"] = str(tmp_path / "prepared")
    config.write_text(yaml.safe_dump(cfg))
    cfg = load_config([config])
    root, folder = Path(cfg["data_dir"]), prepared_folder_of(cfg, "digits")
    with pytest.raises(FileNotFoundError) as excinfo:
        load_split(root, "digits", "train", folder=folder)
    assert f"dpsinkhorn data --dataset digits --root {root} --config " in str(excinfo.value)
    assert run_cli(["data", "--dataset", "digits", "--config", str(config)]) == 0
    assert load_split(root, "digits", "train", folder=folder)[0].shape == (N_DIGITS - 180, 28, 28)
    assert not (tmp_path / "data").exists()
    # where OWN_DATA.md says the files go (its dataset is scans, this one digits)
    doc = " ".join((REPO / "docs" / "OWN_DATA.md").read_text().split())
    said = re.search(r"writes `data/scans([^`/]*)/\{train,test\}\.npz`", doc)
    assert said and "digits" + said.group(1).replace("<hash>", folder.split("-")[-1]) == folder


@pytest.mark.parametrize("layout", ["image folder", "npz"])
def test_the_same_image_twice_is_refused_naming_both(tmp_path, run_cli, capsys, layout) -> None:
    """A record is an image (docs/PRIVACY.md): a digit held twice (under another name and
    class, or twice in an .npz) is one record in two rows, which the ledger's guarantee of
    one row does not cover. Refused in one line naming both; without the copy it prepares."""
    images, labels = digits_arrays()
    images, labels = images[:40], labels[:40]
    if layout == "npz":
        source = tmp_path / "digits.npz"
        np.savez(source, images=np.concatenate([images, images[7:8]]), labels=[*labels, 3])
        named, copy = f"{source} (images[40])", f"{source} (images[7])"
    else:
        source = tmp_path / "digits"
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            (source / str(label)).mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(source / str(label) / f"{i:02d}.png")
        assert labels[7] == 7  # its copy in 9/ is read after it
        copy, named = source / "7" / "07.png", source / "9" / "scan é 7.png"
        named.write_bytes(copy.read_bytes())
    config = write_config(tmp_path, source, batch_size=2, classes=[str(d) for d in range(10)])
    argv = ["data", "--dataset", "digits", "--config", str(config)]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{named}: the same image as {copy}" in err, err
    assert not list((tmp_path / "data").glob("digits*/train.npz"))
    if layout == "npz":
        np.savez(source, images=images, labels=labels)
    else:
        named.unlink()
    assert run_cli(argv) == 0
