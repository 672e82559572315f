"""``dpsinkhorn evaluate``: one generator's whole evaluation in one process, checked against
the oracles (the seeded draws, pytorch-fid's features and statistics, a per-seed torch
loop, scikit-learn's Log-Reg), its one-line errors and its resumption.

Sizes are small (a few dozen images per seed): the properties checked do not depend on size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from oracles import (
    pytorch_fid_activations,
    pytorch_fid_statistics,
    sklearn_logreg,
    train_one_seed,
)

from dpsinkhorn import fileio
from dpsinkhorn.evaluate import classify, fid, job
from dpsinkhorn.evaluate.sample import generate, load_generator, sample_generator, sample_real
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


def test_generator_job_writes_each_seeds_draw_and_its_fid(files, tmp_path, run_cli):
    """Samples: the generator's seeded draws; FID: pytorch-fid's features and statistics
    against the reference within 1e-5 relative; the record names what it scored."""
    out = tmp_path / "job"
    argv = ["evaluate", "--generator", str(files["generator"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", "0", "3", "--num", str(NUM)]
    argv += ["--samples-dir", str(out), "--scores-dir", str(out / "scores"), "--classifiers"]
    argv += ["--timings", str(out / "timings.json"), "--weights", str(files["weights"])]
    assert run_cli([*argv, "--sqrtm", "eigh", *DEVICE]) == 0
    generator = load_generator(files["generator"], torch.device("cpu"))
    mu_ref, sigma_ref, _ = fid.load_statistics(files["reference"])
    for seed in (0, 3):
        images, labels = sample_generator(generator, NUM, seed)
        saved = out / f"samples_seed{seed}.npz"
        for a, b in zip(fileio.load_samples(saved), (images, labels), strict=True):
            np.testing.assert_array_equal(a, b)
        stats = pytorch_fid_statistics(pytorch_fid_activations(images, files["weights"]))
        oracle = fid.fid_from_stats(*stats, mu_ref, sigma_ref, method="eigh")
        record = _json(out / "scores" / f"fid_seed{seed}.json")
        assert record["fid"] == pytest.approx(oracle, rel=1e-5)
        assert set(record) <= fid.RECORD_KEYS and record["sqrtm"] == "eigh"
        assert record["a"] == str(saved) and record["a_sha256"] == fileio.sha256_of(saved)
        assert record["num_images_a"] == NUM and record["image_shape"] == [28, 28, 1]
    assert not list((out / "scores").glob("acc_*"))  # --classifiers with none: FID only
    timings = _json(out / "timings.json")["seconds"]
    assert set(timings) == {"sample", "fid", "total"} and timings["total"] > 0


def test_real_data_job_classifiers_agree_with_the_oracles(files, tmp_path, run_cli):
    """A real-data row: the seeded subsets of the training split; MLP accuracies exactly
    the per-seed loop's, Log-Reg within half a point of scikit-learn's; every cell's file
    written. FID is left out (--no-fid): the generator test checks it."""
    out = tmp_path / "job"
    num, seeds = 300, [1, 2]
    fit = ["--max-epochs", "2", "--patience", "1", "--dataset", "mnist", *DEVICE]
    argv = ["evaluate", "--real-data", str(files["train"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", *map(str, seeds)]
    argv += ["--num", str(num), "--samples-dir", str(out), "--scores-dir", str(out), "--no-fid"]
    assert run_cli([*argv, "--classifiers", "logreg", "mlp", *fit]) == 0
    test_images, test_labels = fileio.load_samples(files["test"])
    x_test = classify.to_float(test_images)
    for seed in seeds:
        images, labels = sample_real(files["train"], num, seed)
        saved = fileio.load_samples(out / f"samples_seed{seed}.npz")
        for a, b in zip(saved, (images, labels), strict=True):
            np.testing.assert_array_equal(a, b)
        assert not (out / f"fid_seed{seed}.json").exists()
        x = classify.to_float(images)
        mlp = train_one_seed(
            "mlp",
            x,
            torch.from_numpy(labels),
            x_test,
            torch.from_numpy(test_labels),
            10,
            seed,
            2,
            1,
            128,
        )
        logreg = sklearn_logreg(x.numpy(), labels, x_test.numpy(), test_labels, 5000)
        for model, oracle in (("mlp", mlp), ("logreg", logreg)):
            ours = _json(out / f"acc_{model}_seed{seed}.json")
            assert ours["seed"] == seed and ours["num_train"] == num
            assert ours["dataset"] == "mnist" and set(ours) <= classify.RECORD_KEYS
            if model == "mlp":
                assert ours["accuracy"] == oracle["accuracy"]
            else:
                assert abs(ours["accuracy"] - oracle["accuracy"]) <= 0.005


def _stop_at_mlp(monkeypatch) -> tuple[list[str], Callable]:
    """Make the evaluation job stop (KeyboardInterrupt: a deadline) when the MLP's phase
    starts; returns the list of classifiers it starts, in order, and the real trainer."""
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
        (
            ["--test", "{rgb_test}"],
            "images [H,W,C]=[28, 28, 1] differ from the test images' [32, 32, 3]",
        ),
        (["--dataset", "celeba"], "labels go up to 9, outside the 2 classes"),
        (["--reference", "{rgb_reference}"], "FID needs images of one shape [H,W,C]"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(
    change, message, files, tmp_path, run_cli, capsys
):
    from dpsinkhorn.evaluate.inception import sha256_of

    argv = ["evaluate", "--generator", str(files["generator"]), "--test", str(files["test"])]
    argv += ["--reference", str(files["reference"]), "--seed", "0", "--num", "4"]
    argv += ["--samples-dir", str(tmp_path / "out"), "--scores-dir", str(tmp_path / "out")]
    argv += ["--weights", str(files["weights"]), *DEVICE]
    rgb_test = tmp_path / "rgb_test.npz"  # a test split of 32x32 RGB images
    fileio.save_samples(rgb_test, np.zeros((4, 32, 32, 3), np.uint8), np.arange(4))
    rgb_reference = tmp_path / "rgb_reference.npz"  # statistics of 32x32 RGB images
    mu, sigma = np.zeros(2048), np.eye(2048)
    fid.save_statistics(rgb_reference, mu, sigma, 4, (32, 32, 3), sha256_of(files["weights"]))
    names = {"test": files["test"], "rgb_test": rgb_test, "rgb_reference": rgb_reference}
    argv += [c.format(**names) for c in change]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _real_data_classifiers(files, tmp_path) -> dict:
    """``EvaluationSpec`` arguments of a quick real-data job: Log-Reg and MLP, two seeds,
    no FID, files in ``tmp_path``."""
    return {
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


def test_a_stopped_job_resumes_after_its_finished_phases(files, tmp_path, monkeypatch):
    """Stopped during the MLP (as a deadline stops it; Snakemake then deletes the declared
    outputs), the rerun reuses Log-Reg's records instead of training it again; other
    settings start afresh; the progress file goes once the job completes."""
    kw = _real_data_classifiers(files, tmp_path)
    trained, real = _stop_at_mlp(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(job.EvaluationSpec(**kw))
    progress = tmp_path / job.Progress.NAME
    assert trained == ["logreg", "mlp"] and progress.is_file()
    first = _json(tmp_path / "acc_logreg_seed1.json")
    (tmp_path / "acc_logreg_seed1.json").unlink()  # as Snakemake removes a failed job's outputs

    trained.clear()
    monkeypatch.setattr(
        job, "train_and_evaluate_seeds", lambda m, *a, **k: (trained.append(m), real(m, *a, **k))[1]
    )
    job.evaluate(job.EvaluationSpec(**kw))
    assert trained == ["mlp"]  # Log-Reg came from the progress file
    assert _json(tmp_path / "acc_logreg_seed1.json") == first
    assert not progress.exists()

    trained.clear()
    job.evaluate(job.EvaluationSpec(**{**kw, "num": 150}))  # another key: nothing reused
    assert trained == ["logreg", "mlp"]


def test_phases_resume_only_from_the_same_code_and_name_their_commit(files, tmp_path, monkeypatch):
    """A phase saved by other evaluation code (that of another commit) is computed again;
    a resumed phase keeps the commit that computed it, and evaluate_phases.json says, per
    phase, which commit and code did."""
    from dpsinkhorn.config.targets import EVALUATION_PHASES

    kw = _real_data_classifiers(files, tmp_path)
    real, trained, deadline = job.train_and_evaluate_seeds, [], [True]

    def train(model, *args, **kwargs):
        trained.append(model)
        if model == "mlp" and deadline[0]:
            raise KeyboardInterrupt("deadline")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(job, "train_and_evaluate_seeds", train)
    monkeypatch.setenv(job.COMMIT_ENV, "c0ffee0")
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(job.EvaluationSpec(**kw))
    progress = tmp_path / job.Progress.NAME
    saved = _json(progress)

    deadline[0] = False
    monkeypatch.setenv(job.COMMIT_ENV, "beef001")
    trained.clear()
    job.evaluate(job.EvaluationSpec(**kw))
    assert trained == ["mlp"]  # Log-Reg resumed: the same code computed it
    code = job.phase_code_sha256("mlp")
    assert _json(tmp_path / EVALUATION_PHASES) == {
        "logreg": {"commit": "c0ffee0", "code_sha256": code},
        "mlp": {"commit": "beef001", "code_sha256": code},
    }

    def rerun_from(progress_json: dict) -> dict:
        fileio.write_json(progress, progress_json)
        trained.clear()
        job.evaluate(job.EvaluationSpec(**kw))
        return {p: e["commit"] for p, e in _json(tmp_path / EVALUATION_PHASES).items()}

    # the classifiers' code as another commit had it: computed again
    monkeypatch.setattr(job, "phase_code_sha256", lambda phase: "0" * 64)
    assert rerun_from(saved) == {"logreg": "beef001", "mlp": "beef001"}
    assert trained == ["logreg", "mlp"]


def test_a_phase_is_not_resumed_under_another_class_count(files, tmp_path, monkeypatch):
    """The class count is a setting of the key: Log-Reg saved with an own dataset's 12
    classes (its dataset.json beside the test split) is trained again when the rerun's
    class count is the labels' 10 (no --dataset), so no file reports another class count."""
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
        job.evaluate(job.EvaluationSpec(**kw, dataset="own"))
    assert _json(tmp_path / "acc_logreg_seed0.json")["num_classes"] == 12

    trained.clear()
    monkeypatch.setattr(
        job, "train_and_evaluate_seeds", lambda m, *a, **k: (trained.append(m), real(m, *a, **k))[1]
    )
    job.evaluate(job.EvaluationSpec(**kw))  # no dataset: the labels' 10 classes
    assert trained == ["logreg", "mlp"]
    for model in ("logreg", "mlp"):
        assert _json(tmp_path / f"acc_{model}_seed0.json")["num_classes"] == 10


