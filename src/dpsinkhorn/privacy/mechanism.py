"""The sanitisers: the image-gradient Gaussian mechanism and the parameter-gradient baseline.

One step under add/remove-one adjacency, Poisson sampling at q = B / N (``privacy.sampler``),
n + n' generated rows (n = B, n' = floor(n p)); noise N(0, (2Δσ)²) per element in every mode:

* image, ``clipping: batch`` (paper Algorithm 1): G[0:n] of G = ∇_X S [n + n', D] clipped as
  ONE vector to L2 norm Δ: sensitivity 2Δ, noise multiplier σ;
* image, ``clipping: per_sample``: each row clipped to Δ: sensitivity 2Δ√n, multiplier σ/√n;
* ``perturbation: parameter`` (paper Table 2): ∇_θ S clipped as one vector to Δ:
  sensitivity 2Δ, noise multiplier σ.

Rows [n:n+n'] do not depend on Y: clipped to Δ, no noise. Non-finite entries count as 0
(:func:`clip_block`), so every clipped block has norm ≤ Δ whatever its input. Derivation:
docs/PRIVACY.md ("The mechanism"); the accountant: ``privacy.accounting``.
"""

from __future__ import annotations

import math

import torch

from dpsinkhorn.privacy.checks import check_count, check_positive

CLIPPING_MODES = ("batch", "per_sample")


def noise_multiplier(sigma: float, batch_size: int, clipping: str = "batch") -> float:
    """Noise std divided by L2 sensitivity for the image-gradient mechanism.

    batch: sensitivity 2Δ, noise std 2Δσ -> σ.
    per_sample: sensitivity 2Δ√n (n = batch_size), noise std 2Δσ -> σ/√n.
    """
    check_positive("sigma", sigma)
    check_count("batch size", batch_size, minimum=1)
    if clipping == "batch":
        return float(sigma)
    if clipping == "per_sample":
        return float(sigma) / math.sqrt(batch_size)
    raise ValueError(f"clipping must be one of {CLIPPING_MODES}, got {clipping!r}")


def sigma_from_noise_multiplier(z: float, batch_size: int, clipping: str = "batch") -> float:
    """Inverse of :func:`noise_multiplier`."""
    return z if clipping == "batch" else z * math.sqrt(batch_size)


def clip_block(block: torch.Tensor, clip: float, per_row: bool) -> torch.Tensor:
    """Scale ``block`` [k, ...] so its L2 norm (or each row's) is at most ``clip``.

    Non-finite entries are set to 0 first (elementwise: no host sync, safe in a CUDA graph),
    so the result is finite with norm ≤ ``clip`` for every input (the sensitivity bound
    holds even on NaN or inf). The norm of ``block`` itself is used where finite (bitwise
    the unchecked one).
    """
    if block.shape[0] == 0:
        return block
    finite = torch.nan_to_num(block, nan=0.0, posinf=0.0, neginf=0.0)
    if per_row:
        norms = block.flatten(1).norm(dim=1)
        norms = torch.where(norms.isfinite(), norms, finite.flatten(1).norm(dim=1))
        norms = norms.view(-1, *([1] * (block.ndim - 1)))
    else:
        norms = block.norm()
        norms = torch.where(norms.isfinite(), norms, finite.norm())
    return finite * (clip / (norms + 1e-12)).clamp(max=1.0)


def standard_normal(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """N(0, I) noise of ``like``'s shape, device and dtype, drawn from ``generator``."""
    return torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)


