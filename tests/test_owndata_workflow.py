"""End to end on data no one here wrote: scikit-learn's ``load_digits`` through the workflow.

The 1,797 8x8 digits are written as an ImageFolder of PNG files (resized to 28 px, a
conditional DP generator and a real-data row) and as an ``.npz`` (resized to 32 px RGB,
conditional, and to 64 px, unconditional). The repo's Snakefile runs on a config naming
them (``datasets:``) in a fresh folder, with secret noise keys (``reproducible: false``),
as a user's own run would. Then ``dpsinkhorn release`` publishes the run, and the release
folder must hold exactly the manifest's files: nothing computed from the private data that
no ledger covers (the real-data row, the FID statistics and the scores against the private
held-out split, which live under ``nonprivate/``).

Data: the digits ship with scikit-learn; FID weights come from DPSINKHORN_FID_WEIGHTS as for
the smoke test. A few minutes on 2 cores: marked ``slow``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import (
    read_csv,
    require_shared,
    shared_path,
    write_digits_imagefolder,
    write_digits_npz,
)
from PIL import Image

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DIGITS = [str(d) for d in range(10)]
TRAINED = ("digits_dp", "digits32_dp", "digits64_uncond")


def run(*cmd: str, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        list(cmd), cwd=cwd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    return output


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder in which the workflow has run on the digits config, and released it."""
    workdir = tmp_path_factory.mktemp("owndata")
    folder = write_digits_imagefolder(workdir / "digits_png")
    npz = write_digits_npz(workdir / "digits.npz")
    config = {
        "run_name": "digits",
        "data_dir": "data",
        "device": "auto",
        "seeds": [0],
        "datasets": {
            "digits": {
                "path": str(folder),
                "image_size": 28,
                "resize": True,
                "title": "Digits (scikit-learn)",
            },
            "digits32": {
                "path": str(npz),
                "classes": DIGITS,
                "image_size": 32,
                "channels": 3,
                "resize": True,
            },
            "digits64": {"path": str(npz), "classes": DIGITS, "image_size": 64, "resize": True},
        },
        "evaluation": {
            # 30 samples, as config/smoke.yaml: every FID and classifier still computed
            "num_samples": 30,
            "fid_reference_size": 30,
            "fid_sqrtm": "eigh",
            "classifiers": ["logreg", "mlp", "cnn"],
            "logreg_max_iter": 200,
            "max_epochs": 2,
            "patience": 1,
            "batch_size": 128,
        },
        "training_defaults": {
            "steps": 12,
            "checkpoint_every": 6,
            "log_every": 4,
            "batch_size": 50,
            "reproducible": False,
        },
        "experiments": {
            "real_digits": {"dataset": "digits", "table1_row": "real", "method": "real_data"},
            "digits_dp": {"dataset": "digits", "table1_row": "paper", "sigma": 1.5},
            "digits32_dp": {"dataset": "digits32", "table1_row": "paper", "sigma": 1.5},
            "digits64_uncond": {
                "dataset": "digits64",
                "table1_row": "paper",
                "sigma": 1.5,
                "conditional": False,
                "channels": [64, 32, 16, 8],
            },
        },
    }
    (workdir / "digits.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "FID_WEIGHTS=PATH")
    run(
        str(BIN / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "-c",
        "2",
        "--max-threads",
        "1",  # two one-thread jobs side by side (as tests/test_workflow.py)
        "--configfile",
        str(workdir / "digits.yaml"),
        "--config",
        f"fid_weights={weights}",
        cwd=workdir,
    )
    run(
        str(BIN / "dpsinkhorn"),
        "release",
        "--config",
        "digits.yaml",
        "--out",
        "published",
        cwd=workdir,
    )
    return workdir


@pytest.fixture(scope="module")
def results(workdir) -> Path:
    return workdir / "results" / "digits"


def test_table_has_a_row_per_experiment_with_fid_and_accuracies(results):
    rows = read_csv(results / "tables" / "table1.csv")
    ours = [r for r in rows if r["source"] == "this run"]
    assert {r["dataset"] for r in ours} == {"digits", "digits32", "digits64"}, ours
    by_dataset = {}
    for row in ours:
        by_dataset.setdefault(row["dataset"], []).append(row)
    conditional = [
        r
        for r in by_dataset["digits"] + by_dataset["digits32"]
        if r["method"].startswith("DP-Sinkhorn")
    ]
    assert len(conditional) == 2
    for row in conditional:
        for metric in ("fid", "acc_logreg", "acc_mlp", "acc_cnn"):
            assert math.isfinite(float(row[metric])), (metric, row)
        assert 0 < float(row["epsilon"]) < math.inf
    (uncond,) = by_dataset["digits64"]
    assert math.isfinite(float(uncond["fid"]))
    assert uncond["acc_cnn"] == ""  # no classifier for an unconditional generator


def test_table_states_the_preparation_and_the_private_test_split(results):
    text = (results / "tables" / "table1.md").read_text()
    assert "resized to 64x64 px" in text and "not covered by the privacy guarantee" in text


def test_samples_figure_and_prepared_data(workdir, results):
    for dataset, size, channels in [("digits", 28, 1), ("digits32", 32, 3), ("digits64", 64, 1)]:
        (folder,) = (workdir / "data").glob(f"{dataset}-*/")  # <name>-<entry hash>
        facts = json.loads((folder / "dataset.json").read_text())
        assert facts["image_size"] == size and facts["classes"] == DIGITS, facts
        assert facts["channels"] == channels, facts
    figure = results / "figures" / "samples_digits.png"
    with Image.open(figure) as image:
        image.verify()


def test_private_outputs_live_under_nonprivate(results):
    assert (results / "nonprivate" / "real_digits").is_dir()
    assert not (results / "real_digits").exists()
    for exp in TRAINED:
        assert (results / exp / "generator.pt").is_file()
        # The held-out split is private: scores against it are not covered by the ledger.
        assert (results / "nonprivate" / exp / "fid_seed0.json").is_file()
        assert not (results / exp / "fid_seed0.json").exists()
        assert not (results / exp / "private_workspace").exists()


def test_release_holds_exactly_the_manifest(workdir, results):
    manifest = json.loads((results / "release_manifest.json").read_text())
    listed = {entry["path"] for entry in manifest["files"]}
    published = workdir / "published"
    copied = {str(p.relative_to(published)) for p in published.rglob("*") if p.is_file()}
    assert copied - {"release_manifest.json"} == listed, (copied, listed)
    assert not any(p.startswith("nonprivate") or "real_digits" in p for p in copied)
    for exp in TRAINED:
        for name in ("generator.pt", "privacy.json", "train_log.csv", "samples_seed0.npz"):
            assert f"{exp}/{name}" in listed
        ledger = json.loads((published / exp / "privacy.json").read_text())
        assert not ledger["guarantee"].startswith("none"), ledger["guarantee"]


def test_privacy_summary_composes_releases_of_the_same_private_data(results):
    summary = {
        d["dataset"]: d
        for d in json.loads((results / "privacy_summary.json").read_text())["datasets"]
    }
    # digits32 and digits64 read the same .npz: one private source, two releases composed.
    assert set(summary) == {"digits", "digits32+digits64"}, summary
    both = summary["digits32+digits64"]
    assert both["releases"] == 2 and both["warnings"]
    assert both["epsilon_composed"] > max(both["release_epsilons"].values())
    assert summary["digits"]["releases"] == 1 and summary["digits"]["configurations_tried"] == 1


def test_ledger_states_the_resizing(results):
    ledger = json.loads((results / "digits_dp" / "privacy.json").read_text())
    assert ledger["data"]["dataset"] == "digits" and ledger["data"]["layout"] == "image folder"
    assert "resized to 28x28" in ledger["data"]["preparation"]