def test_a_phase_of_other_samples_is_computed_again(files, tmp_path, monkeypatch):
    """Samples drawn by other code (a generator architecture in ``models`` changed by
    another commit: the same generator.pt, other images) are scored again: a resumed FID
    would be of images no longer on disk. Its record names the samples it scored."""
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
    real_train, real_sample, trained = job.train_and_evaluate_seeds, job.generate, []

    def stop_at_logreg(model, *args, **kwargs):
        raise KeyboardInterrupt("deadline")

    monkeypatch.setattr(job, "train_and_evaluate_seeds", stop_at_logreg)
    with pytest.raises(KeyboardInterrupt):
        job.evaluate(job.EvaluationSpec(**kw))
    first = _json(tmp_path / "fid_seed0.json")

    def other_code(model, num, seed):  # what another commit's generator code draws
        images, labels = real_sample(model, num, seed)
        return 255 - images, labels

    monkeypatch.setattr(job, "generate", other_code)
    monkeypatch.setattr(
        job,
        "train_and_evaluate_seeds",
        lambda m, *a, **k: (trained.append(m), real_train(m, *a, **k))[1],
    )
    job.evaluate(job.EvaluationSpec(**kw))
    record = _json(tmp_path / "fid_seed0.json")
    assert record["a_sha256"] == fileio.sha256_of(tmp_path / "samples_seed0.npz")
    assert record["fid"] != first["fid"] and trained == ["logreg"]


