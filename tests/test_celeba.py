"""CelebA 32x32 (Tables 3 and 6): fixture, preprocessing, generators, training, reports."""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsinkhorn import fileio
from dpsinkhorn.config import experiment_dir, load_config, make_experiment
from dpsinkhorn.data import celeba
from dpsinkhorn.data import datasets as data
from dpsinkhorn.models import (
    ConditionalBigGAN,
    ConditionalDCGAN,
    GeneratorConfig,
    build_generator,
)
from dpsinkhorn.report.common import csv_columns
from dpsinkhorn.report.paper import CELEBA_METRICS
from dpsinkhorn.report.tables import main_table

NUM = 60  # fixture images: 48 train, 6 valid, 6 test
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory) -> Path:
    """A synthetic CelebA source folder (holds celeba/...)."""
    out = tmp_path_factory.mktemp("celeba_src")
    celeba.make_fixture(out, num=NUM, seed=0)
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, fixture_dir) -> Path:
    root = tmp_path_factory.mktemp("data")
    data.prepare("celeba", root, mirror=fixture_dir)
    return root


def copy_source(fixture_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "src"
    shutil.copytree(fixture_dir, dest)
    return dest


# --------------------------------------------------------------------------- fixture


def test_fixture_loads_through_torchvisions_celeba_class(fixture_dir):
    from torchvision.datasets import CelebA

    # torchvision checks the MD5s of the real annotation files, which a synthetic fixture
    # cannot have; everything else (parsing, splits, images) is torchvision's own code.
    class FixtureCelebA(CelebA):
        file_list = [(file_id, None, name) for file_id, _, name in CelebA.file_list]

    sizes = {}
    for split in ["train", "valid", "test", "all"]:
        ds = FixtureCelebA(
            str(fixture_dir), split=split, target_type=["attr", "identity", "bbox", "landmarks"]
        )
        sizes[split] = len(ds)
        assert ds.attr.shape == (len(ds), 40) and set(ds.attr.unique().tolist()) <= {0, 1}
    assert sizes == {"train": 48, "valid": 6, "test": 6, "all": NUM}
    assert ds.attr_names[20] == "Male"
    image, (attr, identity, bbox, landmarks) = ds[0]
    assert image.size == (178, 218) and image.mode == "RGB"
    assert bbox.shape == (4,) and landmarks.shape == (10,)
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CelebA(str(fixture_dir))  # the real MD5s: torchvision refuses a synthetic fixture


def test_fixture_text_formats(fixture_dir):
    folder = fixture_dir / "celeba"
    attr = (folder / "list_attr_celeba.txt").read_text().splitlines()
    assert attr[0] == str(NUM)
    assert attr[1].split() == list(celeba.ATTRIBUTES) and len(celeba.ATTRIBUTES) == 40
    name, *values = attr[2].split()
    assert name == "000001.jpg" and set(values) <= {"-1", "1"} and len(values) == 40
    assert attr[2][10:13] in (" -1", "  1")  # width-2 values, as in CelebA
    parts = (folder / "list_eval_partition.txt").read_text().split()
    assert parts[:2] == ["000001.jpg", "0"] and parts[-1] == "2"
    assert (folder / celeba.SOURCE_MARKER).is_file()


# --------------------------------------------------------------------- preprocessing


def test_preprocessing_shapes_labels_splits_marker(prepared, fixture_dir):
    train_x, train_y = data.load_split(prepared, "celeba", "train")
    test_x, test_y = data.load_split(prepared, "celeba", "test")
    assert train_x.shape == (48, 32, 32, 3) and test_x.shape == (6, 32, 32, 3)
    assert train_x.dtype == np.uint8 and train_y.dtype == np.int64
    files, male, partition = celeba.read_annotations(fixture_dir / "celeba")
    assert np.array_equal(train_y, male[partition == 0])
    assert np.array_equal(test_y, male[partition == 2])
    assert set(np.unique(train_y)) == {0, 1}
    assert celeba.is_fixture(celeba.prepared_dir(prepared, fixture_dir))
    # the resize: center crop 178x178, antialiased bilinear to 32x32
    from PIL import Image

    with Image.open(fixture_dir / "celeba" / "img_align_celeba" / files[0]) as img:
        ref = np.asarray(img.convert("RGB").crop((0, 20, 178, 198)).resize((32, 32), 2))
    assert np.array_equal(train_x[0], ref)


def test_fixture_images_carry_the_label(prepared):
    """A trivial classifier (mean colour) separates the fixture's classes."""
    x, y = data.load_split(prepared, "celeba", "train")
    feature = x[:, 4:12, 8:24].reshape(len(x), -1).mean(1)  # hair above the face
    assert feature[y == 1].mean() < feature[y == 0].mean()


def test_missing_attribute_file_is_named(fixture_dir, tmp_path):
    src = copy_source(fixture_dir, tmp_path)
    (src / "celeba" / "list_attr_celeba.txt").unlink()
    with pytest.raises(FileNotFoundError, match="list_attr_celeba.txt.*data_mirror"):
        data.prepare("celeba", tmp_path / "data", mirror=src)


def test_corrupt_jpeg_is_named(fixture_dir, tmp_path):
    src = copy_source(fixture_dir, tmp_path)
    (src / "celeba" / "img_align_celeba" / "000002.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(ValueError, match="corrupt CelebA image .*000002.jpg"):
        data.prepare("celeba", tmp_path / "data", mirror=src)
    assert not (celeba.prepared_dir(tmp_path / "data", src) / "train.npz").exists()


def test_real_annotations_are_md5_checked(fixture_dir, tmp_path):
    src = copy_source(fixture_dir, tmp_path)
    (src / "celeba" / celeba.SOURCE_MARKER).unlink()  # now it claims to be CelebA
    with pytest.raises(ValueError, match="corrupt CelebA file .*list_attr_celeba.txt.*MD5"):
        data.prepare("celeba", tmp_path / "data", mirror=src)


def test_google_drive_quota_error_becomes_clear(tmp_path, monkeypatch):
    import torchvision.datasets.celeba as tv_celeba

    class FileURLRetrievalError(Exception):  # what gdown raises (gdown is not installed)
        pass

    def refuse(file_id, root, filename=None, md5=None):
        raise FileURLRetrievalError(
            "Failed to retrieve file url:\n\n\tToo many users have viewed or downloaded this "
            "file recently. Please try accessing the file again later. If the file you are "
            "trying to access is particularly large or is shared with many people, it may take "
            "up to 24 hours to be able to view or download the file.\n\nYou may still be able "
            "to access the file from the browser:\n\n\thttps://drive.google.com/uc?id="
            f"{file_id}\n\nbut Gdown can't. Please check connections and permissions."
        )

    monkeypatch.setattr(tv_celeba, "download_file_from_google_drive", refuse)
    with pytest.raises(FileNotFoundError) as err:
        data.prepare("celeba", tmp_path / "data")
    message = str(err.value)
    assert "quota" in message and "Too many users" in message
    assert "img_align_celeba.zip" in message and "list_attr_celeba.txt" in message
    assert "list_eval_partition.txt" in message and "data_mirror" in message
    assert str(tmp_path / "data" / "torchvision" / "celeba") in message


# ------------------------------------------------------------------------ generators


def test_biggan_shapes_and_spectral_norm():
    config = GeneratorConfig(
        num_classes=2,
        latent_dim=32,
        embed_dim=4,
        channels=(256, 256, 256, 256),
        out_channels=3,
        architecture="biggan",
        image_size=32,
    )
    model = build_generator(config)
    assert isinstance(model, ConditionalBigGAN)
    z, labels = model.sample_inputs(5)
    out = model(z, labels)
    assert out.shape == (5, 3, 32, 32) and out.abs().max() <= 1
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len([c for c in convs if c.kernel_size == (3, 3)]) == 13  # 4 blocks x 3 + output
    parametrized = [m for m in model.modules() if hasattr(m, "parametrizations")]
    assert all(hasattr(c, "parametrizations") for c in convs) and model.linear in parametrized
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    with pytest.raises(ValueError, match="4 block widths"):
        build_generator(GeneratorConfig(channels=(8, 8, 8), architecture="biggan", image_size=32))


def test_dcgan32_shapes_and_model_config_round_trip():
    config = GeneratorConfig(num_classes=2, latent_dim=32, out_channels=3, image_size=32)
    model = build_generator(config)
    assert isinstance(model, ConditionalDCGAN)
    assert model(*model.sample_inputs(3)).shape == (3, 3, 32, 32)
    assert GeneratorConfig.from_dict(config.to_dict()) == config
    partial = {k: v for k, v in config.to_dict().items() if k != "architecture"}
    with pytest.raises(ValueError, match="lacks"):
        GeneratorConfig.from_dict(partial)


@pytest.mark.parametrize(
    "generator,channels", [("biggan", [8, 8, 8, 8]), ("dcgan", [16, 8, 8])], ids=["biggan", "dcgan"]
)
def test_training_and_rgb_sampling_on_the_fixture(prepared, tmp_path, generator, channels):
    from dpsinkhorn.evaluate.sample import load_generator, sample_generator
    from dpsinkhorn.train.run import train

    spec = make_experiment(
        "celeba_tiny",
        dataset="celeba",
        generator=generator,
        channels=channels,
        latent_dim=32,
        batch_size=8,
        sigma=1.9,
        delta=1e-6,
        m=0.0,
        entropy_reg=5.0,
        steps=3,
        checkpoint_every=2,
        log_every=1,
    )
    record = train(spec, tmp_path, prepared, device="cpu", progress=False)
    assert record["steps"] == 3 and 0 < record["epsilon"] < math.inf
    saved = torch.load(tmp_path / "generator.pt", weights_only=False)
    assert saved["model_config"]["architecture"] == generator
    assert saved["model_config"]["image_size"] == 32 and saved["image_shape"] == [3, 32, 32]
    model = load_generator(tmp_path / "generator.pt", torch.device("cpu"))
    images, labels = sample_generator(model, 10, seed=0)
    assert images.shape == (10, 32, 32, 3) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [5, 5]


def test_config_checks_generator_widths_and_rows():
    with pytest.raises(ValueError, match="channels: generator biggan needs 4 widths"):
        make_experiment(dataset="celeba", generator="biggan", channels=[8, 8, 8])
    with pytest.raises(ValueError, match="rows.table6: row 'biggan' needs generator: biggan"):
        make_experiment(dataset="celeba", rows={"table6": "biggan"}, channels=[8, 8, 8])
    with pytest.raises(ValueError, match="rows.table3: row 'real' needs method real_data"):
        make_experiment(dataset="celeba", rows={"table3": "real"})


# --------------------------------------------------------------------------- reports

CONFIG = """
run_name: fake
data_dir: {data_dir}
seeds: [0, 1]
evaluation:
  num_samples: 40
  classifiers: [logreg, mlp, cnn]
  classifiers_by_dataset: {{celeba: [mlp, cnn]}}
experiments:
  real_celeba: {{dataset: celeba, method: real_data, rows: {{table3: real, table6: real}}}}
  celeba_nonprivate:
    {{dataset: celeba, method: sinkhorn, steps: 10, rows: {{table3: nonprivate}},
     generator: biggan, channels: [8, 8, 8, 8]}}
  celeba_dpsinkhorn:
    {{dataset: celeba, rows: {{table3: dp, table6: biggan}}, generator: biggan,
     channels: [8, 8, 8, 8], delta: 1.0e-6}}
  celeba_dcgan: {{dataset: celeba, rows: {{table6: dcgan}}, delta: 1.0e-6}}
"""
# (fid, mlp, cnn) per seed, accuracies as fractions
RESULTS = {
    "real_celeba": [(1.0, 0.90, 0.95), (1.2, 0.92, 0.95)],
    "celeba_nonprivate": [(130.0, 0.80, 0.82), (128.0, 0.80, 0.82)],
    "celeba_dpsinkhorn": [(170.0, 0.76, 0.75), (172.0, 0.78, 0.77)],
    "celeba_dcgan": [(150.0, 0.74, 0.73), (160.0, 0.74, 0.73)],
}


# ---------------------------------------------------------------------- one folder per source

TWO_SOURCES = """\
run_name: {run}
data_dir: data
data_mirror: {mirror}
device: cpu
experiments:
  celeba_dp: {{dataset: celeba, steps: 2, batch_size: 8, channels: [8, 8, 8], delta: 1.0e-6}}
  mnist_dp: {{dataset: mnist, steps: 2, batch_size: 8, channels: [8, 8, 8]}}
"""


def test_two_celeba_sources_never_share_a_prepared_folder(fixture_dir, tmp_path, monkeypatch):
    """Two configs read CelebA from two mirrors (CelebA's formats, other images)
    into one data_dir: the workflow's data rule prepares each into a folder of its own, the
    second never rewrites the first's, and each experiment trains on its own source's
    arrays. MNIST (MD5-checked: every source is the same bytes) keeps one folder, as does
    CelebA from the download; a fixture's folder does not depend on where the working
    folder lies."""
    from dpsinkhorn.config import experiment, prepared_folder_of
    from dpsinkhorn.train.run import load_train_data

    other = tmp_path / "other_source"
    celeba.make_fixture(other, num=NUM, seed=1)  # same names and format, other images
    (tmp_path / "celeba_source").symlink_to(fixture_dir)  # relative to the working folder
    configs = {}
    for run, mirror in (("a", "celeba_source"), ("b", other)):
        configs[run] = tmp_path / f"{run}.yaml"
        configs[run].write_text(TWO_SOURCES.format(run=run, mirror=mirror))
    monkeypatch.chdir(tmp_path)
    loaded = {run: load_config([path]) for run, path in configs.items()}
    folders = {run: prepared_folder_of(cfg, "celeba") for run, cfg in loaded.items()}
    assert folders["a"] != folders["b"] and all(f.startswith("celeba-") for f in folders.values())
    assert {prepared_folder_of(cfg, "mnist") for cfg in loaded.values()} == {"mnist"}
    download = load_config([configs["a"]]) | {"data_mirror": None}
    assert prepared_folder_of(download, "celeba") == "celeba"

    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    prepared = {}
    for run in ("a", "b"):
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "snakemake"),
                f"data/{folders[run]}/train.npz",
                "-s",
                str(REPO / "Snakefile"),
                "-d",
                str(tmp_path),
                "-c",
                "1",
                "--configfile",
                str(configs[run]),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        prepared[run] = {
            p.name: p.read_bytes() for p in (tmp_path / "data" / folders[run]).iterdir()
        }
    for run, files in prepared.items():  # both still there, as each config wrote them
        folder = tmp_path / "data" / folders[run]
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    a, b = (load_train_data(experiment(loaded[r], "celeba_dp"), Path("data"), None) for r in "ab")
    assert not np.array_equal(a[0], b[0])
    assert np.array_equal(
        a[0], data.load_split(Path("data"), "celeba", "train", folder=folders["a"])[0]
    )
    with pytest.raises(ValueError, match="celeba prepared from 2 sources"):
        data.load_split(Path("data"), "celeba", "train")  # which one: the experiment says
    assert all(celeba.is_fixture(Path("data") / f) for f in folders.values())

    smoke = load_config([REPO / "config" / "smoke.yaml"])  # the fixture: data_dir-relative
    where = prepared_folder_of(smoke, "celeba")
    (tmp_path / "moved").mkdir()
    monkeypatch.chdir(tmp_path / "moved")
    assert prepared_folder_of(smoke, "celeba") == where != "celeba"


@pytest.fixture
def celeba_run(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "celeba").mkdir(parents=True)
    (data_dir / "celeba" / celeba.FIXTURE_MARKER).write_text("fixture\n")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(data_dir=data_dir))
    out = tmp_path / "results" / "fake"
    loaded = load_config([config])
    rng = np.random.default_rng(0)
    for exp, per_seed in RESULTS.items():
        home = experiment_dir(loaded, out, exp)  # non-private ones under nonprivate/
        for seed, (fid, mlp, cnn) in enumerate(per_seed):
            fileio.write_json(home / f"fid_seed{seed}.json", {"fid": fid})
            fileio.write_json(home / f"acc_mlp_seed{seed}.json", {"accuracy": mlp})
            fileio.write_json(home / f"acc_cnn_seed{seed}.json", {"accuracy": cnn})
        if exp != "real_celeba":
            eps = (None, None) if exp == "celeba_nonprivate" else (0.9, 10.3)
            privacy = {"epsilon": eps[0], "epsilon_paper_convention": eps[1]}
            fileio.write_json(home / "privacy.json", privacy)
        images = rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
        fileio.save_samples(home / "samples_seed0.npz", images, np.arange(40) % 2)
    return config, out


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == csv_columns(CELEBA_METRICS)
    return {r["method"]: r for r in rows}


