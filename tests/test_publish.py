"""Issue 21: the release, defined by the code, and accounting across releases.

A tiny real run (two DP releases, one non-private generator, one real-data row on MNIST,
6 training steps each) is laid out as the workflow lays it out: DP experiments in
``<run>/<exp>/``, everything else under ``<run>/nonprivate/``. Its manifest lists exactly
the DP folders' files and the privacy summary; ``dpsinkhorn release`` copies exactly
those and refuses, with one line and exit 2, everything the issue names.
"""

from __future__ import annotations

import json
import shutil

import pytest

from dpsinkhorn import cli, fileio
from dpsinkhorn import config as config_lib
from dpsinkhorn.config import targets
from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.accounting import composed_epsilon, compute_epsilon
from dpsinkhorn.report.privacy_summary import privacy_summary, summary_markdown
from dpsinkhorn.train.publish import MANIFEST, release, sha256_of, write_manifest
from dpsinkhorn.train.run import train
from dpsinkhorn.train.workspace import WORKSPACE

TINY = {"channels": [16, 8, 4], "steps": 6, "checkpoint_every": 2, "log_every": 2}


def run_config(reproducible: bool = False) -> dict:
    experiments = {
        "dp_a": {"sigma": 1.5},
        "dp_b": {"sigma": 1.5},
        "np": {"method": "sinkhorn"},
        "real": {"method": "real_data"},
    }
    experiments = {name: {"dataset": "mnist", **e} for name, e in experiments.items()}
    return config_lib.validate(
        {
            "run_name": "t",
            "seeds": [0],
            "evaluation": {"num_samples": 20, "classifiers": ["logreg"]},
            "training_defaults": {**TINY, "reproducible": reproducible},
            "experiments": experiments,
        },
        "test",
    )


def make_run(root, mnist_dir, mnist, reproducible: bool = False):
    """Train, sample and score every experiment into ``root`` (the workflow's layout)."""
    config = run_config(reproducible)
    for exp in config_lib.trained_experiments(config):
        out = config_lib.experiment_dir(config, root, exp)
        train(config_lib.experiment(config, exp), out, train_data=mnist, progress=False,
              record_dir=root.parent / "trainings")  # fmt: skip
        samples = out / "samples_seed0.npz"
        args = ["sample", "--generator", str(out / "generator.pt"), "--num", "20"]
        assert cli.main(args + ["--seed", "0", "--out", str(samples), "--device", "cpu"]) == 0
    real = config_lib.experiment_dir(config, root, "real") / "samples_seed0.npz"
    train_npz = str(mnist_dir / "mnist" / "train.npz")
    args = ["sample-real", "--data", train_npz, "--num", "20", "--seed", "0"]
    assert cli.main(args + ["--out", str(real)]) == 0
    for exp in config_lib.experiment_names(config):
        # Scores: only their place matters to the release (their bytes are hashed as they are).
        for path in targets.evaluation_files(config, root, [exp]):
            fileio.write_json(path, {"score": 0.0, "experiment": exp}, record=True)
    fileio.write_json(targets.gradstudy_file(root, "dp_a"), {"p": [0.2]})
    summary = privacy_summary(config, root)
    fileio.write_json(targets.privacy_summary_file(root), summary, record=True)
    write_manifest(config, root)
    return config


@pytest.fixture(scope="module")
def mnist(prepared_data):
    return data.load_split(prepared_data, "mnist", "train")


@pytest.fixture(scope="module")
def run(tmp_path_factory, prepared_data, mnist):
    root = tmp_path_factory.mktemp("results") / "t"
    return make_run(root, prepared_data, mnist), root