def test_the_spec_takes_every_fid_precision_and_names_an_unknown_one(tmp_path):
    """``fid_precision``: fp32, tf32, bf16 and fp16 (:data:`inception.FID_PRECISIONS`)."""
    kw = {"seeds": [0], "num": 4, "test": "t.npz", "reference": "r.npz", "real_data": "d.npz"}
    kw |= {"samples_dir": tmp_path, "scores_dir": tmp_path}
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        assert job.EvaluationSpec(**kw, fid_precision=precision).fid_precision == precision
    with pytest.raises(ValueError, match="unknown FID precision 'fp8'"):
        job.EvaluationSpec(**kw, fid_precision="fp8")


def test_generated_images_stay_on_the_device_and_round_as_from_unit_range(files):
    """``generate`` keeps the images where the generator is; its pixels are those of
    ``data.from_unit_range`` of the generator's output (the host path), batch by batch; a
    generator whose output is not finite is refused."""
    from dpsinkhorn.data.datasets import from_unit_range
    from dpsinkhorn.evaluate.sample import balanced_labels

    model = load_generator(files["generator"], torch.device("cpu"))
    images, labels = generate(model, 7, 5, batch_size=3)
    assert images.dtype == torch.uint8 and images.shape == (7, 28, 28)
    np.testing.assert_array_equal(labels, balanced_labels(7, 10, np.random.default_rng(5)))
    gen, chunks = torch.Generator().manual_seed(5), []
    with torch.no_grad():
        for start in range(0, 7, 3):
            y = torch.from_numpy(labels[start : start + 3])
            chunks.append(
                from_unit_range(
                    model(torch.rand(len(y), model.config.latent_dim, generator=gen), y)
                )
            )
    np.testing.assert_array_equal(images.numpy(), np.concatenate(chunks))
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN or infinite"):
        generate(model, 4, 0)


