"""The release: one door (``dpsinkhorn.publish``), every published byte proven from the
ledger and the config.

A tiny real run (two DP releases, one non-private generator, one real-data row on MNIST,
6 training steps each) is laid out as the workflow lays it out: DP experiments in
``<run>/<exp>/``, everything else under ``<run>/nonprivate/``. The DP experiments are
evaluated by the real ``dpsinkhorn evaluate`` (samples, FID against statistics of real
test images, Log-Reg). ``dpsinkhorn release`` publishes exactly what the config lists and
the ledgers prove, and refuses, with one line and exit 2, each attack below.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpsinkhorn import cli, fileio, publish
from dpsinkhorn import config as config_lib
from dpsinkhorn.config import targets
from dpsinkhorn.data import datasets as data
from dpsinkhorn.evaluate.classify import train_and_evaluate_seeds, write_results
from dpsinkhorn.evaluate.sample import sample_real
from dpsinkhorn.privacy.accounting import composed_epsilon, compute_epsilon
from dpsinkhorn.publish import MANIFEST, decision, run_folders, write_manifest
from dpsinkhorn.report.privacy_summary import privacy_summary, summary_markdown
from dpsinkhorn.train.run import train
from dpsinkhorn.train.workspace import WORKSPACE

TINY = {"channels": [16, 8, 4], "steps": 6, "checkpoint_every": 2, "log_every": 2}
NUM = 20  # samples per seed
DP = ("dp_a", "dp_b")


def run_config(data_dir, reproducible: bool = False) -> dict:
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
            "data_dir": str(data_dir),
            "seeds": [0],
            "evaluation": {"num_samples": NUM, "classifiers": ["logreg"]},
            "training_defaults": {**TINY, "reproducible": reproducible},
            "experiments": experiments,
        },
        "test",
    )


def make_run(root, prepared, mnist, weights, reproducible: bool = False):
    """Train, evaluate and summarise every experiment into ``root`` (the workflow's layout),
    with a data folder of its own beside it (its own training record)."""
    data_dir = root.parent / "data"
    config = run_config(data_dir, reproducible)
    folder = config_lib.prepared_folder_of(config, "mnist")
    data_dir.mkdir(parents=True)
    (data_dir / folder).symlink_to(prepared / "mnist", target_is_directory=True)
    test = data_dir / folder / "test.npz"
    reference = targets.fid_reference_file(root, "mnist")
    args = ["fid-stats", "--samples", str(test), "--out", reference, "--num", "16"]
    assert cli.main([*args, "--weights", str(weights), "--device", "cpu"]) == 0
    for exp in config_lib.trained_experiments(config):
        out = config_lib.experiment_dir(config, root, exp)
        train(
            config_lib.experiment(config, exp),
            out,
            train_data=mnist,
            progress=False,
            record_dir=data_dir / "trainings",
        )
        if exp in DP:
            args = [
                "evaluate",
                "--generator",
                str(out / "generator.pt"),
                "--test",
                str(test),
                "--reference",
                reference,
                "--seed",
                "0",
                "--num",
                str(NUM),
                "--samples-dir",
                str(out),
                "--scores-dir",
                str(out),
                "--classifiers",
                "logreg",
                "--dataset",
                "mnist",
                "--weights",
                str(weights),
                "--sqrtm",
                "eigh",
                "--device",
                "cpu",
            ]
            assert cli.main(args) == 0
    for exp in ("np", "real"):  # not released: only their place matters
        for path in targets.evaluation_files(config, root, [exp]):
            fileio.write_json(path, {"score": 0.0, "experiment": exp})
    fileio.write_json(targets.gradstudy_file(root, "dp_a"), {"p": [0.2]})
    fileio.write_json(targets.privacy_summary_file(root), privacy_summary(config, root))
    write_manifest(config, root)
    return config


@pytest.fixture(scope="module")
def mnist(prepared_mnist):
    return data.load_split(prepared_mnist, "mnist", "train")


@pytest.fixture(scope="module")
def run(tmp_path_factory, prepared_mnist, mnist, fid_weights):
    root = tmp_path_factory.mktemp("run") / "t"
    return make_run(root, prepared_mnist, mnist, fid_weights), root


def _copy(root, dst):
    """A copy of the run (and its data folder beside it, as the config names it)."""
    shutil.copytree(root.parent, dst, symlinks=True)
    return dst / root.name


def _release_argv(config, run, out):
    path = run.parent / "config.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump({**config, "data_dir": str(run.parent / "data")}))
    return ["release", "--config", str(path), "--run", str(run), "--out", str(out)]


def _refused(argv, capsys, *words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err


def _published(out) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_private_and_nonprivate_files_live_apart(run):
    config, root = run
    assert config_lib.private_experiments(config) == list(DP)
    top = {p.name for p in root.iterdir()}
    assert top == {*DP, "nonprivate", MANIFEST, "privacy_summary.json"}
    assert {p.name for p in (root / "nonprivate").iterdir()} == {
        "np",
        "real",
        "dp_a",
        "fid_ref_mnist.npz",
    }
    assert not (root / "dp_a" / "gradstudy.json").exists()
    ledger = fileio.read_json(root / "nonprivate" / "np" / "privacy.json")
    assert ledger["private"] is False and ledger["guarantee"] is None
    for exp in DP:
        names = {p.name for p in (root / exp).iterdir()} - {".dpsinkhorn.lock"}
        # evaluate_phases.json: the commit and code of each evaluation phase (no data)
        assert names == {
            "generator.pt",
            "privacy.json",
            "train_log.csv",
            "samples_seed0.npz",
            "fid_seed0.json",
            "acc_logreg_seed0.json",
            "evaluate_phases.json",
        }


def test_release_publishes_exactly_what_the_config_lists_each_proven(run, tmp_path, capsys):
    config, root = run
    out = tmp_path / "published"
    assert cli.main(_release_argv(config, _copy(root, tmp_path / "c"), out)) == 0
    said = capsys.readouterr().out  # the curator's terminal: per release and per person
    assert "epsilon per release: dp_a" in said and "the worst-off person's epsilon" in said
    (counts,) = [line for line in said.splitlines() if line.startswith("curator only: ")]
    files = _published(out)
    assert not any(counts.split(": ", 2)[2].encode() in data for data in files.values())
    expected = [
        f"{e}/{n}"
        for e in DP
        for n in (
            "privacy.json",
            "generator.pt",
            "train_log.csv",
            "samples_seed0.npz",
            "fid_seed0.json",
            "acc_logreg_seed0.json",
        )
    ]
    assert sorted(files) == sorted([*expected, "privacy_summary.json", MANIFEST])
    for name in expected + ["privacy_summary.json"]:
        assert files[name] == (root / name).read_bytes(), name  # samples: the redraw's bytes
    report = json.loads(files[MANIFEST])
    assert report["version"] == publish.MANIFEST_VERSION
    kinds = {e["path"]: e["kind"] for e in report["files"]}
    assert kinds["dp_a/samples_seed0.npz"] == "samples" and kinds["dp_b/fid_seed0.json"] == "scores"
    for entry in report["files"]:
        assert entry["sha256"] == hashlib.sha256(files[entry["path"]]).hexdigest()
        assert entry["proof"]
        if entry["path"] == "privacy_summary.json":
            assert entry["ledgers"] == ["dp_a/privacy.json", "dp_b/privacy.json"]
        else:
            assert entry["ledgers"] == [entry["path"].split("/")[0] + "/privacy.json"]
        assert all(g.startswith("(epsilon, delta)-DP") for g in entry["guarantees"])
    # The run's own report is the same decision.
    run_report = fileio.read_json(root / MANIFEST)
    assert [e["path"] for e in run_report["files"]] == [e["path"] for e in report["files"]]
    # An existing, non-empty folder is refused.
    assert cli.main(_release_argv(config, _copy(root, tmp_path / "d"), out)) == 2


def test_scores_name_their_inputs_by_content(run):
    config, root = run
    (folder,) = [f for f in run_folders(config, root) if f.experiment == "dp_a"]
    samples = fileio.sha256_of(root / "dp_a" / "samples_seed0.npz")
    fid = fileio.read_json(root / "dp_a" / "fid_seed0.json")
    acc = fileio.read_json(root / "dp_a" / "acc_logreg_seed0.json")
    assert fid["a_sha256"] == acc["train_sha256"] == samples
    assert fid["b_sha256"] == fileio.sha256_of(folder.reference)
    assert acc["test_sha256"] == fileio.sha256_of(folder.test)
    assert set(fid) <= publish.SCORE_KEYS["fid"] and set(acc) <= publish.SCORE_KEYS["acc"]


def test_sample_real_in_a_dp_samples_place_is_refused(run, tmp_path, capsys):
    """Raw private records written where a DP sample file belongs (the real attack):
    not the verified generator's draw."""
    config, root = run
    bad = _copy(root, tmp_path / "c")
    train_npz = bad.parent / "data" / config_lib.prepared_folder_of(config, "mnist") / "train.npz"
    fileio.save_samples(bad / "dp_a" / "samples_seed0.npz", *sample_real(train_npz, NUM, 0))
    _refused(
        _release_argv(config, bad, tmp_path / "o"),
        capsys,
        "dp_a/samples_seed0.npz",
        "not the verified generator's draw",
    )
    assert not (tmp_path / "o").exists()


def test_a_lying_manifest_or_ledger_is_refused(run, tmp_path, capsys):
    config, root = run
    # The run's manifest is not an input: a lie in it is refused, never believed.
    lies = {
        "guarantee": lambda m: m["ledgers"].update(
            {"dp_a/privacy.json": "(epsilon, delta)-DP with epsilon = 0.01"}
        ),
        "file": lambda m: m["files"].append(
            {
                "path": "nonprivate/real/samples_seed0.npz",
                "sha256": "x",
                "ledgers": ["dp_a/privacy.json"],
            }
        ),
    }
    for name, lie in lies.items():
        lied = _copy(root, tmp_path / name)
        manifest = fileio.read_json(lied / MANIFEST)
        lie(manifest)
        fileio.write_json(lied / MANIFEST, manifest)
        _refused(
            _release_argv(config, lied, tmp_path / "o1"),
            capsys,
            MANIFEST,
            "does not report this release",
        )
    assert not (tmp_path / "o1").exists()

    def ledger_edit(name, change, *words):
        bad = _copy(root, tmp_path / name)
        ledger = fileio.read_json(bad / "dp_a" / "privacy.json")
        change(ledger)
        fileio.write_json(bad / "dp_a" / "privacy.json", ledger)
        _refused(_release_argv(config, bad, tmp_path / "o2"), capsys, "dp_a/privacy.json", *words)

    ledger_edit("public", lambda x: x.update(reproducible=True), "reproducible is True")
    ledger_edit(
        "eps",
        lambda x: x.update(guarantee=x["guarantee"].replace("epsilon = ", "epsilon = 1")),
        "guarantee states epsilon",
    )
    ledger_edit("epsilon", lambda x: x.update(epsilon=x["epsilon"] / 2), "is not that of its q")
    ledger_edit("nonprivate", lambda x: x.update(private=False), "not a DP ledger")
    ledger_edit("other", lambda x: x.update(experiment="dp_b"), "the ledger of 'dp_b'")
    assert not (tmp_path / "o2").exists()


def test_a_ledger_its_training_did_not_write_is_refused(run, tmp_path, capsys):
    """The ledger is proven from the training record, not from itself: a DP ledger
    re-hashed to the non-private generator and log (every check of the ledger alone
    passes), and a ledger with a key or text added."""
    config, root = run
    forged = _copy(root, tmp_path / "forged")
    ledger = fileio.read_json(forged / "dp_a" / "privacy.json")
    for name, key in (("generator.pt", "content_sha256"), ("train_log.csv", "train_log_sha256")):
        shutil.copy(forged / "nonprivate" / "np" / name, forged / "dp_a" / name)
        ledger[key] = fileio.sha256_of(forged / "dp_a" / name)
    fileio.write_json(forged / "dp_a" / "privacy.json", ledger)
    _refused(
        _release_argv(config, forged, tmp_path / "o"),
        capsys,
        "dp_a/privacy.json",
        "no finished DP training in the training record",
    )
    gone = _copy(root, tmp_path / "gone")  # no training record at all: said so, not named
    shutil.rmtree(gone.parent / "data" / "trainings")
    _refused(
        _release_argv(config, gone, tmp_path / "o"),
        capsys,
        "dp_a/privacy.json",
        "(no record file of this training data in ",
    )

    edits = {
        "key": lambda x: x.update(note="records 17, 4, 9"),
        "text": lambda x: x.update(guarantee=x["guarantee"] + " 17, 4, 9"),
    }
    for name, change in edits.items():
        bad = _copy(root, tmp_path / name)
        ledger = fileio.read_json(bad / "dp_a" / "privacy.json")
        change(ledger)
        fileio.write_json(bad / "dp_a" / "privacy.json", ledger)
        _refused(
            _release_argv(config, bad, tmp_path / "o"),
            capsys,
            "dp_a/privacy.json",
            "not the ledger training",
            "ledger_sha256",
        )

    settings = _copy(root, tmp_path / "settings")
    other = {**config, "experiments": {**config["experiments"]}}
    other["experiments"]["dp_a"] = {**other["experiments"]["dp_a"], "lr": 0.5}
    (settings.parent / "config.yaml").write_text(
        yaml.safe_dump({**other, "data_dir": str(settings.parent / "data")})
    )
    _refused(
        _release_argv(other, settings, tmp_path / "o"),
        capsys,
        "dp_a/privacy.json",
        "other settings than the config's (lr)",
    )
    assert not (tmp_path / "o").exists()


def test_a_record_without_ledger_hashes_proves_no_ledger(run, tmp_path, capsys):
    """A training record whose finished events lack ``ledger_sha256`` proves no ledger:
    the release is refused in one line naming the ledger, and nothing is written."""
    config, root = run
    old = _copy(root, tmp_path / "old")
    (path,) = (old.parent / "data" / "trainings").glob("*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum("ledger_sha256" in e for e in events) == len(DP) + 1  # each finished event (np)
    path.write_text(
        "".join(
            json.dumps({k: v for k, v in e.items() if k != "ledger_sha256"}) + "\n" for e in events
        )
    )
    _refused(
        _release_argv(config, old, tmp_path / "o"),
        capsys,
        "dp_a/privacy.json",
        "or the record lacks it",
    )
    assert not (tmp_path / "o").exists()


def test_a_release_without_its_prepared_training_split_names_it(run, tmp_path, capsys):
    """The record that proves a ledger is keyed by the training split's content: without
    the prepared split the release says which file is missing."""
    config, root = run
    bare = _copy(root, tmp_path / "c")
    prepared = bare.parent / "data" / config_lib.prepared_folder_of(config, "mnist")
    test = (prepared / "test.npz").read_bytes()
    prepared.unlink()  # the fixture's symlink to the shared prepared data, not the data
    prepared.mkdir()
    (prepared / "test.npz").write_bytes(test)
    _refused(
        _release_argv(config, bare, tmp_path / "o"), capsys, "train.npz: missing", "training record"
    )
    assert not (tmp_path / "o").exists()


def test_fid_against_statistics_of_other_data_is_refused(run, fid_weights, tmp_path, capsys):
    """FID statistics of the private training split put in the reference's place, and the
    scores re-pointed to them (as a re-evaluation would): not the public test split's."""
    config, root = run
    bad = _copy(root, tmp_path / "c")
    prepared = bad.parent / "data" / config_lib.prepared_folder_of(config, "mnist")
    reference = targets.fid_reference_file(bad, "mnist")
    args = [
        "fid-stats",
        "--samples",
        str(prepared / "train.npz"),
        "--out",
        reference,
        "--num",
        "16",
        "--weights",
        str(fid_weights),
        "--device",
        "cpu",
    ]
    assert cli.main(args) == 0
    capsys.readouterr()
    for exp in DP:
        path = bad / exp / "fid_seed0.json"
        fileio.write_json(path, {**fileio.read_json(path), "b_sha256": fileio.sha256_of(reference)})
    _refused(
        _release_argv(config, bad, tmp_path / "o"),
        capsys,
        "fid_ref_mnist.npz",
        "not the statistics of the public test split",
    )
    assert not (tmp_path / "o").exists()


def test_a_hand_added_file_with_its_sidecar_is_refused(run, prepared_mnist, tmp_path, capsys):
    """Raw records copied into a DP folder with a matching ``.sha256`` sidecar (and listed
    in the run's manifest, which is then refused too): no rule writes them there."""
    config, root = run
    for name in ("train_copy.npz", "samples_seed9.npz"):
        sneaked = _copy(root, tmp_path / name)
        shutil.copy(prepared_mnist / "mnist" / "train.npz", sneaked / "dp_a" / name)
        digest = fileio.sha256_of(sneaked / "dp_a" / name)
        (sneaked / "dp_a" / f"{name}.sha256").write_text(f"{digest}  {name}\n")
        _refused(
            _release_argv(config, sneaked, tmp_path / "o"),
            capsys,
            "dp_a/",
            "no rule writes it into the DP folder",
        )
    assert not (tmp_path / "o").exists()


def test_a_score_not_computed_from_the_release_is_refused(run, tmp_path, capsys):
    """A classifier tested on the private training split, copied into the DP folder; a
    score with a key no writer writes; a score of other samples."""
    config, root = run
    bad = _copy(root, tmp_path / "private")
    prepared = bad.parent / "data" / config_lib.prepared_folder_of(config, "mnist")
    samples, test = bad / "dp_a" / "samples_seed0.npz", prepared / "train.npz"
    out = bad / "dp_a" / "acc_logreg_seed0.json"
    test_set = fileio.load_samples(test)
    records = train_and_evaluate_seeds("logreg", [fileio.load_samples(samples)], *test_set, [0])
    write_results(records, [samples], test, "mnist", [out])
    capsys.readouterr()
    _refused(
        _release_argv(config, bad, tmp_path / "o"),
        capsys,
        "acc_logreg_seed0.json",
        "not scored against the public",
    )

    extra = _copy(root, tmp_path / "extra")
    record = fileio.read_json(extra / "dp_b" / "fid_seed0.json")
    fileio.write_json(extra / "dp_b" / "fid_seed0.json", {**record, "mean_norm": 3.2})
    _refused(
        _release_argv(config, extra, tmp_path / "o"), capsys, "dp_b/fid_seed0.json", "'mean_norm'"
    )

    swapped = _copy(root, tmp_path / "swapped")
    shutil.copy(root / "dp_b" / "fid_seed0.json", swapped / "dp_a" / "fid_seed0.json")
    _refused(
        _release_argv(config, swapped, tmp_path / "o"),
        capsys,
        "dp_a/fid_seed0.json",
        "not computed from",
    )
    assert not (tmp_path / "o").exists()


def test_a_score_carrying_data_in_its_own_keys_is_refused(run, tmp_path, capsys):
    """A score file's keys are its writer's, and so must its values be: a number where the
    writer writes one, a hash that is one, small one-line values (no records, no arrays)."""
    config, root = run
    records = fileio.load_samples(root / "dp_a" / "samples_seed0.npz")[0][:3].tolist()
    carried = {
        "fid": [[0, 255, 3]] * 100,
        "a": "x" * 1000,
        "features": {"row": records},
        "num_images_a": "17, 4, 9",
        "weights_sha256": "records 17 4 9",
        "image_shape": records,
    }
    for key, value in carried.items():
        bad = _copy(root, tmp_path / key)
        record = fileio.read_json(bad / "dp_a" / "fid_seed0.json")
        fileio.write_json(bad / "dp_a" / "fid_seed0.json", {**record, key: value})
        _refused(
            _release_argv(config, bad, tmp_path / "o"),
            capsys,
            "dp_a/fid_seed0.json",
            f"its {key!r} is not a value its writer writes",
        )
    assert not (tmp_path / "o").exists()


def test_a_file_swapped_between_check_and_copy_is_refused(run, tmp_path, capsys, monkeypatch):
    config, root = run
    racy = _copy(root, tmp_path / "c")
    decide = decision.decide

    def decide_then_swap(*args, **kwargs):
        files = decide(*args, **kwargs)
        shutil.copy(racy / "nonprivate" / "np" / "generator.pt", racy / "dp_a" / "generator.pt")
        return files

    monkeypatch.setattr(decision, "decide", decide_then_swap)
    _refused(
        _release_argv(config, racy, tmp_path / "o"),
        capsys,
        "dp_a/generator.pt",
        "changed while it was released",
    )
    assert not (tmp_path / "o").exists()
    assert not list(tmp_path.glob(".o.tmp-*"))


def test_swapped_edited_or_unfinished_files_are_refused(run, tmp_path, capsys):
    config, root = run

    def refused(name, change, *words):
        bad = _copy(root, tmp_path / name)
        change(bad)
        _refused(_release_argv(config, bad, tmp_path / "o"), capsys, *words)

    def swap(bad):
        shutil.copy(bad / "nonprivate" / "np" / "generator.pt", bad / "dp_a" / "generator.pt")

    refused("gen", swap, "dp_a/generator.pt", "content_sha256")
    log = "dp_b/train_log.csv"
    refused(
        "log",
        lambda b: (b / log).write_text((b / log).read_text().replace("step,", "step ,")),
        log,
        "train_log_sha256",
    )
    refused("ws", lambda b: (b / "dp_b" / WORKSPACE).mkdir(), WORKSPACE, "not complete")
    refused("gone", lambda b: (b / "dp_b" / "samples_seed0.npz").unlink(), "missing")
    summary = "privacy_summary.json"
    refused(
        "summary",
        lambda b: (b / summary).write_text((b / summary).read_text() + " "),
        summary,
        "stale or edited",
    )
    assert not (tmp_path / "o").exists()
    # A non-private training still writing its workspace does not block the release.
    busy = _copy(root, tmp_path / "busy")
    (busy / "nonprivate" / "np" / WORKSPACE).mkdir()
    assert cli.main(_release_argv(config, busy, tmp_path / "o")) == 0


def test_sample_files_of_another_writer_or_device(run, tmp_path, capsys):
    """The same arrays in other bytes (np.savez stamps the time), or within float rounding
    of another device: the redraw is published; two grey levels off: refused."""
    config, root = run
    other = _copy(root, tmp_path / "c")
    path = other / "dp_a" / "samples_seed0.npz"
    images, labels = fileio.load_samples(path)
    images[0, 0, 0] ^= 1  # one pixel one grey level off
    np.savez(path, images=images, labels=labels)
    out = tmp_path / "o"
    # Its scores name the file they were computed from: rescore-free, rebind by hand.
    for name, key in (("fid_seed0.json", "a_sha256"), ("acc_logreg_seed0.json", "train_sha256")):
        record = fileio.read_json(other / "dp_a" / name)
        fileio.write_json(other / "dp_a" / name, {**record, key: fileio.sha256_of(path)})
    argv = _release_argv(config, other, out)
    assert cli.main(argv) == 2  # the run's manifest reports the scores before the rebinding
    assert "does not report this release" in capsys.readouterr().err
    write_manifest({**config, "data_dir": str(other.parent / "data")}, other)
    assert cli.main(argv) == 0
    assert (out / "dp_a/samples_seed0.npz").read_bytes() == (
        root / "dp_a/samples_seed0.npz"
    ).read_bytes()
    proof = {e["path"]: e["proof"] for e in fileio.read_json(out / MANIFEST)["files"]}
    assert "1 pixels of the run's file differ by one grey level" in proof["dp_a/samples_seed0.npz"]
    images[0, 0, 0] ^= 3
    np.savez(path, images=images, labels=labels)
    _refused(
        _release_argv(config, other, tmp_path / "o2"),
        capsys,
        "dp_a/samples_seed0.npz",
        "2 grey levels",
    )


def test_public_noise_seed_needs_the_flag(tmp_path, prepared_mnist, mnist, fid_weights, capsys):
    root = tmp_path / "r" / "t"
    config = make_run(root, prepared_mnist, mnist, fid_weights, reproducible=True)
    argv = _release_argv(config, root, tmp_path / "o")
    _refused(argv, capsys, "guarantee is 'none", "--accept-no-guarantee")
    assert cli.main([*argv, "--accept-no-guarantee"]) == 0
    assert (tmp_path / "o" / "dp_a" / "generator.pt").is_file()
    summary = fileio.read_json(root / "privacy_summary.json")["datasets"][0]
    assert summary["no_guarantee"] == ["dp_a", "dp_b"]
    # the person-level epsilon says so too, naming the trainings that held their records
    # (these two; the session's record store may hold other tests' public-seed trainings)
    assert {"dp_a (run t)", "dp_b (run t)"} <= set(summary["individual"]["no_guarantee"])
    (warning,) = [w for w in summary["warnings"] if w.startswith("no guarantee for a person")]
    assert "dp_a (run t)" in warning and "public" in warning
    said = capsys.readouterr()
    assert f"WARNING: {warning}" in said.out + said.err


#: Release folders that cannot hold a release: (how the folder is made, what the refusal says).
BAD_OUTS = {
    "a link to an empty folder": ("link", "symbolic link"),
    "a dangling link": ("dangling", "symbolic link"),
    "a path under a file": ("file", "not a folder"),
    "inside a DP folder": ("dp", "inside the run folder"),
    "inside the run folder": ("run", "inside the run folder"),
}


@pytest.mark.parametrize("case", list(BAD_OUTS))
def test_a_release_folder_that_cannot_hold_the_release_is_refused(run, tmp_path, capsys, case):
    """One line naming --out, and nothing written: a link would be replaced or refuse the
    rename; a publish folder inside the run is a file no rule writes there, so it would
    refuse every later release of the run."""
    config, root = run
    how, words = BAD_OUTS[case]
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    out = {
        "link": tmp_path / "link",
        "dangling": tmp_path / "dangling",
        "file": tmp_path / "afile" / "sub",
        "dp": root / "dp_a" / "pub",
        "run": root / "pub",
    }[how]
    if how == "link":
        (tmp_path / "empty").mkdir()
        out.symlink_to(tmp_path / "empty", target_is_directory=True)
    elif how == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    elif how == "file":
        out.parent.write_text("a file")
    _refused(_release_argv(config, root, out), capsys, str(out), words)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert not list(tmp_path.glob(".*.tmp-*"))
    if how == "link":
        assert not any((tmp_path / "empty").iterdir())


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
    ledgers = [fileio.read_json(root / e / "privacy.json") for e in DP]
    assert summary["dataset"] == "mnist" and summary["releases"] == 2
    assert summary["release_epsilons"] == {
        e: x["epsilon"] for e, x in zip(DP, ledgers, strict=True)
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
    # every person's records were in both releases' trainings (and in any other training on
    # MNIST that this session's record store holds)
    person = summary["individual"]
    assert {"dp_a (run t)", "dp_b (run t)"} <= set(person["worst_off_in"])
    assert person["epsilon_worst_off"] >= doubled * (1 - 1e-12)
    text = "\n".join(summary_markdown({"datasets": [summary]}))
    assert "| mnist | 2 |" in text and "**Warning:** 2 DP releases" in text
    assert json.loads(json.dumps(summary)) == summary


@pytest.mark.parametrize("name", ["config.yaml", "quick.yaml", "smoke.yaml"])
def test_the_release_rule_waits_for_exactly_the_files_the_release_decides(name, tmp_path):
    """The release_manifest rule's inputs (``targets.release_inputs``) are the files
    ``run_folders`` lets the release publish, and the summary: one rule, two readers."""
    config = config_lib.load_config([Path(__file__).parents[1] / "config" / name])
    run = tmp_path / "results"
    decided = {
        str(run / f.rel / n)
        for f in run_folders(config, run)
        for n in (
            *targets.TRAINING_FILES,
            *map(targets.sample_name, f.seeds),
            *(targets.score_name(m, s) for m in f.scores for s in f.seeds),
        )
    }
    decided.add(targets.privacy_summary_file(run))
    assert set(targets.release_inputs(config, run)) == decided
    assert any("fid_seed" in p for p in decided) and any("samples_seed" in p for p in decided)
