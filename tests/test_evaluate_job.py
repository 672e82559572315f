"""``dpsinkhorn evaluate``: one generator's whole evaluation in one process gives what the
per-step commands (sample, sample-real, fid, classify) give for the same inputs.

Sizes are small (a few dozen images per seed) because the properties checked do not
depend on size: the samples come from the same seeded streams, the FID from the same
Inception features and formula (equal to float precision), and each classifier sees the
same training sets (MLP: exactly the sequential result; Log-Reg: the same optimum).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsinkhorn import fileio
from dpsinkhorn.models import GeneratorConfig, build_generator

DEVICE = ["--device", "cpu"]
NUM = 12  # images per seed (Inception on a 2-core CPU: ~6 images/s)


@pytest.fixture(scope="module")
def files(tmp_path_factory, prepared_mnist, fid_weights):
    """A small random conditional MNIST generator, the prepared MNIST splits and FID
    reference statistics of 16 real test images."""
    from dpsinkhorn.evaluate.fid import save_statistics, statistics

    root = tmp_path_factory.mktemp("evaluate")
    torch.manual_seed(0)
    config = GeneratorConfig(channels=(16, 8, 4))
    model = build_generator(config)
    gen = root / "generator.pt"
    payload = {"state_dict": model.state_dict(), "model_config": config.to_dict()}
    torch.save({**payload, "dataset": "mnist"}, gen)
    test = prepared_mnist / "mnist" / "test.npz"
    images, _ = fileio.load_samples(test)
    mu, sigma = statistics(images[:16], fid_weights, "cpu")
    ref = root / "fid_ref.npz"
    from dpsinkhorn.evaluate.inception import sha256_of

    save_statistics(ref, mu, sigma, 16, (28, 28, 1), sha256_of(fid_weights))
    return {
        "generator": gen,
        "test": test,
        "train": prepared_mnist / "mnist" / "train.npz",
        "reference": ref,
        "weights": fid_weights,
    }


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_generator_job_equals_the_per_step_path(files, tmp_path, run_cli):
    """Samples byte-equal in content and FID equal to float precision (same features)."""
    job = tmp_path / "job"
    common = ["--weights", str(files["weights"]), "--sqrtm", "eigh", *DEVICE]
    argv = ["evaluate", "--generator", str(files["generator"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", "0", "3", "--num", str(NUM)]
    argv += ["--samples-dir", str(job), "--scores-dir", str(job / "scores"), "--classifiers"]
    argv += ["--timings", str(job / "timings.json"), *common]
    assert run_cli(argv) == 0
    for seed in (0, 3):
        step = tmp_path / f"samples_seed{seed}.npz"
        gen = ["sample", "--generator", str(files["generator"]), "--num", str(NUM)]
        assert run_cli([*gen, "--seed", str(seed), "--out", str(step), *DEVICE]) == 0
        for a, b in zip(
            fileio.load_samples(step), fileio.load_samples(job / step.name), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        fid = tmp_path / f"fid_seed{seed}.json"
        assert (
            run_cli(
                [
                    "fid",
                    "--a",
                    str(step),
                    "--b",
                    str(files["reference"]),
                    "--out",
                    str(fid),
                    *common,
                ]
            )
            == 0
        )
        ours, theirs = _json(job / "scores" / fid.name), _json(fid)
        assert ours["fid"] == pytest.approx(theirs["fid"], rel=1e-9, abs=1e-9)
        assert {k: v for k, v in ours.items() if k not in ("fid", "a")} == {
            k: v for k, v in theirs.items() if k not in ("fid", "a")
        }
        assert ours["a"] == str(job / step.name) and ours["num_images_a"] == NUM
    assert not list((job / "scores").glob("acc_*"))  # --classifiers with none: FID only
    timings = _json(job / "timings.json")["seconds"]
    assert set(timings) == {"sample", "fid", "total"} and timings["total"] > 0


def test_real_data_job_classifiers_equal_the_per_step_path(files, tmp_path, run_cli):
    """A real-data row: seeded subsets as sample-real draws them; MLP accuracies exactly
    the per-seed `classify` results (batched MLP = sequential), Log-Reg within half a
    point of scikit-learn's (same optimum); every cell's file written. FID is left out
    (--no-fid): the generator test checks it, and Inception on 600 images costs minutes
    on this CPU."""
    job = tmp_path / "job"
    num, seeds = 300, ["1", "2"]
    fit = ["--max-epochs", "2", "--patience", "1", "--dataset", "mnist", *DEVICE]
    argv = ["evaluate", "--real-data", str(files["train"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", *seeds, "--num", str(num)]
    argv += ["--samples-dir", str(job), "--scores-dir", str(job), "--no-fid"]
    argv += ["--classifiers", "logreg", "mlp", *fit]
    assert run_cli(argv) == 0
    steps = []
    for seed in seeds:
        step = tmp_path / f"samples_seed{seed}.npz"
        real = ["sample-real", "--data", str(files["train"]), "--num", str(num), "--seed", seed]
        assert run_cli([*real, "--out", str(step)]) == 0
        for a, b in zip(
            fileio.load_samples(step), fileio.load_samples(job / step.name), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        steps.append(step)
        assert not (job / f"fid_seed{seed}.json").exists()
    for model in ("logreg", "mlp"):
        outs = [tmp_path / f"acc_{model}_seed{s}.json" for s in seeds]
        argv = ["classify", "--model", model, "--train", *map(str, steps), "--test"]
        argv += [str(files["test"]), "--seed", *seeds, "--out", *map(str, outs), *fit]
        assert run_cli(argv) == 0
        for seed, out in zip(seeds, outs, strict=True):
            ours, theirs = _json(job / out.name), _json(out)
            assert ours["seed"] == theirs["seed"] == int(seed)
            assert ours["num_train"] == num and ours["dataset"] == "mnist"
            if model == "mlp":
                assert ours["accuracy"] == theirs["accuracy"]
            else:
                assert abs(ours["accuracy"] - theirs["accuracy"]) <= 0.005


def _stop_at_mlp(monkeypatch) -> tuple[list[str], Callable]:
    """Make the evaluation job stop (KeyboardInterrupt: a deadline) when the MLP's phase
    starts; returns the list of classifiers it starts, in order, and the real trainer."""
    from dpsinkhorn.evaluate import job

    real, trained = job.train_and_evaluate_seeds, []

    def stop_at_mlp(model, *args, **kwargs):
        trained.append(model)
        if model == "mlp":
            raise KeyboardInterrupt("deadline")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(job, "train_and_evaluate_seeds", stop_at_mlp)
    return trained, real


@pytest.mark.parametrize(
    "change, message",
    [
        (["--classifiers", "svm"], "unknown classifier 'svm'"),
        (["--seed", "1", "1"], "distinct seeds"),
        (["--test", "missing.npz"], "missing.npz: file not found"),
        (["--num", "1"], "--num must be at least 2"),
        # refused before the samples and FID, not by the classifier after them
        (["--patience", "0"], "--patience must be at least 1, got 0"),
        (["--max-epochs", "0"], "--max-epochs must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--fid-batch-size", "0"], "--fid-batch-size must be at least 1"),
        (["--dataset", "mnsit"], "dataset.json: not found"),
        (["--reference", "{test}"], "not an FID statistics file"),
        # what the classifiers refuse, before the samples are written and scored
        (["--test", "{rgb_test}"], "test images [H,W,C]=[32, 32, 3] differ from the samples'"),
        (["--dataset", "celeba"], "labels go up to 9, outside the 2 classes"),
        (["--reference", "{rgb_reference}"], "FID needs images of one shape [H,W,C]"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(
    change, message, files, tmp_path, run_cli, capsys
):
    from dpsinkhorn.evaluate.fid import save_statistics
    from dpsinkhorn.evaluate.inception import sha256_of

    argv = ["evaluate", "--generator", str(files["generator"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", "0", "--num", "4"]
    argv += ["--samples-dir", str(tmp_path / "out"), "--scores-dir", str(tmp_path / "out")]
    argv += ["--weights", str(files["weights"]), *DEVICE]
    rgb_test = tmp_path / "rgb_test.npz"  # a test split of 32x32 RGB images
    fileio.save_samples(rgb_test, np.zeros((4, 32, 32, 3), np.uint8), np.arange(4))
    rgb_reference = tmp_path / "rgb_reference.npz"  # statistics of 32x32 RGB images
    mu, sigma = np.zeros(2048), np.eye(2048)
    save_statistics(rgb_reference, mu, sigma, 4, (32, 32, 3), sha256_of(files["weights"]))
    names = {"test": files["test"], "rgb_test": rgb_test, "rgb_reference": rgb_reference}
    argv += [c.format(**names) for c in change]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_stopped_job_resumes_after_its_finished_phases(files, tmp_path, monkeypatch):
    """Stopped during the MLP (as a deadline stops it; Snakemake then deletes the declared
    outputs), the rerun reuses Log-Reg's records instead of training it again; other
    settings start afresh; the progress file goes once the job completes."""
    from dpsinkhorn.evaluate import job

    kw = {
        "seeds": [0, 1],
        "num": 200,
        "test": files["test"],
        "reference": files["reference"],
        "samples_dir": tmp_path,
        "scores_dir": tmp_path,
        "real_data": files["train"],
        "classifiers": ["logreg", "mlp"],
        "dataset": "mnist",
        "device": "cpu",
        "max_epochs": 1,
        "patience": 1,
        "fid": False,
    }
    trained, real = _stop_at_mlp(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(**kw)
    progress = tmp_path / job.Progress.NAME
    assert trained == ["logreg", "mlp"] and progress.is_file()
    first = _json(tmp_path / "acc_logreg_seed1.json")
    (tmp_path / "acc_logreg_seed1.json").unlink()  # as Snakemake removes a failed job's outputs

    trained.clear()
    monkeypatch.setattr(
        job, "train_and_evaluate_seeds", lambda m, *a, **k: (trained.append(m), real(m, *a, **k))[1]
    )
    job.evaluate(**kw)
    assert trained == ["mlp"]  # Log-Reg came from the progress file
    assert _json(tmp_path / "acc_logreg_seed1.json") == first
    assert not progress.exists()

    trained.clear()
    job.evaluate(**{**kw, "num": 150})  # another key: nothing reused
    assert trained == ["logreg", "mlp"]


def test_phases_resume_only_from_the_same_code_and_name_their_commit(files, tmp_path, monkeypatch):
    """A phase saved by other evaluation code (an archive of an older commit, the progress
    file of an older format) is computed again; a resumed phase keeps the commit that
    computed it, and evaluate_phases.json says, per phase, which commit and code did."""
    from dpsinkhorn.config.targets import EVALUATION_PHASES
    from dpsinkhorn.evaluate import job, phases

    kw = {
        "seeds": [0, 1],
        "num": 200,
        "test": files["test"],
        "reference": files["reference"],
        "samples_dir": tmp_path,
        "scores_dir": tmp_path,
        "real_data": files["train"],
        "classifiers": ["logreg", "mlp"],
        "dataset": "mnist",
        "device": "cpu",
        "max_epochs": 1,
        "patience": 1,
        "fid": False,
    }
    real, trained, deadline = job.train_and_evaluate_seeds, [], [True]

    def train(model, *args, **kwargs):
        trained.append(model)
        if model == "mlp" and deadline[0]:
            raise KeyboardInterrupt("deadline")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(job, "train_and_evaluate_seeds", train)
    monkeypatch.setenv(job.COMMIT_ENV, "c0ffee0")
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(**kw)
    progress = tmp_path / job.Progress.NAME
    saved = _json(progress)

    deadline[0] = False
    monkeypatch.setenv(job.COMMIT_ENV, "beef001")
    trained.clear()
    job.evaluate(**kw)
    assert trained == ["mlp"]  # Log-Reg resumed: the same code computed it
    code = job.phase_code_sha256("mlp")
    assert _json(tmp_path / EVALUATION_PHASES) == {
        "logreg": {"commit": "c0ffee0", "code_sha256": code},
        "mlp": {"commit": "beef001", "code_sha256": code},
    }

    def rerun_from(progress_json: dict) -> dict:
        fileio.write_json(progress, progress_json)
        trained.clear()
        job.evaluate(**kw)
        return {p: e["commit"] for p, e in _json(tmp_path / EVALUATION_PHASES).items()}

    # the progress file's older format (records without their code): computed again
    old_format = {"key": saved["key"], "done": {"logreg": saved["done"]["logreg"]["records"]}}
    assert rerun_from(old_format) == {"logreg": "beef001", "mlp": "beef001"}
    assert trained == ["logreg", "mlp"]
    # the classifiers' code as another commit had it: computed again
    monkeypatch.setattr(phases, "phase_code_sha256", lambda phase: "0" * 64)
    assert rerun_from(saved) == {"logreg": "beef001", "mlp": "beef001"}
    assert trained == ["logreg", "mlp"]


def test_a_phase_is_not_resumed_under_another_class_count(files, tmp_path, monkeypatch):
    """The class count is a setting of the key: Log-Reg saved with an own dataset's 12
    classes (its dataset.json beside the test split) is trained again when the rerun's
    class count is the labels' 10 (no --dataset), so no file reports another class count."""
    from dpsinkhorn.evaluate import job

    own = tmp_path / "own"
    own.mkdir()
    (own / "test.npz").write_bytes(Path(files["test"]).read_bytes())
    record = {
        "name": "own",
        "image_size": 28,
        "channels": 1,
        "title": "own",
        "layout": "x",
        "path": "x",
        "resize": None,
        "classes": [f"c{k}" for k in range(12)],
    }
    fileio.write_json(own / "dataset.json", record)
    kw = {
        "seeds": [0],
        "num": 100,
        "test": own / "test.npz",
        "reference": files["reference"],
        "samples_dir": tmp_path,
        "scores_dir": tmp_path,
        "real_data": files["train"],
        "classifiers": ["logreg", "mlp"],
        "device": "cpu",
        "max_epochs": 1,
        "patience": 1,
        "max_iter": 20,
        "fid": False,
    }
    trained, real = _stop_at_mlp(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(**kw, dataset="own")
    assert _json(tmp_path / "acc_logreg_seed0.json")["num_classes"] == 12

    trained.clear()
    monkeypatch.setattr(
        job, "train_and_evaluate_seeds", lambda m, *a, **k: (trained.append(m), real(m, *a, **k))[1]
    )
    job.evaluate(**kw)  # no dataset: the labels' 10 classes
    assert trained == ["logreg", "mlp"]
    for model in ("logreg", "mlp"):
        assert _json(tmp_path / f"acc_{model}_seed0.json")["num_classes"] == 10


def test_a_phase_of_other_samples_is_computed_again(files, tmp_path, monkeypatch):
    """Samples drawn by other code (a generator architecture in ``models`` changed by
    another commit: the same generator.pt, other images) are scored again: a resumed FID
    would be of images no longer on disk. Its record names the samples it scored."""
    from dpsinkhorn.evaluate import job

    kw = {
        "seeds": [0],
        "num": 4,
        "test": files["test"],
        "reference": files["reference"],
        "samples_dir": tmp_path,
        "scores_dir": tmp_path,
        "generator": files["generator"],
        "classifiers": ["logreg"],
        "weights": files["weights"],
        "device": "cpu",
        "sqrtm": "eigh",
        "max_iter": 20,
    }
    real_train, real_sample, trained = job.train_and_evaluate_seeds, job.sample_generator, []

    def stop_at_logreg(model, *args, **kwargs):
        raise KeyboardInterrupt("deadline")

    monkeypatch.setattr(job, "train_and_evaluate_seeds", stop_at_logreg)
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(**kw)
    first = _json(tmp_path / "fid_seed0.json")

    def other_code(model, num, seed):  # what another commit's generator code draws
        images, labels = real_sample(model, num, seed)
        return 255 - images, labels

    monkeypatch.setattr(job, "sample_generator", other_code)
    monkeypatch.setattr(
        job,
        "train_and_evaluate_seeds",
        lambda m, *a, **k: (trained.append(m), real_train(m, *a, **k))[1],
    )
    job.evaluate(**kw)
    record = _json(tmp_path / "fid_seed0.json")
    assert record["a_sha256"] == fileio.sha256_of(tmp_path / "samples_seed0.npz")
    assert record["fid"] != first["fid"] and trained == ["logreg"]