def test_run_phases_keeps_the_order_and_raises_after_every_phase(tmp_path):
    """Phases run one after the other or each in a thread of its own (on CUDA each on a
    stream of its own); either way the results come in order, and a failing phase raises
    only after the others have ended."""
    ended = []

    def slow() -> dict:
        time.sleep(0.2)
        ended.append("slow")
        return {"slow": 1.0}

    def fail() -> dict:
        raise RuntimeError("phase failed")

    cpu = torch.device("cpu")
    for concurrent in (False, True):
        assert job.run_phases([slow, lambda: {"b": 2.0}], concurrent, cpu) == [
            {"slow": 1.0},
            {"b": 2.0},
        ]
    ended.clear()
    with pytest.raises(RuntimeError, match="phase failed"):
        job.run_phases([fail, slow], True, cpu)
    assert ended == ["slow"]


def test_fid_beside_the_classifiers_writes_the_sequential_records(files, tmp_path, monkeypatch):
    """The CPU scores one phase after the other; run concurrently (as on CUDA, here in
    threads) FID and the classifiers write the same records and record both phases."""
    kw = {
        "seeds": [0, 1],
        "num": NUM,
        "test": files["test"],
        "reference": files["reference"],
        "generator": files["generator"],
        "classifiers": ["mlp"],
        "dataset": "mnist",
        "weights": files["weights"],
        "device": "cpu",
        "sqrtm": "eigh",
        "max_epochs": 2,
        "patience": 1,
    }
    real, schedules = job.run_phases, []

    def forced(phases, concurrent, device):
        schedules.append(concurrent)
        return real(phases, len(schedules) > 1, device)

    monkeypatch.setattr(job, "run_phases", forced)
    for name in ("sequential", "concurrent"):
        job.evaluate(
            job.EvaluationSpec(**kw, samples_dir=tmp_path / name, scores_dir=tmp_path / name)
        )
    assert schedules == [False, False]  # the CPU's own choice both times
    phases = [_json(tmp_path / n / "evaluate_phases.json") for n in ("sequential", "concurrent")]
    assert set(phases[0]) == {"fid", "mlp"} and phases[0] == phases[1]
    for cell in ("fid_seed0", "fid_seed1", "acc_mlp_seed0", "acc_mlp_seed1"):
        a, b = (_json(tmp_path / n / f"{cell}.json") for n in ("sequential", "concurrent"))
        for record in (a, b):
            for key in ("seconds", "a", "train"):
                record.pop(key, None)
        assert a == b, cell
