"""DP-MERF (``method: dpmerf``): the mechanism's norm bound and sensitivity, its ε against an
independent computation, the noise from the run's key, resume, config errors, a generator
trained on sklearn's digits, and (slow) a tiny workflow through train, evaluation, Table 1,
privacy summary and ``dpsinkhorn release``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import shared_config_overrides
from scipy.stats import norm

from dpsinkhorn.config import make_experiment
from dpsinkhorn.privacy.accounting import compute_epsilon
from dpsinkhorn.privacy.merf import (
    MerfRelease,
    embedding_sum,
    features_of,
    merf_noise_multiplier,
    random_frequencies,
)
from dpsinkhorn.privacy.noise import keyed_generator, public_noise_key

REPO = Path(__file__).resolve().parents[1]
K = 10


def _frequencies(d: int = 64, features: int = 400, bandwidth: float = 5.0) -> torch.Tensor:
    return random_frequencies(features, d, bandwidth, 0, "t", torch.device("cpu"))


def _adversarial_records(w: torch.Tensor, d: int) -> torch.Tensor:
    """Records in [0, 1]^d chosen to make ‖φ(x)‖ large: constants, extremes, random, and
    records found by gradient ascent on ‖φ(x)‖ (a σ-parametrised box constraint)."""
    gen = torch.Generator().manual_seed(1)
    fixed = [torch.zeros(d), torch.ones(d), (torch.arange(d) % 2).float()]
    fixed += [torch.rand(d, generator=gen) for _ in range(20)]
    theta = torch.randn(8, d, generator=gen, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=0.1)
    for _ in range(100):
        loss = -features_of(torch.sigmoid(theta), w).norm(dim=1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([torch.stack(fixed), torch.sigmoid(theta).detach()])


def test_sensitivity_of_the_embedding_sum_is_one():
    """max ‖S(D ∪ {r}) − S(D)‖_F over adversarial r (any label), and over every removal, is
    1: the bound Δ = 1 under add/remove-one adjacency holds and is attained."""
    d = 64
    w = _frequencies(d)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(200, d, generator=gen)
    y = torch.randint(0, K, (200,), generator=gen)
    base = embedding_sum(x, y, w, K)
    changes = []
    for r in _adversarial_records(w, d):
        for label in range(K):
            added = embedding_sum(
                torch.cat([x, r[None]]), torch.cat([y, torch.tensor([label])]), w, K
            )
            changes.append(float((added - base).norm()))
    for i in range(0, 200, 10):  # removals
        keep = torch.arange(200) != i
        changes.append(float((base - embedding_sum(x[keep], y[keep], w, K)).norm()))
    assert max(changes) <= 1 + 1e-5
    assert min(changes) >= 1 - 1e-5  # every record's embedding has norm exactly 1


def _rdp_epsilon(z: float, delta: float) -> float:
    """ε of one Gaussian mechanism (sensitivity 1, noise z) from its RDP curve α/(2z²), with
    the conversion of Canonne, Kamath and Steinke (2020), over a dense grid of orders."""
    alphas = np.concatenate([np.linspace(1.01, 20, 20000), np.linspace(20, 2000, 20000)])
    rdp = alphas / (2 * z * z)
    eps = rdp + np.log1p(-1 / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(eps.min())


def _exact_delta(epsilon: float, z: float) -> float:
    """δ(ε) of the Gaussian mechanism (Balle and Wang 2018, Theorem 8), sensitivity 1."""
    return float(
        norm.cdf(-epsilon * z + 1 / (2 * z))
        - math.exp(epsilon) * norm.cdf(-epsilon * z - 1 / (2 * z))
    )


def test_epsilon_against_an_independent_computation():
    spec = make_experiment("e", method="dpmerf", sigma=None, target_epsilon=10.0, steps=5)
    z = merf_noise_multiplier(spec)
    eps = compute_epsilon(z, 1.0, 1, 1e-5)  # the ledger: one Gaussian mechanism, q = 1
    assert eps <= 10.0 and eps == pytest.approx(10.0, rel=1e-3)
    assert eps == pytest.approx(_rdp_epsilon(z, 1e-5), rel=2e-3)
    assert _exact_delta(eps, z) <= 1e-5  # the exact Gaussian mechanism meets the ledger
    # The ledger recomputes its ε as every other ledger does (q = 1, one step).
    from dpsinkhorn.report.privacy_summary import check_ledger_record

    ledger = {
        "private": True,
        "q": 1.0,
        "noise_multiplier": z,
        "steps": 1,
        "delta": 1e-5,
        "epsilon": eps,
        "accountant": "rdp (x)",
        "guarantee": "g",
    }
    assert check_ledger_record(ledger, Path("privacy.json")) is ledger
    given = make_experiment("e", method="dpmerf", sigma=2.0, steps=5)
    assert merf_noise_multiplier(given) == 2.0


def test_noise_is_drawn_once_from_the_run_key():
    """Same key, same release; the noise (release·N − S) has std z·Δ and mean 0."""
    d, z = 32, 0.7
    w = _frequencies(d, features=2000)
    x, y = torch.rand(50, d), torch.randint(0, K, (50,))
    releases = []
    for _ in range(2):
        rng = keyed_generator(public_noise_key(3, "merf"), "cpu")
        releases.append(MerfRelease(z, rng).release(x, y, w, K))
    assert torch.equal(releases[0], releases[1])
    noise = releases[0].double() * 50 - embedding_sum(x, y, w, K)
    assert noise.std().item() == pytest.approx(z, rel=0.03)
    assert abs(noise.mean().item()) < 0.03
    other = MerfRelease(z, keyed_generator(public_noise_key(4, "merf"), "cpu"))
    assert not torch.equal(other.release(x, y, w, K), releases[0])


@pytest.mark.parametrize(
    "settings,key",
    [
        ({"steps": None, "sigma": 1.0}, "steps"),
        ({"rff_features": 501}, "rff_features"),
        ({"sigma": None, "target_epsilon": None}, "target_epsilon"),
        ({"epsilon_convention": "paper", "target_epsilon": 10.0}, "epsilon_convention"),
    ],
)
def test_bad_settings_name_their_key(settings, key):
    with pytest.raises(ValueError, match=key):
        make_experiment("bad", method="dpmerf", **{"steps": 5, **settings})


def test_a_bandwidth_whose_frequencies_overflow_is_refused():
    """b = 1e-300 passes the schema (> 0), but 1/√b overflows float32: refused before the
    release instead of a generator of NaNs."""
    with pytest.raises(ValueError, match="rff_bandwidth 1e-300 is too small"):
        random_frequencies(4, 8, 1e-300, 0, "x", torch.device("cpu"))


def _digits(size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return (x[:, 0].clamp(0, 1) * 255).round().to(torch.uint8).numpy(), digits.target


def _spec(steps: int, **extra) -> dict:
    settings = dict(
        method="dpmerf",
        generator="merf",
        channels=[200, 16, 8],
        latent_dim=5,
        batch_size=100,
        lr=0.01,
        lr_decay=0.9,
        weight_decay=0.0,
        rff_features=2000,
        sigma=None,
        target_epsilon=10.0,
        steps=steps,
        log_every=50,
        checkpoint_every=1000,
    )
    return make_experiment("digits_merf", **{**settings, **extra})


def test_generator_on_digits_beats_chance(tmp_path):
    """DP-MERF at sound ε = 10 on 1,400 of sklearn's digits; Log-Reg trained on 2,000 of
    its samples classifies the 397 real held-out digits far above chance (10%)."""
    from sklearn.linear_model import LogisticRegression

    from dpsinkhorn.evaluate.sample import load_generator, sample_generator
    from dpsinkhorn.publish.proofs import check_ledger
    from dpsinkhorn.train.run import train

    images, labels = _digits()
    order = np.random.default_rng(0).permutation(len(labels))
    train_idx, test_idx = order[:1400], order[1400:]
    out = tmp_path / "out"
    record = train(
        _spec(200),
        out,
        train_data=(images[train_idx], labels[train_idx]),
        classes=[str(k) for k in range(10)],
        device="cpu",
        progress=False,
        record_dir=tmp_path / "trainings",
    )
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger == record and ledger["steps"] == 1 and ledger["generator_steps"] == 200
    assert ledger["q"] == 1.0 and ledger["sensitivity"] == 1.0 and ledger["epsilon"] <= 10
    check_ledger((out / "privacy.json").read_bytes(), out / "privacy.json", "digits_merf", False)
    model = load_generator(out / "generator.pt", torch.device("cpu"))
    x, y = sample_generator(model, 2000, 0)
    clf = LogisticRegression(max_iter=1000).fit(x.reshape(len(x), -1) / 255.0, y)
    accuracy = clf.score(images[test_idx].reshape(len(test_idx), -1) / 255.0, labels[test_idx])
    assert accuracy > 0.5, accuracy
    # The training record counts the one release, not the generator's steps.
    from dpsinkhorn.privacy import trainings

    (path,) = (tmp_path / "trainings").glob("*.jsonl")
    (entry,) = trainings.trainings(trainings.read(path))
    assert entry["steps"] == 1 and entry["steps_planned"] == 1 and entry["q"] == 1.0


def test_resume_keeps_the_one_release(tmp_path):
    """Stopped after 5 steps and resumed: the same generator as without the stop (public
    key), and the ledger still counts one release."""
    from dpsinkhorn.train.run import train
    from dpsinkhorn.train.signals import Preempted

    images, labels = _digits()
    images, labels = images[:300], labels[:300]
    spec = _spec(12, reproducible=True, checkpoint_every=5, rff_features=200)
    kwargs = {
        "train_data": (images, labels),
        "classes": [str(k) for k in range(10)],
        "device": "cpu",
        "progress": False,
        "record_dir": tmp_path / "t",
    }
    whole = train(spec, tmp_path / "whole", **kwargs)
    with pytest.raises(Preempted):
        train(spec, tmp_path / "split", stop_after=5, **kwargs)
    split = train(spec, tmp_path / "split", **kwargs)
    assert split["content_sha256"] == whole["content_sha256"]
    assert split["steps"] == 1 and split["generator_steps"] == 12


MERF_CONFIG = """\
run_name: merf
data_dir: data
seeds: [0]
evaluation: {num_samples: 50, fid_reference_size: 50, fid_sqrtm: eigh,
  classifiers: [logreg, mlp, cnn], logreg_max_iter: 200, max_epochs: 3, patience: 2}
