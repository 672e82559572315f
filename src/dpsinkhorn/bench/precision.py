"""How far a reduced generator precision (tf32, bf16) moves a training step from fp32."""

from __future__ import annotations

import copy

import torch

from dpsinkhorn.models import GeneratorPrecision
from dpsinkhorn.privacy.mechanism import ParameterGradientSanitizer
from dpsinkhorn.train.trainer import Trainer

#: Bounds on :func:`precision_error` under which a reduced precision may train
#: (tests/test_precision.py, tests/test_cuda.py): the loss within 0.5%, a non-private
#: update within 2%, and a private update changed by at most a tenth of what one draw
#: of the mechanism's noise changes. About 8x what bf16 measured on CPU.
PRECISION_TOLERANCE = {"loss_rel": 5e-3, "grad_rel": 2e-2, "noise_rel": 0.1}


def precision_error(
    spec: dict, images, labels, device: torch.device, precision: str, warm_steps: int = 3
) -> dict:
    """How far one training step in ``precision`` lands from the same step in fp32, from
    the state after ``warm_steps`` fp32 steps, with the same draws (docs/PERFORMANCE.md,
    "Precision"): ``loss_rel`` |S_p − S_32| / |S_32|; ``grad_rel`` ‖∇θ_p − ∇θ_32‖ / ‖∇θ_32‖
    unsanitised; ``noise_rel`` (private runs) ‖∇θ_p − ∇θ_32‖ / ‖∇θ_32' − ∇θ_32‖ sanitised,
    32' with another noise draw; ``within_tolerance``: all within :data:`PRECISION_TOLERANCE`.
    """
    trainer = Trainer(spec, images, labels, device)
    for _ in range(warm_steps):
        trainer.step()
    state = copy.deepcopy(trainer.state_dict())
    sanitizer = trainer.sanitizer

    def gradient(arith: str, noise_seed: int | None) -> tuple[float, torch.Tensor]:
        trainer.load_state_dict(copy.deepcopy(state))
        trainer.precision = GeneratorPrecision(arith, device)
        trainer.sanitizer = sanitizer if noise_seed is not None else None
        if trainer.sanitizer is not None:
            trainer.sanitizer.generator = torch.Generator(device).manual_seed(noise_seed)
        with trainer.precision.step():
            loss = trainer.stepper.forward_backward([trainer])[0]
        if isinstance(trainer.sanitizer, ParameterGradientSanitizer):
            trainer.sanitizer.apply(trainer.model.parameters())
        grads = [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
        return float(loss), torch.cat(grads).double()

    loss_32, clean_32 = gradient("fp32", None)
    loss_p, clean_p = gradient(precision, None)
    result = {
        "precision": precision,
        "loss_rel": abs(loss_p - loss_32) / abs(loss_32),
        "grad_rel": float((clean_p - clean_32).norm() / clean_32.norm()),
    }
    if sanitizer is not None:
        _, noisy_32 = gradient("fp32", 1)
        _, noisy_p = gradient(precision, 1)
        _, other_noise_32 = gradient("fp32", 2)
        result["noise_rel"] = float(
            (noisy_p - noisy_32).norm() / (other_noise_32 - noisy_32).norm()
        )
    result["within_tolerance"] = all(
        result[key] <= bound for key, bound in PRECISION_TOLERANCE.items() if key in result
    )
    return result