def _refused(argv, capsys, *words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err


def test_private_and_nonprivate_files_live_apart(run):
    config, root = run
    assert config_lib.private_experiments(config) == ["dp_a", "dp_b"]
    top = {p.name for p in root.iterdir()}
    assert top == {"dp_a", "dp_b", "nonprivate", MANIFEST, "privacy_summary.json",
                   "privacy_summary.json.sha256"}  # fmt: skip
    assert {p.name for p in (root / "nonprivate").iterdir()} == {"np", "real", "dp_a"}
    assert (root / "nonprivate" / "dp_a" / "gradstudy.json").is_file()
    assert not (root / "dp_a" / "gradstudy.json").exists()
    ledger = fileio.read_json(root / "nonprivate" / "np" / "privacy.json")
    assert ledger["private"] is False and ledger["guarantee"] is None
    for exp in ("dp_a", "dp_b"):
        hashed = ("samples_seed0.npz", "fid_seed0.json", "acc_logreg_seed0.json")
        assert {p.name for p in (root / exp).iterdir()} - {".dpsinkhorn.lock"} == {
            "generator.pt",
            "privacy.json",
            "train_log.csv",
            *hashed,
            *(f"{name}.sha256" for name in hashed),  # recorded by their writers
        }


def test_manifest_lists_each_dp_file_with_its_ledger_and_hash(run):
    config, root = run
    manifest = fileio.read_json(root / MANIFEST)
    paths = [f["path"] for f in manifest["files"]]
    assert sorted(paths) == sorted(
        [f"{e}/{n}" for e in ("dp_a", "dp_b") for n in
         ("generator.pt", "privacy.json", "train_log.csv", "samples_seed0.npz",
          "fid_seed0.json", "acc_logreg_seed0.json")] + ["privacy_summary.json"]
    )  # fmt: skip
    for entry in manifest["files"]:
        assert entry["sha256"] == sha256_of(root / entry["path"])
        if entry["path"] == "privacy_summary.json":
            assert entry["ledgers"] == ["dp_a/privacy.json", "dp_b/privacy.json"]
        else:
            assert entry["ledgers"] == [entry["path"].split("/")[0] + "/privacy.json"]
        assert all(g.startswith("(epsilon, delta)-DP") for g in entry["guarantees"])


def test_release_copies_exactly_the_manifest(run, tmp_path, capsys):
    _, root = run
    out = tmp_path / "published"
    assert cli.main(["release", "--run", str(root), "--out", str(out)]) == 0
    manifest = fileio.read_json(root / MANIFEST)
    copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert copied == sorted([MANIFEST] + [f["path"] for f in manifest["files"]])
    for name in copied:
        assert (out / name).read_bytes() == (root / name).read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".published.tmp")]
    # An existing, non-empty folder is refused.
    _refused(["release", "--run", str(root), "--out", str(out)], capsys, str(out), "not an empty")


def test_release_refuses_what_no_ledger_covers(run, tmp_path, capsys):
    _, root = run
    argv = lambda r: ["release", "--run", str(r), "--out", str(tmp_path / "o")]  # noqa: E731

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(root, dst)
        return dst

    (changed := copy("changed"))
    (changed / "dp_a" / "train_log.csv").write_text("step\n")
    _refused(argv(changed), capsys, "dp_a/train_log.csv", "sha256")

    (left := copy("workspace"))
    (left / "dp_b" / WORKSPACE).mkdir()
    _refused(argv(left), capsys, WORKSPACE, "not complete")

    (missing := copy("missing"))
    (missing / "dp_b" / "samples_seed0.npz").unlink()
    _refused(argv(missing), capsys, "dp_b/samples_seed0.npz", "missing")

    (unlisted := copy("unlisted"))
    shutil.copytree(unlisted / "dp_a", unlisted / "dp_c")
    _refused(argv(unlisted), capsys, "dp_c/privacy.json", "does not list")

    (sneaked := copy("sneaked"))
    manifest = fileio.read_json(sneaked / MANIFEST)
    real = "nonprivate/real/samples_seed0.npz"
    manifest["files"].append(
        {"path": real, "sha256": sha256_of(sneaked / real), "ledgers": ["dp_a/privacy.json"]}
    )
    fileio.write_json(sneaked / MANIFEST, manifest)
    _refused(argv(sneaked), capsys, real, "not private")

    (nonprivate := copy("nonprivate_ledger"))
    manifest = fileio.read_json(nonprivate / MANIFEST)
    manifest["ledgers"]["dp_a/privacy.json"] = None
    fileio.write_json(nonprivate / MANIFEST, manifest)
    _refused(argv(nonprivate), capsys, "dp_a/privacy.json", "no guarantee")

    (incomplete := copy("incomplete"))
    (incomplete / MANIFEST).unlink()
    _refused(argv(incomplete), capsys, MANIFEST, "not complete")
    assert not (tmp_path / "o").exists()


def _copy(root, dst):
    shutil.copytree(root, dst)
    return dst


def test_a_swapped_generator_is_refused_by_every_publication_path(run, tmp_path, capsys):
    """The non-private generator put in place of a DP one: release-manifest and release
    refuse it (its sha256 is not the ledger's content_sha256), and write nothing."""
    config, root = run
    swapped = _copy(root, tmp_path / "swapped")
    shutil.copy(swapped / "nonprivate" / "np" / "generator.pt", swapped / "dp_a" / "generator.pt")
    manifest = (swapped / MANIFEST).read_bytes()
    with pytest.raises(ValueError, match=r"dp_a/generator.pt: not the file that was produced"):
        write_manifest(config, swapped)
    assert (swapped / MANIFEST).read_bytes() == manifest
    # The manifest rewritten by hand with the swapped file's hash: release refuses it too.
    listed = fileio.read_json(swapped / MANIFEST)
    for entry in listed["files"]:
        if entry["path"] == "dp_a/generator.pt":
            entry["sha256"] = sha256_of(swapped / "dp_a" / "generator.pt")
    fileio.write_json(swapped / MANIFEST, listed)
    argv = ["release", "--run", str(swapped), "--out", str(tmp_path / "o")]
    _refused(argv, capsys, "dp_a/generator.pt", "content_sha256")
    assert not (tmp_path / "o").exists()


