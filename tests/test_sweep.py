"""Sweeps: K runs trained together in one process follow the K single runs exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from helpers import without_log_hash

from dpsinkhorn import cli
from dpsinkhorn import config as config_lib
from dpsinkhorn.config import targets
from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.accounting import compute_epsilon
from dpsinkhorn.train.run import train
from dpsinkhorn.train.signals import Preempted
from dpsinkhorn.train.sweep import SweepTrainer, train_sweep
from dpsinkhorn.train.trainer import Trainer
from dpsinkhorn.train.workspace import WorkspaceRemovalError

# reproducible: sweep members and single runs are compared draw for draw (public keys).
TINY = {
    "channels": [16, 8, 4],
    "steps": 8,
    "checkpoint_every": 4,
    "log_every": 2,
    "reproducible": True,
}

# Runs that differ in everything a sweep may vary: seed, p (so n'), m, σ, Δ, lr,
# optimizer, clipping, perturbation, steps, and private vs non-private.
RUNS = {
    "a": {"seed": 0, "p": 0.2, "m": 1.0, "sigma": 0.8, "lr": 1e-4},
    "b": {
        "seed": 1,
        "p": 0.6,
        "m": 0.0,
        "sigma": 1.5,
        "clip": 0.5,
        "optimizer": "sgd",
        "lr": 3e-3,
        "clipping": "per_sample",
        "steps": 5,
    },
    "c": {"seed": 2, "p": 0.0, "m": 2.0, "sigma": 1.2, "perturbation": "parameter", "lr": 1e-3},
    "d": {"seed": 3, "p": 0.4, "method": "sinkhorn", "optimizer": "sgd", "lr": 1e-5, "steps": 6},
}


def write_config(tmp_path, data_dir, runs=RUNS, **top) -> dict:
    experiments = {name: {"dataset": "mnist", **run} for name, run in runs.items()}
    cfg = {
        "run_name": "test",
        "data_dir": str(data_dir),
        "device": "cpu",
        "training_defaults": dict(TINY),
        "experiments": experiments,
        **top,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def specs_of(path, names=tuple(RUNS)) -> list[dict]:
    config = config_lib.load_config(path)
    return [config_lib.experiment(config, name) for name in names]


@pytest.fixture(scope="module")
def mnist(prepared_data):
    return data.load_split(prepared_data, "mnist", "train")


def test_sweep_follows_each_single_run(tmp_path, prepared_data, mnist):
    """Same draws, same sanitised gradients, same updates: no run sees another's gradient.

    Each run's generator after 5 steps equals its single run up to float rounding; a
    leak of one run's (unsanitised or other-run) gradient into another would move it by
    orders of magnitude more.
    """
    specs = specs_of(write_config(tmp_path, prepared_data))
    cpu = torch.device("cpu")
    singles = [Trainer(spec, *mnist, cpu) for spec in specs]
    sweep = SweepTrainer(specs, *mnist, cpu)
    for _ in range(5):
        single_losses = [t.step() for t in singles]
        sweep_losses = sweep.step(sweep.trainers)
        for a, b in zip(single_losses, sweep_losses, strict=True):
            assert float(b) == pytest.approx(float(a), rel=1e-4)  # float32 Sinkhorn
    for single, member in zip(singles, sweep.trainers, strict=True):
        pairs = list(zip(single.model.parameters(), member.model.parameters(), strict=True))
        moved = max((p - q).abs().max().item() for p, q in pairs)
        scale = max(p.abs().max().item() for p, _ in pairs)
        assert moved < 1e-5 * scale, (single.settings.name, moved, scale)
        assert member.step_count == 5 and member.epsilon() == single.epsilon()
        if member.accountant is not None:
            assert member.accountant.steps == 5


def test_train_sweep_writes_single_run_files_and_resumes(tmp_path, prepared_data):
    specs = specs_of(write_config(tmp_path, prepared_data))
    full_dirs = [tmp_path / "full" / s["name"] for s in specs]
    full = train_sweep(specs, full_dirs, prepared_data, device="cpu", progress=False)
    assert [r["steps"] for r in full] == [8, 5, 8, 6]  # runs leave when they finish
    sigma, q = specs[0]["sigma"], 50 / 60000
    assert full[0]["epsilon"] == pytest.approx(compute_epsilon(sigma, q, 8, 1e-5))

    # Interrupted twice, resumed: bit-identical to the uninterrupted sweep.
    dirs = [tmp_path / "resumed" / s["name"] for s in specs]
    with pytest.raises(Preempted):
        train_sweep(specs, dirs, prepared_data, device="cpu", stop_after=3, progress=False)
    state = torch.load(dirs[0] / "private_workspace" / "checkpoint.pt", weights_only=False)
    assert state["step"] == 3 and state["accountant"]["segments"][0][2] == 3
    with pytest.raises(Preempted):
        train_sweep(specs, dirs, prepared_data, device="cpu", stop_after=3, progress=False)
    assert (dirs[1] / "generator.pt").exists()  # b finished (5 steps) before the 2nd stop
    resumed = train_sweep(specs, dirs, prepared_data, device="cpu", progress=False)
    assert [without_log_hash(r) for r in resumed] == [without_log_hash(r) for r in full]
    for a_dir, b_dir in zip(full_dirs, dirs, strict=True):
        a = torch.load(a_dir / "generator.pt", weights_only=False)["state_dict"]
        b = torch.load(b_dir / "generator.pt", weights_only=False)["state_dict"]
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert (a_dir / "train_log.csv").read_text().count("\n") == (
            b_dir / "train_log.csv"
        ).read_text().count("\n")
        # the sweep is done: no private workspace is left beside the release
        assert sorted(p.name for p in b_dir.iterdir()) == [
            ".dpsinkhorn.lock",  # the output lock, released (empty)
            "generator.pt",
            "privacy.json",
            "train_log.csv",
        ]

    # A sweep member's checkpoint is a single run's checkpoint: `train` continues it.
    with pytest.raises(Preempted):
        train_sweep(
            specs,
            [tmp_path / "mixed" / s["name"] for s in specs],
            prepared_data,
            device="cpu",
            stop_after=4,
            progress=False,
        )
    record = train(specs[0], tmp_path / "mixed" / "a", prepared_data, device="cpu", progress=False)
    assert record["steps"] == 8 and record["epsilon"] == full[0]["epsilon"]


def test_sweep_refuses_runs_of_different_shapes(tmp_path, prepared_data, mnist):
    runs = {"a": RUNS["a"], "e": {"seed": 4, "batch_size": 20}}
    specs = specs_of(write_config(tmp_path, prepared_data, runs), ("a", "e"))
    with pytest.raises(ValueError, match=r"cannot share a sweep: they differ in \['batch_size'\]"):
        SweepTrainer(specs, *mnist, torch.device("cpu"))


def test_grouping_keeps_order_and_compatibility(tmp_path, prepared_data):
    runs = {**RUNS, "e": {"seed": 4, "batch_size": 20}, "f": {"seed": 5, "batch_size": 20}}
    path = write_config(tmp_path, prepared_data, runs)
    specs = specs_of(path, tuple(runs))
    assert targets.group_experiments(specs, 1) == [[n] for n in runs]
    assert targets.group_experiments(specs, 3) == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert targets.group_experiments(specs, 8) == [["a", "b", "c", "d"], ["e", "f"]]
    config = config_lib.load_config(path)
    assert targets.training_jobs({**config, "sweep_runs": 3}) == (
        ["d"],
        [["a", "b", "c"], ["e", "f"]],
    )
    with pytest.raises(ValueError, match="sweep_runs must be at least 1"):
        targets.group_experiments(specs, 0)


def test_train_sweep_cli(tmp_path, prepared_data, capsys):
    path = write_config(tmp_path, prepared_data)
    args = ["train-sweep", "--config", str(path), "--experiments", "b", "d"]
    assert cli.main([*args, "--out-root", str(tmp_path / "run"), "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["experiment"], r["steps"]) for r in lines] == [("b", 5), ("d", 6)]
    assert lines[1]["epsilon"] is None  # d is non-private
    for folder in ("b", "nonprivate/d"):  # d is not a DP release: under nonprivate/
        for file in ("generator.pt", "privacy.json", "train_log.csv"):
            assert (tmp_path / "run" / folder / file).exists()


def test_sweep_step_never_synchronises(tmp_path, prepared_data, mnist):
    """No .item() / nonzero in the batched step either (it is captured in a CUDA graph)."""
    from dpsinkhorn.bench.measure import count_ops

    sweep = SweepTrainer(
        specs_of(write_config(tmp_path, prepared_data)), *mnist, torch.device("cpu")
    )
    assert count_ops(lambda: sweep.step(sweep.trainers))["host_syncs_per_step"] == 0


def test_sweep_fails_when_a_workspace_cannot_be_deleted(tmp_path, prepared_data, monkeypatch):
    """Every member's workspace is tried; those that stay are named in one error."""

    def refuse(path, ignore_errors=False, onerror=None, **kwargs):  # a refusing file server
        if not ignore_errors:
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    specs = specs_of(write_config(tmp_path, prepared_data), names=("b", "d"))
    dirs = [tmp_path / "run" / s["name"] for s in specs]
    with pytest.raises(WorkspaceRemovalError) as caught:
        train_sweep(specs, dirs, prepared_data, device="cpu", progress=False)
    message = str(caught.value)
    assert "\n" not in message
    for out in dirs:
        assert str(out / "private_workspace") in message
        assert (out / "private_workspace").is_dir()
