"""What a run releases depends on the private data only through the mechanism.

Each test here checks one way private data could leak or a run could break: the loss in
train_log.csv or the progress bar, checkpoints beside generator.pt, noise seeded from the
public config seed (runs with one seed would share their noise), the class count taken
from the private labels, a resume on other data, and a Poisson buffer overflow blocking
the run.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.noise import (
    NO_GUARANTEE_PUBLIC_SEED,
    keyed_generator,
    rng_state_bytes,
    rng_state_tensor,
)
from dpsinkhorn.privacy.sampler import OVERFLOW_TAIL, PoissonSampler
from dpsinkhorn.train.release import LOG_COLUMNS, privacy_record
from dpsinkhorn.train.run import train
from dpsinkhorn.train.runlock import LOCK_NAME
from dpsinkhorn.train.signals import Preempted
from dpsinkhorn.train.sweep import SweepTrainer
from dpsinkhorn.train.trainer import Trainer
from dpsinkhorn.train.workspace import WORKSPACE

CPU = torch.device("cpu")
RELEASE = {"generator.pt", "privacy.json", "train_log.csv"}


def _folder(path) -> set[str]:
    """Names in an output folder, less the output lock (runlock), which must be empty once
    the run has released it: it names a holder only while one runs."""
    lock = path / LOCK_NAME
    assert lock.read_text() == ""
    return {p.name for p in path.iterdir()} - {LOCK_NAME}


TINY = {"channels": [16, 8, 4], "steps": 6, "checkpoint_every": 2, "log_every": 2}


def spec(name: str = "e", **overrides) -> dict:
    """A tiny private MNIST experiment (σ = 1.5, B = 50); secret noise unless overridden."""
    return config_lib.make_experiment(name, **{**TINY, "sigma": 1.5, **overrides})


@pytest.fixture(scope="module")
def mnist(prepared_data):
    return data.load_split(prepared_data, "mnist", "train")


def _generator(path):
    return torch.load(path / "generator.pt", weights_only=False)["state_dict"]


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_release_folder_holds_no_private_loss(tmp_path, mnist, capfd):
    record = train(spec(), tmp_path / "run", train_data=mnist, progress=True)
    _, progress = capfd.readouterr()
    assert "eps=" in progress and "loss" not in progress  # the tqdm bar: ε only
    assert _folder(tmp_path / "run") == RELEASE  # no workspace left
    with open(tmp_path / "run" / "train_log.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == LOG_COLUMNS == ["step", "epsilon", "steps_per_s", "elapsed_s"]
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    assert record["steps"] == 6

    # The private loss exists only behind log_private_loss, in the workspace (kept).
    train(spec(log_private_loss=True), tmp_path / "logged", train_data=mnist, progress=False)
    assert _folder(tmp_path / "logged") == RELEASE | {WORKSPACE}
    workspace = tmp_path / "logged" / WORKSPACE
    assert "DO NOT SHARE" in (workspace / "README.txt").read_text()
    with open(workspace / "private_loss.csv") as fh:
        private = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in private] == [2, 4, 6]
    assert all(np.isfinite(float(r["loss"])) for r in private)
    assert "loss" not in (tmp_path / "logged" / "train_log.csv").read_text()


def test_noise_key_is_secret_and_reproducible_mode_says_so(tmp_path, mnist):
    a = train(spec(), tmp_path / "a", train_data=mnist, progress=False)
    b = train(spec(), tmp_path / "b", train_data=mnist, progress=False)
    # Same config, same data, same seed: different noise, so different generators.
    assert not _same(_generator(tmp_path / "a"), _generator(tmp_path / "b"))
    for record in (a, b):
        assert record["guarantee"].startswith("(epsilon, delta)-DP")
        assert record["reproducible"] is False
    on_disk = json.loads((tmp_path / "a" / "privacy.json").read_text())
    assert on_disk["guarantee"].startswith("(epsilon, delta)-DP")

    c = train(spec(reproducible=True), tmp_path / "c", train_data=mnist, progress=False)
    d = train(spec(reproducible=True), tmp_path / "d", train_data=mnist, progress=False)
    assert _same(_generator(tmp_path / "c"), _generator(tmp_path / "d"))
    # train_log_sha256 hashes a log with wall-clock times: the rest is bit-identical
    c.pop("train_log_sha256"), d.pop("train_log_sha256")
    assert c == d and c["guarantee"] == NO_GUARANTEE_PUBLIC_SEED == "none: the noise seed is public"


def _noise(trainer: Trainer) -> torch.Tensor:
    """The next noise draw of the trainer's mechanism: its sanitiser on a zero gradient."""
    rows = trainer.n + trainer.n_prime
    return trainer.sanitizer(torch.zeros(rows, 1, 28, 28))[: trainer.n]