def test_table3_numbers_land_in_the_right_cells(celeba_run):
    config, out = celeba_run
    written = main_table("table3", [config], out)
    assert {p.name for p in written} == {"table3.md", "table3.csv", "table3.tex", "fig3.png"}
    rows = read_rows(out / "tables" / "table3.csv")
    assert list(rows) == [
        "Real data",
        "Sinkhorn (non-private)",
        "DP-Sinkhorn",
        "DP-MERF",
        "DataLens",
    ]
    dp = rows["DP-Sinkhorn"]
    assert float(dp["fid"]) == pytest.approx(171.0)
    assert float(dp["acc_mlp"]) == pytest.approx(77.0) and float(dp["acc_cnn"]) == 76.0
    assert float(dp["epsilon"]) == 0.9 and float(dp["epsilon_paper_convention"]) == 10.3
    assert (
        rows["Real data"]["epsilon"] == "inf" and rows["Sinkhorn (non-private)"]["epsilon"] == "inf"
    )
    assert float(rows["Sinkhorn (non-private)"]["acc_cnn"]) == pytest.approx(82.0)
    assert rows["DataLens"]["acc_mlp"] == "" and float(rows["DataLens"]["fid"]) == 320.8
    assert rows["DP-MERF"]["source"] == "reported in paper"
    md = (out / "tables" / "table3.md").read_text()
    assert "SYNTHETIC CelebA FIXTURE" in md
    assert "171.0 ± 1.4 (paper 189.5)" in md and "(paper 91.9)" in md and "(paper 129.5)" in md
    assert "10.30 (paper 10)" in md and "Log Reg" not in md
    assert "![fig3](../figures/fig3.png)" in md
    tex = (out / "tables" / "table3.tex").read_text()
    assert "\\multicolumn{6}" in tex and "FIXTURE" in tex