training_defaults: {checkpoint_every: 10, log_every: 5}
experiments:
  mnist_dpmerf:
    dataset: mnist
    table1_row: dpmerf
    method: dpmerf
    generator: merf
    channels: [200, 16, 8]
    latent_dim: 5
    batch_size: 100
    steps: 20
    lr: 0.01
    weight_decay: 0.0
    lr_decay: 0.9
    rff_features: 500
    sigma: null
    target_epsilon: 10.0
"""


@pytest.mark.slow
def test_workflow_trains_evaluates_reports_and_releases_dpmerf(tmp_path, data_mirror, fid_weights):
    """The repo's Snakefile on a one-experiment DP-MERF config (about a minute and a half on
    2 cores): the same train and evaluation rules, Table 1 with the computed row beside the
    paper's, the privacy summary, and ``dpsinkhorn release`` proving every file."""
    config = tmp_path / "merf.yaml"
    config.write_text(MERF_CONFIG)
    exe = Path(sys.executable).parent
    overrides = [f"data_mirror={data_mirror}", f"fid_weights={fid_weights}"]
    overrides += [
        o
        for o in shared_config_overrides()
        if o.split("=")[0] not in ("data_mirror", "fid_weights")
    ]
    env = {**os.environ, "PATH": f"{exe}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [
        str(exe / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(tmp_path),
        "--cores",
        "2",
        "--max-threads",
        "1",
        "--configfile",
        str(config),
        "--config",
        *overrides,
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    results = tmp_path / "results" / "merf"
    md = (results / "tables" / "table1.md").read_text()
    (row,) = [line for line in md.splitlines() if line.startswith("| DP-MERF (computed")]
    assert "(paper 116.3)" in row and "(paper 79.4)" in row and "| 10.00 | – |" in row
    summary = json.loads((results / "privacy_summary.json").read_text())
    assert summary["datasets"][0]["epsilon_composed"] == pytest.approx(10.0, rel=1e-3)
    release = subprocess.run(
        [
            str(exe / "dpsinkhorn"),
            "release",
            "--config",
            str(config),
            "--run",
            str(results),
            "--out",
            str(tmp_path / "publish"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert release.returncode == 0, release.stdout + release.stderr
    assert (tmp_path / "publish" / "mnist_dpmerf" / "generator.pt").is_file()
