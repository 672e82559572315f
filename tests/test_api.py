"""The Python API (docs/OWN_DATA.md, "The Python API", run as written), 64x64 and
unconditional training, declared classes, and the PNG outputs of ``api.save_pngs`` and
``dpsinkhorn sample``."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from dpsinkhorn import api
from dpsinkhorn.config import make_experiment
from dpsinkhorn.config.targets import evaluation_files
from dpsinkhorn.fileio import torch_bytes, write_bytes
from dpsinkhorn.models import GeneratorConfig, build_generator
from dpsinkhorn.report.common import UNCONDITIONAL_CELL, Row, cell_text
from dpsinkhorn.train.trainer import Trainer

OWN_DATA = Path(__file__).resolve().parents[1] / "docs" / "OWN_DATA.md"
TINY = {"steps": 3, "sigma": 1.0, "batch_size": 16, "delta": 1e-5, "checkpoint_every": 100}


def readme_example() -> str:
    section = OWN_DATA.read_text().split("## The Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def digits(size: int, channels: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """sklearn's digits (8x8, 0..16) upscaled to size x size uint8, grayscale or RGB."""
    d = load_digits()
    images = (np.kron(d.images, np.ones((size // 8, size // 8))) * 255 / 16).astype(np.uint8)
    if size % 8:
        pad = (size - images.shape[1]) // 2
        images = np.pad(images, ((0, 0), (pad, pad), (pad, pad)))
    if channels == 3:
        images = np.repeat(images[..., None], 3, axis=-1)
    return images, d.target.astype(np.int64)


def test_readme_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example(), "docs/OWN_DATA.md", "exec"), {})
    run = tmp_path / "runs" / "digits"
    assert {p.name for p in run.iterdir()} >= {"generator.pt", "privacy.json", "train_log.csv"}
    state = torch.load(run / "generator.pt", weights_only=True)
    assert state["class_names"] == [str(d) for d in range(10)]
    assert state["model_config"]["num_classes"] == 10 and "conditional" not in state
    files = sorted((run / "pngs").rglob("*.png"))
    assert len(files) == 100
    assert sorted(p.name for p in (run / "pngs").iterdir()) == sorted(str(d) for d in range(10))
    with Image.open(files[0]) as im:
        assert im.size == (28, 28) and im.mode == "L"
    with Image.open(run / "grid.png") as im:  # 10 rows x 10 columns of 28 px, 2 px padding
        assert im.size == (10 * 30 + 2, 10 * 30 + 2)
    # api.release: exactly the files the ledger covers, with their manifest.
    published = sorted(p.name for p in (tmp_path / "publish" / "digits").iterdir())
    assert published == ["generator.pt", "privacy.json", "release_manifest.json", "train_log.csv"]
    assert (tmp_path / "publish/digits/generator.pt").read_bytes() == (
        run / "generator.pt"
    ).read_bytes()


def test_api_run_on_arrays_is_labelled_and_released_only_as_trained(tmp_path):
    """Arrays given to api.train are named as such (not "mnist"); the manifest holds
    relative paths; a train_log.csv edited after training is refused, nothing written."""
    import json

    images, labels = digits(28)
    classes = [str(d) for d in range(10)]
    run = tmp_path / "run"
    api.train(TINY, run, train_data=(images, labels), classes=classes, dataset="digits")
    assert torch.load(run / "generator.pt", weights_only=True)["dataset"] == "digits"
    ledger = json.loads((run / "privacy.json").read_text())
    assert ledger["data"]["dataset"] == "digits" and "api.train" in ledger["data"]["layout"]
    log = run / "train_log.csv"
    original = log.read_bytes()
    log.write_bytes(original.replace(b"step,", b"step ,"))
    with pytest.raises(ValueError, match=r"train_log.csv: not the file its training wrote"):
        api.release(run, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (run / "release_manifest.json").exists()
    log.write_bytes(original)
    api.release(run, tmp_path / "out")
    manifest = (tmp_path / "out" / "release_manifest.json").read_text()
    assert str(tmp_path) not in manifest
    with pytest.raises(ValueError, match=r"dataset: 'mnist' cannot name train_data"):
        api.train(
            TINY, tmp_path / "r2", train_data=(images, labels), classes=classes, dataset="mnist"
        )


def test_api_release_refuses_a_public_seed_and_a_workspace(tmp_path):
    images, labels = digits(28)
    api.train(
        {**TINY, "reproducible": True},
        tmp_path / "run",
        train_data=(images, labels),
        classes=[str(d) for d in range(10)],
    )
    with pytest.raises(ValueError, match=r"pass accept_no_guarantee=True to"):
        api.release(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    files = api.release(tmp_path / "run", tmp_path / "out", accept_no_guarantee=True)
    assert len(files) == 4
    (tmp_path / "run" / "private_workspace").mkdir()
    with pytest.raises(ValueError, match="private workspace"):
        api.release(tmp_path / "run", tmp_path / "out2")


def test_unconditional_28px_ignores_labels_and_samples_minus_one(tmp_path):
    images, labels = digits(28)
    labels = labels + 100  # outside any class: never read when unconditional
    record = api.train(
        {**TINY, "conditional": False}, tmp_path / "run", train_data=(images, labels)
    )
    assert record["steps"] == 3
    generator = tmp_path / "run" / "generator.pt"
    assert torch.load(generator, weights_only=True)["conditional"] is False
    samples, out_labels = api.sample(generator, num=12, seed=1, device="cpu")
    assert samples.shape == (12, 28, 28) and (out_labels == -1).all()
    assert api.class_names(generator) == ("unconditional",)
    files = api.save_pngs(
        samples,
        out_labels,
        api.class_names(generator),
        out_dir=tmp_path / "pngs",
        grid=tmp_path / "grid.png",
        per_class=5,
    )
    assert len(list((tmp_path / "pngs" / "unconditional").glob("*.png"))) == 12
    assert len(files) == 13
    with Image.open(tmp_path / "grid.png") as im:  # 12 samples in rows of 5: 3 rows
        assert im.size == (5 * 30 + 2, 3 * 30 + 2)


def test_64px_rgb_run(tmp_path):
    images, labels = digits(64, channels=3)
    keep = labels < 3
    api.train(
        {**TINY, "channels": [16, 8, 8, 4]},
        tmp_path / "run",
        train_data=(images[keep], labels[keep]),
        classes=["zero", "one", "two"],
    )
    samples, out_labels = api.sample(tmp_path / "run" / "generator.pt", 6, seed=0, device="cpu")
    assert samples.shape == (6, 64, 64, 3) and sorted(out_labels) == [0, 0, 1, 1, 2, 2]
    files = api.save_pngs(samples, out_labels, ["zero", "one", "two"], out_dir=tmp_path / "p")
    assert len(files) == 6
    with Image.open(tmp_path / "p" / "two" / "1.png") as im:
        assert im.size == (64, 64) and im.mode == "RGB"


def test_class_count_comes_from_the_declared_classes():
    images, labels = digits(28)
    keep = labels < 4
    spec = make_experiment("four", **TINY)
    trainer = Trainer(
        spec, images[keep], labels[keep], torch.device("cpu"), classes=["a", "b", "c", "d"]
    )
    assert trainer.num_classes == 4 and trainer.model.embedding.num_embeddings == 4
    assert trainer.real.shape[1] == 28 * 28 + 4
    with pytest.raises(ValueError, match="a training label is outside the 4 declared classes"):
        Trainer(spec, images, labels, torch.device("cpu"), classes=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="^classes: declare the class names"):
        api.train(TINY, "unused", train_data=(images, labels))
    with pytest.raises(ValueError, match="class name 'a/b' is not usable"):
        Trainer(spec, images, labels, torch.device("cpu"), classes=["a/b"])


def test_non_square_arrays_are_refused_before_anything_is_recorded(tmp_path):
    """[N, 28, 27]: one line naming the shape; no training recorded, no workspace left."""
    images, labels = digits(28)
    classes = [str(d) for d in range(10)]
    with pytest.raises(ValueError, match=r"images must be square.*\(1797, 28, 27\)"):
        api.train(
            TINY, tmp_path / "run", train_data=(images[:, :, :27].copy(), labels), classes=classes
        )
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0"])
def test_a_bad_device_is_a_value_error_before_anything_is_recorded(tmp_path, device):
    """A device torch cannot name is the ValueError train's docstring promises (not torch's
    RuntimeError), naming it; nothing recorded. sample() refuses it too."""
    images, labels = digits(28)
    classes = [str(d) for d in range(10)]
    message = f"device {device!r}: must be auto, cpu, cuda or cuda:N"
    with pytest.raises(ValueError, match=re.escape(message)):
        api.train(
            TINY, tmp_path / "run", train_data=(images, labels), classes=classes, device=device
        )
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    with pytest.raises(ValueError, match=re.escape(message)):
        api.sample(tmp_path / "generator.pt", 1, 0, device=device)


@pytest.mark.parametrize("method", ["dp_sinkhorn", "dpmerf"])
def test_a_delta_not_below_one_over_n_is_refused_before_anything_is_recorded(tmp_path, method):
    """delta >= 1/N (here 1e-3 on 1,797 digits) lets an (epsilon, delta)-DP release carry
    each record in the clear with probability delta: refused in one line naming the
    experiment, before any noise is drawn or the training is recorded; just below 1/N trains."""
    images, labels = digits(28)
    classes = [str(d) for d in range(10)]
    settings = {**TINY, "method": method, "delta": 1e-3}
    with pytest.raises(ValueError, match=r"experiment custom: delta 0\.001 is not below 1/N"):
        api.train(settings, tmp_path / "run", train_data=(images, labels), classes=classes)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    record = api.train(
        {**settings, "delta": 0.99 / len(labels)},
        tmp_path / "run",
        train_data=(images, labels),
        classes=classes,
    )
    assert record["delta"] * len(labels) < 1


@pytest.mark.parametrize("conditional", [False, True])
def test_unconditional_step_does_not_read_the_labels(conditional):
    """Reproducible mode (public noise key): one step on the same images with other labels
    gives bit-identical weights when unconditional (and different ones when conditional)."""
    images, labels = digits(28)
    spec = make_experiment(
        "u", **{**TINY, "channels": [8, 8, 8]}, conditional=conditional, reproducible=True
    )
    states = []
    for labels_k in (labels, (labels + 3) % 10):
        torch.manual_seed(0)
        trainer = Trainer(spec, images, labels_k, torch.device("cpu"))
        trainer.step()
        states.append(trainer.model.state_dict())
    same = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert same is not conditional
    if not conditional:
        assert trainer.real.shape[1] == 28 * 28  # no label columns in the cost


def test_api_writes_png_grid_and_folders(tmp_path):
    torch.manual_seed(0)
    config = GeneratorConfig(num_classes=2, out_channels=3, image_size=32, latent_dim=8)
    model = build_generator(config)
    payload = {
        "state_dict": model.state_dict(),
        "model_config": config.to_dict(),
        "dataset": "celeba",
        "num_classes": 2,
        "image_shape": [3, 32, 32],
        "experiment": "x",
        "steps": 0,
    }
    write_bytes(tmp_path / "generator.pt", torch_bytes(payload))
    generator = tmp_path / "generator.pt"
    images, labels = api.sample(generator, 7, seed=0, device="cpu")
    names = api.class_names(generator)
    api.save_pngs(
        images, labels, names, out_dir=tmp_path / "d", grid=tmp_path / "g.png", per_class=3
    )
    assert len(list((tmp_path / "d" / "female").glob("*.png"))) == 4  # catalogue's names
    assert len(list((tmp_path / "d" / "male").glob("*.png"))) == 3
    with Image.open(tmp_path / "g.png") as im:
        assert im.size == (3 * 34 + 2, 2 * 34 + 2) and im.mode == "RGB"


class _RunsCode:
    def __reduce__(self):
        return (print, ("pickle ran code",))


def test_api_sample_loads_weights_only(tmp_path, capsys):
    (tmp_path / "generator.pt").write_bytes(pickle.dumps({"state_dict": _RunsCode()}))
    with pytest.raises(ValueError, match="not a generator.pt that can be loaded safely"):
        api.sample(tmp_path / "generator.pt", 1, seed=0, device="cpu")
    assert "pickle ran code" not in capsys.readouterr().out


def test_unconditional_experiment_has_no_classifier_outputs():
    from dpsinkhorn.config import validate

    config = validate(
        {
            "experiments": {
                "u": {"dataset": "mnist", "conditional": False},
                "c": {"dataset": "mnist"},
            }
        },
        "test",
    )
    assert [Path(f).name for f in evaluation_files(config, "r", ["u"])] == [
        f"fid_seed{s}.json" for s in config["seeds"]
    ]
    assert any("acc_cnn" in f for f in evaluation_files(config, "r", ["c"]))
    row = Row("x", "mnist", "this run", mean={"fid": 3.0}, unconditional=True)
    assert cell_text(row, "acc_mlp") == UNCONDITIONAL_CELL and cell_text(row, "fid") == "3.0"


def test_catalogue_class_names_with_a_slash_sample_and_write_pngs(tmp_path):
    """Fashion-MNIST's "T-shirt/top": sampling works and its PNG folder is T-shirt-top/."""
    from dpsinkhorn.evaluate.sample import generator_classes

    config = GeneratorConfig(num_classes=10, out_channels=1, image_size=28, latent_dim=8)
    state = {"model_config": config.to_dict(), "dataset": "fmnist"}
    conditional, names = generator_classes(state)
    assert conditional and names[0] == "T-shirt/top"
    with pytest.raises(ValueError, match="not usable as a folder name"):
        generator_classes({**state, "class_names": ["../x"] + [str(k) for k in range(9)]})
    images, labels = np.zeros((20, 28, 28), np.uint8), np.arange(20) % 10
    api.save_pngs(images, labels, names, out_dir=tmp_path / "p")
    assert (tmp_path / "p" / "T-shirt-top" / "0.png").is_file()
    assert len(list((tmp_path / "p").iterdir())) == 10
