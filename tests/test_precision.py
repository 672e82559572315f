"""The ``precision`` option: bf16 keeps the loss and the gradients within tolerance.

bf16 runs on any device, so its tolerance is checked here on real MNIST at the paper's
setting (B = 50, p = 0.4, DCGAN 256/128/64). TF32 exists only on CUDA:
``tests/test_cuda.py`` checks it with the same bounds (``bench.precision.PRECISION_TOLERANCE``),
about 8x what this CPU measured for bf16 (``bench.precision.precision_error``, seeds 0-2: loss_rel
≤ 4.9e-4, grad_rel ≤ 2.7e-3, noise_rel ≤ 1.3e-2).
"""

from __future__ import annotations

import pytest
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn.bench.precision import PRECISION_TOLERANCE, precision_error
from dpsinkhorn.data import datasets as data
from dpsinkhorn.models import GeneratorPrecision, cudnn_tf32
from dpsinkhorn.train.trainer import StepOptions, Trainer

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mnist(prepared_mnist):
    return data.load_split(prepared_mnist, "mnist", "train")


def paper_spec(**overrides) -> dict:
    return config_lib.make_experiment("p", sigma=1.5, steps=100, **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"clipping": "per_sample"},
        {"perturbation": "parameter"},
        {"method": "sinkhorn"},
    ],
    ids=["image-batch", "image-per-sample", "parameter", "non-private"],
)
def test_bf16_step_stays_within_tolerance(mnist, overrides):
    spec = paper_spec(**overrides)
    error = precision_error(spec, *mnist, CPU, "bf16")
    private = spec["method"] == "dp_sinkhorn"
    assert set(error) >= set(PRECISION_TOLERANCE) if private else "noise_rel" not in error
    for key, bound in PRECISION_TOLERANCE.items():
        assert error.get(key, 0) <= bound, error
    assert error["grad_rel"] > 0, "the two precisions computed the very same gradient"
    assert error["within_tolerance"]


def test_bf16_keeps_everything_but_the_generator_in_float32(mnist):
    trainer = Trainer(paper_spec(), *mnist, CPU, StepOptions(precision="bf16"))
    seen: dict[str, torch.dtype] = {}
    trainer.model.net[-2].register_forward_hook(lambda m, i, out: seen.update(conv=out.dtype))
    loss = trainer.step()
    assert seen["conv"] == torch.bfloat16  # the generator ran in bf16 ...
    assert loss.dtype == torch.float32  # ... the Sinkhorn solve did not
    for p in trainer.model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        assert all(s.dtype == torch.float32 for s in trainer.optimizer.state[p].values())


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32, bf16, got 'fp16'"):
        GeneratorPrecision("fp16", CPU)
    with pytest.raises(ValueError, match="precision"):
        config_lib.validate({"precision": "fp16", "experiments": {"e": {"dataset": "mnist"}}})


def test_sweeps_refuse_bf16(mnist):
    from dpsinkhorn.train.sweep import SweepTrainer

    with pytest.raises(ValueError, match="vmap"):
        SweepTrainer([paper_spec()], *mnist, CPU, StepOptions(precision="bf16"))
    with pytest.raises(ValueError, match=r"precision: .*sweep_runs: 1"):
        config_lib.validate(
            {"precision": "bf16", "sweep_runs": 4, "experiments": {"e": {"dataset": "mnist"}}}
        )


@pytest.mark.parametrize("allowed", [False, True])
def test_cudnn_tf32_switch_is_set_inside_and_restored_after(allowed):
    """The switch itself (its effect needs CUDA: tests/test_cuda.py)."""
    conv = torch.backends.cudnn.conv

    def state():
        return conv.fp32_precision if hasattr(conv, "fp32_precision") else None

    before = state()
    with cudnn_tf32(allowed):
        if before is not None:
            assert conv.fp32_precision == ("tf32" if allowed else "ieee")
        else:
            assert torch.backends.cudnn.allow_tf32 is allowed
    assert state() == before