def test_no_two_runs_or_sweep_members_share_noise(mnist):
    # Two runs of one config (secret keys).
    first, second = Trainer(spec(), *mnist, CPU), Trainer(spec(), *mnist, CPU)
    assert not torch.equal(_noise(first), _noise(second))
    # Two experiments of one config with the same seed and q (as mnist_dpsinkhorn and
    # mnist_dpsinkhorn_eps10), even in reproducible mode: the key includes the name.
    paper = Trainer(spec("paper", reproducible=True), *mnist, CPU)
    eps10 = Trainer(spec("eps10", reproducible=True, sigma=0.551), *mnist, CPU)
    assert paper.q == eps10.q
    noise_paper, noise_eps10 = _noise(paper) / paper.sanitizer.noise_std, _noise(eps10)
    assert not torch.allclose(noise_paper * eps10.sanitizer.noise_std, noise_eps10)
    assert not torch.equal(
        torch.rand(100, generator=paper.rng), torch.rand(100, generator=eps10.rng)
    )  # nor Poisson draws
    # Sweep members, identical but for the name, secret and reproducible.
    for reproducible in (False, True):
        specs = [spec(name, reproducible=reproducible) for name in ("x", "y", "z")]
        sweep = SweepTrainer(specs, *mnist, CPU)
        draws = [_noise(t) for t in sweep.trainers]
        for i in range(3):
            for j in range(i):
                assert not torch.equal(draws[i], draws[j])


