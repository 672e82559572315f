"""The benchmark command's contract (it times; tests never assert on speed)."""

from __future__ import annotations

import json

import pytest
from test_train import make_config

from dpsinkhorn.cli import main


def test_bench_both_implementations(tmp_path, prepared_data, capsys):
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--impl", "both"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("ours_steps_per_s", "reference_steps_per_s", "ratio", "device", "torch"):
        assert key in result
    assert result["ratio"] == pytest.approx(
        result["ours_steps_per_s"] / result["reference_steps_per_s"]
    )
    assert result["steps_per_s"] == result["ours_steps_per_s"] > 0
    # The fixed-shape step never reads a device value on the host; the plain step does
    # (Poisson mask, geomloss's diameter, the clipping norms).
    assert result["ours"]["host_syncs_per_step"] == 0
    assert result["reference"]["host_syncs_per_step"] > 0
    assert 0 < result["ours"]["ops_per_step"] < result["reference"]["ops_per_step"]
    # Both count at least the generator's convolutions: forward, and backward twice over
    # (input and weight gradients) on the step's n + n' rows.
    from torch.utils.flop_counter import FlopCounterMode

    from dpsinkhorn import config as config_lib
    from dpsinkhorn.models import ConditionalDCGAN, GeneratorConfig
    from dpsinkhorn.ot.loss import debias_size

    spec = config_lib.experiment(config_lib.load_config(cfg), "e")
    model = ConditionalDCGAN(GeneratorConfig(channels=tuple(spec["channels"])))
    rows = spec["batch_size"] + debias_size(spec["batch_size"], spec["p"])
    with FlopCounterMode(display=False) as forward:
        model(*model.sample_inputs(rows))
    generator_gflop = 3 * forward.get_total_flops() / 1e9
    for impl in ("ours", "reference"):
        assert result[impl]["gflop_per_step"] >= generator_gflop * (1 - 1e-6) > 0


def test_bench_reports_the_precision_and_its_error(tmp_path, prepared_data, capsys):
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--precision", "bf16"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ours"]["precision"] == "bf16"
    error = result["precision_error"]
    assert error["precision"] == "bf16"
    assert {"loss_rel", "grad_rel", "noise_rel", "within_tolerance"} <= set(error)


def test_bench_times_the_step_variants_without_a_host_sync(tmp_path, prepared_data, capsys):
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "1", "--warmup", "1"]
    variants = ["compact_poisson", "channels_last", "fused_cost"]
    assert main([*args, "--sweep", "2", *(f"--variant={v}" for v in variants)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ours"]["variants"] == variants
    assert result["ours"]["host_syncs_per_step"] == result["sweep"]["host_syncs_per_step"] == 0
    assert result["ours_steps_per_s"] > 0 and result["sweep_steps_per_s"] > 0


@pytest.mark.parametrize("perturbation", ["image", "parameter"])
@pytest.mark.parametrize("cost", ["mixed", "l1"])
def test_training_step_never_synchronises(tmp_path, prepared_data, perturbation, cost):
    """Counted on CPU: no .item() / nonzero anywhere in the step, for any mechanism or cost.

    Such a read would stall a GPU every step and forbid CUDA graph capture.
    """
    import torch

    from dpsinkhorn import config as config_lib
    from dpsinkhorn.bench.measure import count_ops
    from dpsinkhorn.data import datasets as data
    from dpsinkhorn.train.trainer import Trainer

    cfg = make_config(tmp_path, prepared_data, perturbation=perturbation, cost=cost)
    spec = config_lib.experiment(config_lib.load_config(cfg), "e")
    trainer = Trainer(spec, *data.load_split(prepared_data, "mnist", "train"), torch.device("cpu"))
    assert count_ops(trainer.step)["host_syncs_per_step"] == 0


def test_bench_sweep_layer_profile_and_solver(tmp_path, prepared_data, capsys):
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--sweep", "2", "--layers", "--solver"]) == 0
    result = json.loads(capsys.readouterr().out)
    solver = result["solver_iterations"]
    assert solver["shape"] == [2, 50, result["capacity"]]
    assert solver["eager_ms"] > 0 and solver["compiled_ms"] > 0
    assert result["sweep_runs"] == 2
    assert result["sweep"]["host_syncs_per_step"] == 0 < result["sweep"]["ops_per_step"]
    assert result["sweep_per_run_ratio"] == pytest.approx(
        result["sweep_steps_per_s"] / result["ours_steps_per_s"]
    )
    layers = result["generator_layers"]
    assert [row["kind"] for row in layers] == ["ConvTranspose2d", "ReLU"] * 3 + [
        "ConvTranspose2d",
        "Tanh",
    ]
    assert layers[0]["input"] == [50 + 20, 16, 1, 1]  # n + n' rows, latent 12 + embedding 4
    assert all(row["gflop_per_s"] > 0 for row in layers if row["kind"] == "ConvTranspose2d")
    assert 0 < result["generator_share_of_step"]


def test_bench_profile_lists_the_step_kernels(tmp_path, prepared_data, capsys):
    """--profile N: per-kernel time of N steps (on a CPU, ATen ops; on a GPU, the kernels of
    the graph replay with --cuda-graphs)."""
    cfg = make_config(tmp_path, prepared_data)
    args = ["bench", "--config", str(cfg), "--experiment", "e", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--profile", "2", "--device", "cpu"]) == 0
    profile = json.loads(capsys.readouterr().out)["ours_profile"]
    assert profile["steps"] == 2 and profile["wall_us_per_step"] > 0
    kernels = profile["kernels"]
    assert 0 < len(kernels) <= 25 and all(k["us_per_step"] > 0 for k in kernels)
    assert kernels == sorted(kernels, key=lambda k: -k["us_per_step"])
    assert sum(k["share"] for k in kernels) <= 1 + 1e-9
    assert any("conv" in k["name"] for k in kernels)  # the generator's convolutions
