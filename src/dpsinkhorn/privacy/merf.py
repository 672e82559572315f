"""DP-MERF (Harder, Adamczewski and Park, AISTATS 2021): one Gaussian release of a
class-conditional random-feature mean embedding (``method: dpmerf``).

Embedding e(x, y) = φ(x) ⊗ onehot(y) ∈ R^{D × K} (:func:`features_of`, public frequencies
from :func:`random_frequencies`): ‖e(x, y)‖_F = 1 for every record, so under add/remove-one
adjacency the sum S = Σ e(x_i, y_i) has sensitivity Δ = 1 with no clipping. Gaussian
mechanism: S + N(0, (zΔ)² I), one float64 draw from the run's keyed generator, noise
multiplier z = ``sigma`` (or solved from ``target_epsilon``); the release is S̃ / N (N
public). The ledger is one mechanism without subsampling (q = 1, steps = 1). The generator
fitted to the release (post-processing) is ``train.merf``. docs/PRIVACY.md ("DP-MERF").
"""

from __future__ import annotations

import math

import torch

from dpsinkhorn.privacy.budget import solve_noise_multiplier
from dpsinkhorn.privacy.checks import check_count, check_positive
from dpsinkhorn.privacy.noise import keyed_generator, public_noise_key

#: L2 (Frobenius) sensitivity of the embedding sum under add/remove-one adjacency.
SENSITIVITY = 1.0
#: Records embedded per matrix product (memory: CHUNK × D floats).
CHUNK = 2048


def merf_noise_multiplier(spec: dict) -> float:
    """z of a ``dpmerf`` experiment: ``sigma``, else the smallest z with
    ε(one Gaussian mechanism, q = 1, steps = 1) ≤ ``target_epsilon`` at ``delta``."""
    if spec["sigma"] is not None:
        check_positive(f"experiment {spec['name']}: sigma", spec["sigma"])
        return float(spec["sigma"])
    if spec["target_epsilon"] is None:
        raise ValueError(f"experiment {spec['name']}: sigma is null, so target_epsilon is needed")
    return solve_noise_multiplier(
        float(spec["target_epsilon"]), 1.0, 1, float(spec["delta"]), spec["accountant"]
    )


def random_frequencies(
    features: int, dim: int, bandwidth: float, seed: int, name: str, device: torch.device
) -> torch.Tensor:
    """W [D/2, d] float32 (D = ``features``), entries N(0, 1/b) (b = ``bandwidth``), from
    the public key (seed, name): settings, not data."""
    check_count("rff_features", features, minimum=2)
    if features % 2:
        raise ValueError(f"rff_features must be even (cos and sin pairs), got {features}")
    check_positive("rff_bandwidth", bandwidth)
    rng = keyed_generator(public_noise_key(seed, f"merf frequencies|{name}"), "cpu")
    w = torch.randn(features // 2, dim, generator=rng, dtype=torch.float64)
    w = (w / math.sqrt(bandwidth)).to(torch.float32)
    if not torch.isfinite(w).all():  # else a NaN generator, budget spent
        raise ValueError(f"rff_bandwidth {bandwidth} is too small: frequencies overflow float32")
    return w.to(device)


def features_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """φ(x) [N, D] of x [N, d] in [0, 1]: [cos(xWᵀ), sin(xWᵀ)] / √(D/2); ‖φ(x)‖₂ = 1."""
    xw = x @ w.t()
    return torch.cat([torch.cos(xw), torch.sin(xw)], dim=1) / math.sqrt(w.shape[0])


def embedding_sum(
    x: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """S = Σ_i φ(x_i) ⊗ onehot(y_i) [D, K] (float64 sum), x [N, d] in [0, 1]."""
    total = torch.zeros(2 * w.shape[0], num_classes, dtype=torch.float64, device=w.device)
    for start in range(0, len(x), CHUNK):
        phi = features_of(x[start : start + CHUNK].to(w.device, torch.float32), w)
        onehot = torch.nn.functional.one_hot(
            labels[start : start + CHUNK].to(w.device), num_classes
        ).to(phi.dtype)
        total += (phi.t() @ onehot).to(torch.float64)
    return total


def mean_embedding(x: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """(1/N) Σ φ(x_i) ⊗ onehot(y_i) [D, K] float32, differentiable (the generator's side)."""
    phi = features_of(x, w)
    return phi.t() @ torch.nn.functional.one_hot(labels, k).to(phi.dtype) / len(x)


class MerfRelease:
    """DP-MERF's Gaussian mechanism (module docstring): sensitivity Δ = 1 of the embedding
    sum under add/remove-one adjacency, noise std z·Δ, noise multiplier z."""

    clipping = None
    clip = None

    def __init__(self, noise_multiplier: float, generator: torch.Generator):
        check_positive("noise multiplier", noise_multiplier)
        self.noise_multiplier = float(noise_multiplier)
        self.sensitivity = SENSITIVITY
        self.noise_std = self.noise_multiplier * SENSITIVITY
        self.noise_scale = self.noise_multiplier  # the ledger's ``sigma``
        self.generator = generator

    def release(
        self, images: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, num_classes: int
    ) -> torch.Tensor:
        """μ̃ = (S + N(0, (zΔ)² I)) / N [D, K] float32: the one release (images [N, d] in
        [0, 1], labels [N] int64; N public). Draws D·K normals from the run's generator."""
        total = embedding_sum(images, labels, w, num_classes)
        noise = torch.randn(
            total.shape, generator=self.generator, dtype=torch.float64, device=total.device
        )
        return ((total + self.noise_std * noise) / len(images)).to(torch.float32)