def test_secret_key_resumes_bit_identically_from_the_checkpoint(mnist):
    trainer = Trainer(spec(), *mnist, CPU)
    for _ in range(2):
        trainer.step()
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    for _ in range(3):
        trainer.step()
    buffer.seek(0)
    resumed = Trainer(spec(), *mnist, CPU)  # a fresh secret key, replaced by the checkpoint's
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    for _ in range(3):
        resumed.step()
    for a, b in zip(trainer.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("map_location", ["meta", lambda storage, where: storage])
def test_rng_state_reaches_set_state_as_a_cpu_byte_tensor(tmp_path, mnist, map_location):
    """Resume on CUDA: loaded with map_location=device, an RNG ByteTensor would move to the
    GPU and make Generator.set_state raise. The state is stored as bytes, which no
    map_location moves."""
    s = spec(reproducible=True, keep_private_workspace=True)
    with pytest.raises(Preempted):
        train(s, tmp_path / "run", train_data=mnist, stop_after=3, progress=False)
    path = tmp_path / "run" / WORKSPACE / "checkpoint.pt"
    on_cpu = torch.load(path, map_location="cpu", weights_only=False)
    mapped = torch.load(path, map_location=map_location, weights_only=False)
    assert isinstance(mapped["rng"], bytes)
    state = rng_state_tensor(mapped["rng"])
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    assert torch.equal(state, rng_state_tensor(on_cpu["rng"]))
    # the trainer takes the mapped RNG state with the rest of the state from the CPU
    trainer = Trainer(s, *mnist, CPU)
    trainer.load_state_dict({**on_cpu, "rng": mapped["rng"]})
    assert rng_state_bytes(trainer.rng) == on_cpu["rng"]
    with pytest.raises(ValueError, match="must be bytes"):
        rng_state_tensor(keyed_generator(b"k" * 32).get_state())


def test_resume_on_other_data_is_refused(tmp_path, mnist, capsys):
    images, labels = mnist
    neighbour = (images.copy(), labels)
    neighbour[0][0] = 255 - neighbour[0][0]  # one record replaced
    s = spec(reproducible=True, keep_private_workspace=True)
    with pytest.raises(Preempted):
        train(s, tmp_path / "run", train_data=mnist, stop_after=4, progress=False)
    capsys.readouterr()
    record = train(s, tmp_path / "run", train_data=neighbour, progress=False)
    # said in the workspace only: job logs are released
    assert "other training data" not in capsys.readouterr().out
    note = tmp_path / "run" / WORKSPACE / "ignored_checkpoint.txt"
    assert "other training data" in note.read_text()
    fresh = train(s, tmp_path / "fresh", train_data=neighbour, progress=False)
    timed = "train_log_sha256"  # hashes a log with wall-clock times
    assert {**record, timed: None} == {**fresh, timed: None} and record["steps"] == 6
    assert _same(_generator(tmp_path / "run"), _generator(tmp_path / "fresh"))


def test_class_count_comes_from_the_dataset_not_the_labels(mnist):
    images, labels = mnist
    keep = labels < 9  # no record of class 9
    trainer = Trainer(spec(), images[keep], labels[keep], CPU)
    assert trainer.num_classes == trainer.model_config.num_classes == 10


def test_poisson_uniforms_are_float64():
    sampler = PoissonSampler(60000, 1 / 1200, CPU)
    generator = torch.Generator().manual_seed(3)
    replay = torch.Generator().manual_seed(3)
    indices, weights = sampler.sample(generator)
    u = torch.rand(60000, generator=replay, dtype=torch.float64)
    chosen = torch.nonzero(u < 1 / 1200).flatten()
    assert sorted(indices[weights > 0].tolist()) == chosen.tolist()


def test_buffer_overflow_is_handled_and_charged_to_delta(tmp_path, mnist):
    s = spec(reproducible=True)
    trainer = Trainer(s, *mnist, CPU)
    default = privacy_record(trainer)
    # Capacity: the smallest buffer whose overflow probability (larger neighbour, N + 1
    # records) is at most OVERFLOW_TAIL (binom.isf is imprecise there; we search).
    cap = trainer.sampler.capacity
    p_default = binom.sf(cap, 60001, 50 / 60000)
    assert p_default <= OVERFLOW_TAIL < binom.sf(cap - 1, 60001, 50 / 60000)
    assert 0 < default["poisson_overflow_probability_per_step"] == pytest.approx(p_default)
    trainer.sampler.capacity = 30  # B = 50: nearly every step overflows
    for _ in range(4):
        assert np.isfinite(float(trainer.step()))  # never blocks
    assert int(trainer.sampler.overflows) >= 3
    record = privacy_record(trainer)
    p = binom.sf(30, 60001, 50 / 60000)
    assert record["poisson_overflow_probability_per_step"] == pytest.approx(p)
    # Coupling bound: (ε, δ + (1 + e^ε)·T·p)-DP.
    charge = (1 + math.exp(record["epsilon"])) * 4 * p
    assert record["delta_poisson_overflow"] == pytest.approx(charge)
    assert record["delta_total"] == pytest.approx(1e-5 + charge)
    # A run is never blocked by an overflow, and its rerun completes too.
    state = copy.deepcopy(trainer.state_dict())
    again = Trainer(s, *mnist, CPU)
    again.sampler.capacity = 30
    again.load_state_dict(state)
    again.step()
    assert again.step_count == 5
