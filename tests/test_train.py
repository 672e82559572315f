"""Training loop: fixed shapes, Poisson sampling, privacy ledger, checkpoint/resume, sampling."""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import without_log_hash

from dpsinkhorn import cli
from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.data.catalog import DATASETS
from dpsinkhorn.evaluate.sample import load_generator, sample_generator, sample_real
from dpsinkhorn.ot.loss import feature_diameter
from dpsinkhorn.privacy.accounting import compute_epsilon, paper_convention_epsilon
from dpsinkhorn.privacy.mechanism import ParameterGradientSanitizer
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train.run import train
from dpsinkhorn.train.signals import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted
from dpsinkhorn.train.trainer import Trainer
from dpsinkhorn.train.workspace import WORKSPACE, WorkspaceRemovalError

# reproducible: these tests compare separate runs bit for bit (public noise key).
TINY = {
    "channels": [16, 8, 4],
    "steps": 12,
    "checkpoint_every": 4,
    "log_every": 2,
    "reproducible": True,
}


def make_config(tmp_path: Path, data_dir: Path, **experiment) -> Path:
    """A config file with one MNIST experiment ``e`` (tiny generator) written to tmp_path."""
    cfg = {
        "run_name": "test",
        "data_dir": str(data_dir),
        "device": "cpu",
        "training_defaults": dict(TINY),
        "experiments": {"e": {"dataset": "mnist", "table1_row": "paper", **experiment}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def spec_of(path: Path) -> dict:
    return config_lib.experiment(config_lib.load_config(path), "e")


@pytest.fixture(scope="module")
def mnist(prepared_data):
    return data.load_split(prepared_data, "mnist", "train")


def test_generated_batch_has_fixed_size_whatever_the_poisson_draw(tmp_path, prepared_data, mnist):
    spec = spec_of(make_config(tmp_path, prepared_data, batch_size=20, p=0.4))
    trainer = Trainer(spec, *mnist, torch.device("cpu"))
    shapes, counts = set(), []
    original = trainer.model.forward

    def recording_forward(z, labels):
        out = original(z, labels)
        shapes.add(tuple(out.shape))
        return out

    trainer.model.forward = recording_forward
    select = trainer.sampler.select  # what the step calls on the Poisson uniforms

    def recording_select(u):
        indices, weights, overflow = select(u)
        counts.append(int(weights.sum()))
        return indices, weights, overflow

    trainer.sampler.select = recording_select
    for _ in range(6):
        trainer.step()
    assert shapes == {(20 + 8, 1, 28, 28)}
    assert len(counts) == 6 and len(set(counts)) > 1  # the real batch varies, X does not


def test_poisson_sampler_is_poisson():
    sampler = PoissonSampler(1000, 0.05, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    hits, counts = np.zeros(1000), []
    for _ in range(2000):
        idx, w = sampler.sample(g)
        assert idx.shape == w.shape == (sampler.capacity,)
        assert set(w.unique().tolist()) <= {0.0, 1.0}
        hits[idx[w > 0].numpy()] += 1
        counts.append(int(w.sum()))
    assert np.mean(counts) == pytest.approx(50, rel=0.02)
    assert np.var(counts) == pytest.approx(1000 * 0.05 * 0.95, rel=0.15)
    assert hits.mean() / 2000 == pytest.approx(0.05, rel=0.02)
    assert counts.count(0) == 0 and sampler.capacity < 1000
    assert int(sampler.overflows) == 0  # no overflow


def _log_rows(path: Path) -> list[tuple]:
    with open(path) as fh:
        return [(r["step"], r["epsilon"]) for r in csv.DictReader(fh)]


def test_resume_is_bit_identical_and_counts_each_step_once(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data, keep_private_workspace=True))
    full = train(spec, tmp_path / "full", prepared_data, device="cpu", progress=False)
    with pytest.raises(Preempted):
        train(spec, tmp_path / "resumed", prepared_data, device="cpu", stop_after=5, progress=False)
    state = torch.load(tmp_path / "resumed" / WORKSPACE / "checkpoint.pt", weights_only=False)
    assert state["step"] == 5 and sum(s[2] for s in state["accountant"]["segments"]) == 5
    with pytest.raises(Preempted):  # a second interruption, this time mid-interval
        train(spec, tmp_path / "resumed", prepared_data, device="cpu", stop_after=2, progress=False)
    resumed = train(spec, tmp_path / "resumed", prepared_data, device="cpu", progress=False)

    a = torch.load(tmp_path / "full" / "generator.pt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "resumed" / "generator.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # same privacy record: steps and ε identical
    assert without_log_hash(resumed) == without_log_hash(full)
    assert full["steps"] == 12
    assert full["epsilon"] == pytest.approx(compute_epsilon(1.5, 50 / 60000, 12, 1e-5))
    assert _log_rows(tmp_path / "full" / "train_log.csv") == _log_rows(
        tmp_path / "resumed" / "train_log.csv"
    )
    # keep_private_workspace keeps the final checkpoint: a rerun (e.g. after the job was
    # killed before its outputs were accepted) trains nothing and rewrites the same outputs.
    final = tmp_path / "resumed" / WORKSPACE / "checkpoint.pt"
    assert torch.load(final, weights_only=False)["step"] == 12
    (tmp_path / "resumed" / "generator.pt").unlink()
    rerun = train(spec, tmp_path / "resumed", prepared_data, device="cpu", progress=False)
    assert without_log_hash(rerun) == without_log_hash(full)
    c = torch.load(tmp_path / "resumed" / "generator.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert _log_rows(tmp_path / "full" / "train_log.csv") == _log_rows(
        tmp_path / "resumed" / "train_log.csv"
    )


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_resume_keeps_this_process_optimizer_flags(tmp_path, prepared_data, mnist, optimizer):
    """A checkpoint from another set-up (here: no fused kernel, a device-side step count
    for CUDA graphs) resumes with this process's flags and the same arithmetic."""
    spec = spec_of(make_config(tmp_path, prepared_data, optimizer=optimizer))
    first = Trainer(spec, *mnist, torch.device("cpu"))
    first.step()
    state = copy.deepcopy(first.state_dict())  # as from a file: no tensor shared with `first`
    state["optimizer"] = {
        **state["optimizer"],
        "param_groups": [
            {**g, "fused": None, **({"capturable": True} if optimizer == "adam" else {})}
            for g in state["optimizer"]["param_groups"]
        ],
    }
    resumed = Trainer(spec, *mnist, torch.device("cpu"))
    resumed.load_state_dict(state)
    for group in resumed.optimizer.param_groups:
        assert group["fused"] is True
        assert group.get("capturable", False) is False
    first.step()
    resumed.step()
    for a, b in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_checkpoint_of_other_settings_is_not_resumed(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data))
    with pytest.raises(Preempted):
        train(spec, tmp_path / "run", prepared_data, device="cpu", stop_after=3, progress=False)
    changed = {**spec, "lr": 1e-3}
    record = train(changed, tmp_path / "run", prepared_data, device="cpu", progress=False)
    assert record["steps"] == 12


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_signal_checkpoints_and_exits_nonzero(tmp_path, prepared_data, signum):
    cfg = make_config(tmp_path, prepared_data, steps=100000, checkpoint_every=100000)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "dpsinkhorn", "train", "--config", str(cfg), "--experiment", "e"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    # The signal goes in once the progress bar counts a finished step: the loop (and its
    # signal handlers) runs, and no checkpoint exists yet (checkpoint_every is huge).
    output, stepping = bytearray(), threading.Event()

    def read() -> None:
        while chunk := os.read(proc.stdout.fileno(), 4096):
            output.extend(chunk)
            if re.search(rb"\| *[1-9][0-9]*/100000", output):
                stepping.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert stepping.wait(timeout=300), output.decode(errors="replace")
    proc.send_signal(signum)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    # SIGINT is the user's stop (exit 130, not resubmitted); the others a scheduler's.
    expected = INTERRUPTED_EXIT_CODE if signum == signal.SIGINT else PREEMPTED_EXIT_CODE
    assert proc.returncode == expected, output.decode(errors="replace")[-4000:]
    state = torch.load(out / WORKSPACE / "checkpoint.pt", weights_only=False)
    assert state["step"] > 0
    assert sum(s[2] for s in state["accountant"]["segments"]) == state["step"]
    assert not (out / "generator.pt").exists()


def blocked_signals(pid: int) -> int:
    """The signal mask of process ``pid`` (Linux: /proc/<pid>/status SigBlk), or 0."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    return int(re.search(r"SigBlk:\s*([0-9a-f]+)", status).group(1), 16)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/<pid>/status")
def test_signal_while_training_starts_is_held_until_the_first_step(tmp_path, prepared_data):
    """A scheduler's SIGTERM that comes while `dpsinkhorn train` starts (imports, data,
    the generator) does not kill it with nothing saved: it is held, then taken by the loop,
    which checkpoints after one step and exits 75 (resubmit)."""
    cfg = make_config(tmp_path, prepared_data, steps=100000, checkpoint_every=100000)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dpsinkhorn", "train", "--config", str(cfg), "--experiment", "e"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    term, deadline = 1 << (signal.SIGTERM - 1), time.monotonic() + 60
    while not blocked_signals(proc.pid) & term and time.monotonic() < deadline:
        time.sleep(0.002)  # until cli.main holds SIGTERM (before the training's imports)
    assert blocked_signals(proc.pid) & term, "dpsinkhorn train did not hold SIGTERM"
    assert not (out / WORKSPACE).exists()  # still starting: nothing written yet
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    assert "signal 15: checkpoint at step 1 in" in output, output
    state = torch.load(out / WORKSPACE / "checkpoint.pt", weights_only=False)
    assert state["step"] == 1
    assert sum(s[2] for s in state["accountant"]["segments"]) == 1


def test_train_from_target_epsilon_and_nonprivate(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data, sigma=None, target_epsilon=3.0, steps=6))
    record = train(spec, tmp_path / "dp", prepared_data, device="cpu", progress=False)
    assert record["epsilon"] <= 3.0 and record["epsilon"] == pytest.approx(3.0, rel=1e-3)
    assert record["epsilon_paper_convention"] > 0 and record["sigma"] > 0
    on_disk = json.loads((tmp_path / "dp" / "privacy.json").read_text())
    for key in (
        "mechanism",
        "clipping",
        "clip",
        "sigma",
        "noise_multiplier",
        "q",
        "batch_size",
        "steps",
        "delta",
        "epsilon",
        "epsilon_paper_convention",
        "accountant",
    ):
        assert key in on_disk

    spec = spec_of(
        make_config(tmp_path, prepared_data, method="sinkhorn", table1_row="nonprivate", steps=3)
    )
    record = train(spec, tmp_path / "np", prepared_data, device="cpu", progress=False)
    assert record["private"] is False and record["epsilon"] is None


def test_sampling_is_balanced_deterministic_and_uint8(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data, steps=2))
    train(spec, tmp_path / "g", prepared_data, device="cpu", progress=False)
    model = load_generator(tmp_path / "g" / "generator.pt", torch.device("cpu"))
    images, labels = sample_generator(model, 1003, seed=7, batch_size=400)
    assert images.shape == (1003, 28, 28) and images.dtype == np.uint8
    assert labels.dtype == np.int64
    counts = np.bincount(labels, minlength=10)
    assert counts.max() - counts.min() <= 1
    again, _ = sample_generator(model, 1003, seed=7)
    assert np.array_equal(images, again)
    other, _ = sample_generator(model, 1003, seed=8)
    assert not np.array_equal(images, other)


def test_sample_real_is_a_seeded_subset(prepared_data):
    images, labels = sample_real(prepared_data / "mnist" / "train.npz", 500, seed=1)
    assert images.shape == (500, 28, 28) and len(labels) == 500
    assert np.array_equal(images, sample_real(prepared_data / "mnist" / "train.npz", 500, 1)[0])
    with pytest.raises(ValueError, match="fewer than --num"):
        sample_real(prepared_data / "mnist" / "train.npz", 10**6, 0)


def test_python_api_on_own_arrays(tmp_path):
    """Own data: uint8 arrays in, a private generator and its privacy record out."""
    from dpsinkhorn.config import make_experiment

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(600, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 4, size=600).astype(np.int64)
    spec = make_experiment("mine", **TINY | {"sigma": None, "target_epsilon": 2.0, "steps": 3})
    record = train(spec, tmp_path / "mine", train_data=(images, labels), progress=False)
    assert record["q"] == pytest.approx(50 / 600) and record["epsilon"] <= 2.0
    model = load_generator(tmp_path / "mine" / "generator.pt", torch.device("cpu"))
    # The class count is the dataset's (MNIST: 10), never read from the private labels
    # (only 0..3 occur here): one record's label must not change the released model's shape.
    assert model.config.num_classes == 10 == DATASETS["mnist"].num_classes
    with pytest.raises(ValueError, match="train_data"):
        train(spec, tmp_path / "bad", train_data=(images.astype(np.float32), labels))
    with pytest.raises(ValueError, match="a training label is outside the 10 declared") as err:
        train(spec, tmp_path / "bad", train_data=(images, np.where(labels == 3, 77, labels)))
    assert "77" not in str(err.value)  # no private label value in the message (or the log)
    # Declared classes: their count is the generator's, not the nominal dataset's.
    train(spec, tmp_path / "four", train_data=(images, labels), classes=list("abcd"))
    four = load_generator(tmp_path / "four" / "generator.pt", torch.device("cpu"))
    assert four.config.num_classes == 4 and four.class_names == tuple("abcd")


# --- Table 2 / Tables 4-5 settings: perturbation, cost, epsilon convention ------------


def test_parameter_perturbation_resume_is_bit_identical(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data, perturbation="parameter"))
    trainer = Trainer(spec, *data.load_split(prepared_data, "mnist", "train"), torch.device("cpu"))
    assert isinstance(trainer.sanitizer, ParameterGradientSanitizer)
    images = []
    original = trainer.model.forward
    trainer.model.forward = lambda z, labels: (lambda o: (images.append(o), o)[1])(
        original(z, labels)
    )
    trainer.step()
    assert not images[0]._backward_hooks  # no image hook in parameter mode

    full = train(spec, tmp_path / "full", prepared_data, device="cpu", progress=False)
    with pytest.raises(Preempted):
        train(spec, tmp_path / "resumed", prepared_data, device="cpu", stop_after=5, progress=False)
    resumed = train(spec, tmp_path / "resumed", prepared_data, device="cpu", progress=False)
    a = torch.load(tmp_path / "full" / "generator.pt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "resumed" / "generator.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert without_log_hash(resumed) == without_log_hash(full)
    assert _log_rows(tmp_path / "full" / "train_log.csv") == _log_rows(
        tmp_path / "resumed" / "train_log.csv"
    )

    on_disk = json.loads((tmp_path / "full" / "privacy.json").read_text())
    assert on_disk == full
    assert on_disk["perturbation"] == "parameter" and "parameter gradient" in on_disk["mechanism"]
    assert on_disk["sensitivity"] == 2 * 0.5 and on_disk["noise_std"] == 2 * 0.5 * 1.5
    assert on_disk["noise_multiplier"] == 1.5 and on_disk["clipping"] == "batch"
    assert on_disk["epsilon"] == pytest.approx(compute_epsilon(1.5, 50 / 60000, 12, 1e-5))

    image = train(
        spec_of(make_config(tmp_path, prepared_data)),
        tmp_path / "image",
        prepared_data,
        device="cpu",
        progress=False,
    )
    assert image["perturbation"] == "image" and "generated images" in image["mechanism"]
    c = torch.load(tmp_path / "image" / "generator.pt", weights_only=False)["state_dict"]
    assert not all(torch.equal(a[k], c[k]) for k in a)  # a different mechanism was applied


def test_l1_cost_trains_with_the_l1_diameter(tmp_path, prepared_data):
    spec = spec_of(make_config(tmp_path, prepared_data, cost="l1", steps=4, log_every=1))
    trainer = Trainer(spec, *data.load_split(prepared_data, "mnist", "train"), torch.device("cpu"))
    assert trainer.diameter == feature_diameter(784, 15.0, "l1") == 2 * 784 + 2 * 15.0
    losses = [trainer.step().item() for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)
    record = train(spec, tmp_path / "l1", prepared_data, device="cpu", progress=False)
    rows = _log_rows(tmp_path / "l1" / "train_log.csv")
    assert len(rows) == 4
    assert record["steps"] == 4 and record["perturbation"] == "image"
    # a different cost trains a different generator from the same seed
    train(
        spec_of(make_config(tmp_path, prepared_data, cost="l2", steps=4)),
        tmp_path / "l2",
        prepared_data,
        device="cpu",
        progress=False,
    )
    a = torch.load(tmp_path / "l1" / "generator.pt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "l2" / "generator.pt", weights_only=False)["state_dict"]
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_paper_epsilon_convention_solves_steps_and_sigma(tmp_path, prepared_data):
    q, delta = 50 / 60000, 1e-5
    target = paper_convention_epsilon(q, 1.5, 5, 50, delta)  # the paper's ε after 5 steps
    spec = spec_of(
        make_config(
            tmp_path, prepared_data, steps=None, target_epsilon=target, epsilon_convention="paper"
        )
    )
    record = train(spec, tmp_path / "steps", prepared_data, device="cpu", progress=False)
    assert record["steps"] == 5 and record["sigma"] == 1.5
    assert record["epsilon_convention"] == "paper"
    assert record["epsilon"] == pytest.approx(compute_epsilon(1.5, q, 5, delta))  # sound ε
    assert record["epsilon_paper_convention"] == pytest.approx(target)
    on_disk = json.loads((tmp_path / "steps" / "privacy.json").read_text())
    assert on_disk["epsilon_convention"] == "paper" and on_disk["target_epsilon"] == target

    spec = spec_of(
        make_config(
            tmp_path,
            prepared_data,
            sigma=None,
            steps=3,
            target_epsilon=2.0,
            epsilon_convention="paper",
        )
    )
    record = train(spec, tmp_path / "sigma", prepared_data, device="cpu", progress=False)
    assert record["epsilon_paper_convention"] <= 2.0
    assert record["epsilon_paper_convention"] == pytest.approx(2.0, rel=1e-3)
    assert record["epsilon"] == pytest.approx(compute_epsilon(record["sigma"], q, 3, delta))
    assert record["epsilon"] < 2.0  # the sound ε of the same run is smaller


def test_parameter_perturbation_needs_batch_clipping(tmp_path, prepared_data):
    path = make_config(tmp_path, prepared_data, perturbation="parameter", clipping="per_sample")
    with pytest.raises(ValueError, match=r"config\.yaml: experiments\.e\.clipping: perturbation"):
        config_lib.load_config(path)
    spec = {
        **spec_of(make_config(tmp_path, prepared_data, perturbation="parameter")),
        "clipping": "per_sample",
    }
    with pytest.raises(ValueError, match="experiment e: perturbation parameter"):
        Trainer(spec, *data.load_split(prepared_data, "mnist", "train"), torch.device("cpu"))


def _refusing_rmtree(monkeypatch) -> None:
    """Make shutil.rmtree behave as on a file server that refuses (NFS ``.nfs*`` files held
    open, a permission error): it raises, or, with ``ignore_errors``, returns and leaves
    the folder where it is."""

    def refuse(path, ignore_errors=False, onerror=None, **kwargs):
        if not ignore_errors:
            raise PermissionError(13, "Permission denied", str(Path(path) / "checkpoint.pt"))

    monkeypatch.setattr(shutil, "rmtree", refuse)


def test_workspace_that_cannot_be_deleted_fails_the_run(
    tmp_path, prepared_data, capsys, monkeypatch
):
    """The workspace (generator state, secret noise-RNG state) must not stay silently in
    the release folder: `dpsinkhorn train` exits 2 with one line naming it."""
    cfg = make_config(tmp_path, prepared_data, steps=2)
    out = tmp_path / "run"
    _refusing_rmtree(monkeypatch)
    args = ["train", "--config", str(cfg), "--experiment", "e", "--out", str(out)]
    assert cli.main([*args, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(out / WORKSPACE) in err[0] and "private" in err[0]
    assert "must be deleted before" in err[0]
    assert (out / WORKSPACE / "README.txt").exists()  # it is there: the error said so

    # Through the Python API: the error type the CLI turns into exit 2, naming the folder.
    with pytest.raises(WorkspaceRemovalError, match="private workspace .*private_workspace"):
        train(spec_of(cfg), tmp_path / "api", prepared_data, device="cpu", progress=False)
    # and the lock was given back: with a working rmtree the rerun finishes and cleans up
    monkeypatch.undo()
    record = train(spec_of(cfg), tmp_path / "api", prepared_data, device="cpu", progress=False)
    assert record["steps"] == 2 and not (tmp_path / "api" / WORKSPACE).exists()


def test_train_prints_each_dp_runs_guarantee_beside_its_epsilon(tmp_path, prepared_data, capsys):
    """The last line of `dpsinkhorn train`: a public noise seed says "none: ..." beside its
    ε, a secret key its (ε, δ) sentence, as the ledger."""
    for reproducible in (True, False):
        (tmp_path / str(reproducible)).mkdir()
        cfg = make_config(tmp_path / str(reproducible), prepared_data, steps=2)
        cfg.write_text(
            cfg.read_text().replace("reproducible: true", f"reproducible: {reproducible}")
        )
        out = tmp_path / str(reproducible) / "run"
        args = ["train", "--config", str(cfg), "--experiment", "e", "--out", str(out)]
        assert cli.main([*args, "--no-progress"]) == 0
        said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        ledger = json.loads((out / "privacy.json").read_text())
        assert said["guarantee"] == ledger["guarantee"] and said["epsilon"] == ledger["epsilon"]
        assert said["guarantee"].startswith("none") == reproducible


class _WritesAFileWhenUnpickled:
    """A pickle payload: unpickling it calls open(marker, "w"), i.e. runs code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_sample_refuses_a_generator_whose_pickle_would_run_code(tmp_path, prepared_data, capsys):
    """generator.pt is read with weights_only=True: a downloaded file cannot run code."""
    spec = spec_of(make_config(tmp_path, prepared_data, steps=2))
    train(spec, tmp_path / "g", prepared_data, device="cpu", progress=False)
    real = tmp_path / "g" / "generator.pt"
    good = torch.load(real, weights_only=True)  # the real payload passes the safe loader
    marker = tmp_path / "code_ran"
    evil = tmp_path / "evil" / "generator.pt"
    evil.parent.mkdir()
    torch.save({**good, "extra": _WritesAFileWhenUnpickled(marker)}, evil)

    with pytest.raises(ValueError, match="not loaded") as err:
        load_generator(evil, torch.device("cpu"))
    assert str(evil) in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()  # the pickle's code never ran

    # a real generator still samples
    _, labels = sample_generator(load_generator(real, torch.device("cpu")), 20, 0)
    assert labels.shape == (20,)


def test_the_generators_optimiser_steps_every_parameter_in_one_fused_kernel(prepared_mnist):
    """Adam and SGD are built ``fused`` on the CPU and CUDA (one kernel for all parameter
    tensors, also in sweeps, whose runs are such trainers); the step count stays on the
    host unless the step is a CUDA graph (``capturable``)."""
    from dpsinkhorn.train.trainer import Trainer

    images, labels = data.load_split(prepared_mnist, "mnist", "train")
    for optimizer in ("adam", "sgd"):
        spec = config_lib.make_experiment("p", sigma=1.5, steps=10, optimizer=optimizer)
        trainer = Trainer(spec, images, labels, torch.device("cpu"))
        assert trainer.optimizer.defaults["fused"] is True
        assert trainer.optimizer.defaults.get("capturable", False) is False
