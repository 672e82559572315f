"""DP-MERF (Harder, Adamczewski and Park, AISTATS 2021): one Gaussian release of a
class-conditional random-feature mean embedding (``method: dpmerf``).

Mechanism (the version this project implements; the generator that is fitted to the
release afterwards, at no privacy cost, is ``train.merf``):

* Data and adjacency. The private dataset holds N records (image, label), N public
  (as for DP-Sinkhorn). Neighbouring datasets differ by adding or removing one record.
* Features. x ∈ [0, 1]^d is the image flattened (uint8 / 255; d = C·S·S). W ∈ R^{D/2 × d}
  has i.i.d. N(0, 1/b) entries (b = ``rff_bandwidth``, DP-MERF's ``rff_sigma``: the
  kernel's squared length scale, pixel units²), drawn from the public key (seed, name):
  W is a setting, not data. φ(x) = [cos(Wx), sin(Wx)] / √(D/2) ∈ R^D (D =
  ``rff_features``), the random Fourier features of the Gaussian kernel
  k(x, x') = exp(−‖x − x'‖² / (2b)) (DP-MERF's ``rff_sphere``).
* Embedding of a record. e(x, y) = φ(x) ⊗ onehot(y) ∈ R^{D × K}.
  **Norm bound**: ‖e(x, y)‖_F = ‖φ(x)‖₂ = 1 for EVERY x and y, because each of the D/2
  frequencies contributes (cos² + sin²) / (D/2) = 1 / (D/2). Inputs are pixels in [0, 1],
  always finite, so the bound needs no clipping.
* Query. The sum S(𝒟) = Σ_i e(x_i, y_i) ∈ R^{D × K}.
* **Sensitivity** (add/remove-one adjacency). S(𝒟 ∪ {r}) − S(𝒟) = e(r), so
  ‖S(𝒟) − S(𝒟')‖_F = 1 = Δ exactly, whatever record r is added or removed.
* **Gaussian mechanism**. S̃ = S + N(0, (zΔ)² I), one draw of D·K normals from the run's
  keyed generator (``privacy.noise``: 256 secret bits, or a public key in
  ``reproducible`` mode), in float64. **Noise multiplier** z = noise std / Δ = ``sigma``
  (solved from ``target_epsilon`` when null: :func:`merf_noise_multiplier`).
* Release. μ̃ = S̃ / N (N public: post-processing), the noisy mean embedding. Everything
  trained from it is post-processing. The ledger is ONE Gaussian mechanism without
  subsampling: q = 1, steps = 1, noise multiplier z (``privacy.accounting``), so
  ε(z, δ) is recomputed from privacy.json like every other ledger.

DP-MERF's code (``code_balanced/rff_mmd_approx.noisy_dataset_embedding``) adds noise of
std 2·noise_factor / N to the mean embedding (its replace-one sensitivity 2/N). Here the
noise std on the mean is z / N (add/remove-one sensitivity 1/N), with z set by the
accountant for the experiment's target ε.
"""

from __future__ import annotations

import math

import torch

from dpsinkhorn.privacy.accounting import compute_epsilon
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
    """W [D/2, d] float32, entries N(0, 1/b), from the public key (seed, name)."""
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

    def epsilon(self, delta: float, accountant: str = "rdp") -> float:
        """ε at ``delta`` of this one release (q = 1, steps = 1)."""
        return compute_epsilon(self.noise_multiplier, 1.0, 1, delta, accountant)