class _GaussianSanitizer:
    """Clip to L2 norm Δ (``clip``), then add N(0, (2Δσ)²) per element (σ = ``noise_scale``)
    drawn from ``generator`` (the run's keyed generator, checkpointed by the trainer)."""

    clipping = "batch"

    def __init__(self, clip: float, noise_scale: float, generator: torch.Generator | None = None):
        check_positive("clip", clip)
        check_positive("sigma", noise_scale)
        self.clip, self.noise_scale = float(clip), float(noise_scale)
        self.generator = generator

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to each element of the clipped block: 2Δσ."""
        return 2.0 * self.clip * self.noise_scale

    def _noised(self, block: torch.Tensor) -> torch.Tensor:
        return block + self.noise_std * standard_normal(block, self.generator)


class ImageGradientSanitizer(_GaussianSanitizer):
    """Clips and noises G = ∇_X S, the gradient w.r.t. the generated batch [n + n', ...].

    Gaussian mechanism on G[0:n] under add/remove-one adjacency: sensitivity 2Δ (batch) or
    2Δ√n (per_sample), noise std 2Δσ per element (σ = ``noise_scale``), noise multiplier σ
    or σ/√n.
    """

    def __init__(
        self,
        n: int,
        n_prime: int,
        clip: float,
        noise_scale: float,
        clipping: str = "batch",
        generator: torch.Generator | None = None,
    ):
        super().__init__(clip, noise_scale, generator)
        self.noise_multiplier = noise_multiplier(noise_scale, n, clipping)
        self.n, self.n_prime, self.clipping = n, n_prime, clipping

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped block G[0:n] under add/remove-one adjacency."""
        per_sample = self.clipping == "per_sample"
        return 2.0 * self.clip * (math.sqrt(self.n) if per_sample else 1.0)

    def clipped(self, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The noise-free part of the release: (clipped G[0:n] [n, ...], clipped debiasing
        rows G[n:n+n'] [n', ...]). The release is ``private + noise_std * N(0, I)``, ``debias``;
        the audit (``train.audit``) draws many releases from this and :attr:`noise_std`."""
        if grad.shape[0] != self.n + self.n_prime:
            raise ValueError(f"expected {self.n + self.n_prime} rows, got {grad.shape[0]}")
        per_row = self.clipping == "per_sample"
        return clip_block(grad[: self.n], self.clip, per_row), clip_block(
            grad[self.n :], self.clip, per_row
        )

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        """Return the sanitised gradient (same shape as ``grad`` [n + n', ...])."""
        private, debias = self.clipped(grad)
        return torch.cat([self._noised(private), debias])


PERTURBATIONS = ("image", "parameter")


class ParameterGradientSanitizer(_GaussianSanitizer):
    """Clips and noises the generator's whole parameter gradient g = ∇_θ S (paper Table 2).

    Gaussian mechanism on g (all parameters' gradients as one vector) under add/remove-one
    adjacency: g clipped to L2 norm Δ, sensitivity 2Δ, noise N(0, (2Δσ)²) per element,
    noise multiplier σ (accounted as ``clipping: batch``, the only mode here). Call
    :meth:`apply` after ``loss.backward()`` and before the optimiser step.
    """

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped gradient vector under add/remove-one adjacency: 2Δ."""
        return 2.0 * self.clip

    @property
    def noise_multiplier(self) -> float:
        """Noise std / sensitivity = σ."""
        return self.noise_scale

    def clipped(self, grad: torch.Tensor) -> torch.Tensor:
        """The noise-free part of the release: clip_Δ(grad) [P] (``grad`` flat [P]);
        :func:`clip_block`, so norm ≤ Δ (sensitivity 2Δ) whatever ``grad`` holds."""
        if grad.ndim != 1:
            raise ValueError(f"expected a flat gradient vector, got shape {tuple(grad.shape)}")
        return clip_block(grad, self.clip, per_row=False)

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        """Return clip_Δ(grad) + N(0, (2Δσ)²) elementwise (finite whatever ``grad`` holds);
        ``grad`` is a flat vector [P]."""
        return self._noised(self.clipped(grad))

    def apply(self, parameters) -> None:
        """Sanitise the ``.grad`` of ``parameters`` in place, as one concatenated vector.
        A parameter without a gradient counts as zero and is noised too, so every released
        coordinate is covered by the mechanism."""
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        sanitised = self(flat)
        for p, chunk in zip(params, sanitised.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(chunk.view_as(p.grad))