def test_an_edited_train_log_is_refused_even_with_a_fresh_manifest(run, tmp_path, capsys):
    config, root = run
    edited = _copy(root, tmp_path / "edited")
    log = edited / "dp_b" / "train_log.csv"
    log.write_text(log.read_text().replace("step,", "step ,"))
    with pytest.raises(ValueError, match=r"dp_b/train_log.csv: .*train_log_sha256"):
        write_manifest(config, edited)


@pytest.mark.parametrize("name", ["train_copy.npz", "samples_seed9.npz"])
def test_a_hand_listed_file_is_refused(run, prepared_data, tmp_path, capsys, name):
    """A copy of the training data listed by hand in the manifest of a DP folder: refused
    as a file the code does not publish, or as one no writer recorded a hash for."""
    _, root = run
    sneaked = _copy(root, tmp_path / "sneaked")
    shutil.copy(prepared_data / "mnist" / "train.npz", sneaked / "dp_a" / name)
    manifest = fileio.read_json(sneaked / MANIFEST)
    manifest["files"].append({"path": f"dp_a/{name}", "sha256": sha256_of(sneaked / "dp_a" / name),
                              "ledgers": ["dp_a/privacy.json"],
                              "guarantees": manifest["files"][0]["guarantees"]})  # fmt: skip
    fileio.write_json(sneaked / MANIFEST, manifest)
    words = ("not a file dpsinkhorn publishes",) if "copy" in name else ("no hash recorded",)
    _refused(["release", "--run", str(sneaked), "--out", str(tmp_path / "o")], capsys,
             f"dp_a/{name}", *words)  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_public_noise_seed_needs_the_flag(tmp_path, prepared_data, mnist, capsys):
    root = tmp_path / "t"
    make_run(root, prepared_data, mnist, reproducible=True)
    _refused(
        ["release", "--run", str(root), "--out", str(tmp_path / "o")],
        capsys,
        "guarantee is 'none",
        "--accept-no-guarantee",
    )
    files = release(root, tmp_path / "o", accept_no_guarantee=True)
    assert (tmp_path / "o" / "dp_a" / "generator.pt") in files
    summary = fileio.read_json(root / "privacy_summary.json")["datasets"][0]
    assert summary["no_guarantee"] == ["dp_a", "dp_b"]


def test_two_identical_runs_compose_to_one_run_of_twice_the_steps():
    q, z, steps, delta = 0.01, 1.1, 300, 1e-5
    both = composed_epsilon([(q, z, steps), (q, z, steps)], delta)
    assert both == pytest.approx(compute_epsilon(z, q, 2 * steps, delta), rel=1e-12)
    assert both > compute_epsilon(z, q, steps, delta)
    # A different mechanism composes too: more than either alone, less than their sum.
    mixed = composed_epsilon([(q, z, steps), (2 * q, 2 * z, steps)], delta)
    alone = (compute_epsilon(z, q, steps, delta), compute_epsilon(2 * z, 2 * q, steps, delta))
    assert max(alone) < mixed < sum(alone)


def test_privacy_summary_of_the_run(run):
    config, root = run
    (summary,) = fileio.read_json(root / "privacy_summary.json")["datasets"]
    ledgers = [fileio.read_json(root / e / "privacy.json") for e in ("dp_a", "dp_b")]
    assert summary["dataset"] == "mnist" and summary["releases"] == 2
    assert summary["release_epsilons"] == {
        e: x["epsilon"] for e, x in zip(("dp_a", "dp_b"), ledgers, strict=True)
    }
    assert summary["configurations_tried"] == 3  # dp_a, dp_b and the non-private np
    (a, b) = ledgers
    assert (a["q"], a["noise_multiplier"], a["steps"]) == (
        b["q"],
        b["noise_multiplier"],
        b["steps"],
    )
    doubled = compute_epsilon(a["noise_multiplier"], a["q"], 2 * a["steps"], a["delta"])
    assert summary["epsilon_composed"] == pytest.approx(doubled, rel=1e-12)
    assert summary["epsilon_composed"] > a["epsilon"]
    assert any("2 DP releases" in w for w in summary["warnings"])
    text = "\n".join(summary_markdown({"datasets": [summary]}))
    assert "| mnist | 2 |" in text and "**Warning:** 2 DP releases" in text
    assert json.loads(json.dumps(summary)) == summary