def test_table6_numbers_and_figure(celeba_run):
    from matplotlib.image import imread

    config, out = celeba_run
    main_table("table6", [config], out)
    rows = read_rows(out / "tables" / "table6.csv")
    assert list(rows) == ["Real data", "DCGAN+DP-Sinkhorn", "BigGAN+DP-Sinkhorn"]
    assert float(rows["DCGAN+DP-Sinkhorn"]["fid"]) == pytest.approx(155.0)
    assert float(rows["BigGAN+DP-Sinkhorn"]["fid"]) == pytest.approx(171.0)
    md = (out / "tables" / "table6.md").read_text()
    assert "(paper 74.96)" in md and "(paper 168.4)" in md and "(paper 75.79)" in md
    main_table("table3", [config], out)
    fig3, fig6 = (imread(out / "figures" / f"{n}.png") for n in ("fig3", "fig6"))
    assert fig6.ndim == 3 and fig6.shape[0] > 1.5 * fig3.shape[0]  # 4 sample rows, not 2


def test_table_without_fixture_has_no_warning(celeba_run):
    config, out = celeba_run
    data_dir = Path(config.read_text().split("data_dir: ")[1].split("\n")[0])
    (data_dir / "celeba" / celeba.FIXTURE_MARKER).unlink()
    main_table("table3", [config], out)
    assert "FIXTURE" not in (out / "tables" / "table3.md").read_text()


def test_missing_result_file_is_named(celeba_run):
    config, out = celeba_run
    (out / "celeba_dcgan" / "acc_cnn_seed1.json").unlink()
    with pytest.raises(FileNotFoundError, match="celeba_dcgan/acc_cnn_seed1.json"):
        main_table("table6", [config], out)
