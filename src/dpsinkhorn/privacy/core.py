"""Privacy: the image-gradient Gaussian mechanism (and a parameter-gradient baseline), accounting.

Mechanism (one training step), the version this project implements:

* Data and adjacency. The private dataset holds N records (image, label).
  Neighbouring datasets differ by adding or removing one record.
* Sampling. Each step draws the real batch Y by Poisson sampling: every record
  is included independently with probability q = B / N. The generated batch X
  always has n + n' rows (n = B, n' = floor(n p)), whatever |Y| is, so its size
  never depends on private data. |Y| = 0 is a legal draw.
* Query. G = ∇_X S(X, Y) [n + n', D]. Only the block G[0:n] depends on Y; rows
  [n:n+n'] enter S only through the debiasing term W(X[0:n], X[n':n+n']).
* Clipping ``batch`` (default, paper Algorithm 1). G[0:n] is clipped as ONE
  vector to L2 norm Δ. Adding or removing one record changes Y and hence the
  clipped block by at most 2Δ in L2 norm: sensitivity s = 2Δ. The noise is
  N(0, (2Δσ)²) per element, so the noise multiplier (noise std / sensitivity) is σ.
* Clipping ``per_sample``. Each row of G[0:n] is clipped to Δ; the block norm is
  at most Δ√n, so s = 2Δ√n and, with the same noise std 2Δσ, the noise
  multiplier is σ/√n. The accountant must be given σ/√n. (The paper's appendix
  instead composes n "per-row" mechanisms that share one Poisson sample, which
  is not a valid analysis; we never do that.)
* Rows [n:n+n'] are clipped to Δ (one vector in ``batch`` mode, per row in
  ``per_sample`` mode) and receive no noise: they are a function of X alone.
* Release. The generator update is post-processing of the sanitised gradient
  (and of X, which does not depend on data), so each step is one Poisson
  subsampled Gaussian mechanism with rate q and noise multiplier z (above);
  T steps compose adaptively.

Baseline ``perturbation: parameter`` (paper Table 2, ``ParameterGradientSanitizer``):
noise on the generator's parameter gradient instead of the image gradient. The
query is the whole parameter gradient g = ∇_θ S (all parameters, one vector),
which depends on Y through every row of X. It is clipped as ONE vector to L2 norm
Δ, so, under the same add/remove-one adjacency and Poisson sampling, neighbouring
batches move the clipped vector by at most 2Δ: sensitivity 2Δ. Each element gets
N(0, (2Δσ)²) noise: noise multiplier σ, the same accounting as above. Only
``clipping: batch`` exists for it (there are no per-record rows to clip).

Accounting (``PrivacyAccountant``): dp-accounting's RDP accountant (default) or
PLD accountant on ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` composed once
per step. ``paper_convention_epsilon`` reproduces the numbers the paper reports
(classic TF-Privacy ``compute_rdp(q, σ, T·n)``) for comparison only: it is not a
valid guarantee for this mechanism.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import secrets
import struct
from collections.abc import Callable, Sequence

import dp_accounting
import numpy as np
import torch
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

ACCOUNTANTS = ("rdp", "pld")
CLIPPING_MODES = ("batch", "per_sample")

# ---------------------------------------------------------------------------
# Randomness of the mechanism: a secret key per run (or a public one, reproducible mode)
# ---------------------------------------------------------------------------

#: Bits of operating-system randomness behind every private run's noise and Poisson draws.
SECRET_KEY_BITS = 256
#: ``guarantee`` in privacy.json of a run whose noise seed is derived from the config.
NO_GUARANTEE_PUBLIC_SEED = "none: the noise seed is public"
_MT_WORDS = 624  # MT19937 state words (CPU generator)
_MT_STATE_OFFSET = 24  # byte offset of the state words in torch's CPU generator state


def secret_noise_key() -> bytes:
    """A fresh 256-bit key from the operating system (``secrets``); never stored.

    What a resume needs is the generator's state, which lives in the private
    workspace checkpoint only."""
    return secrets.token_bytes(SECRET_KEY_BITS // 8)


def public_noise_key(seed: int, experiment: str) -> bytes:
    """The key of a ``reproducible: true`` run: a hash of the config seed and the
    experiment name, so two experiments of one config never share noise, but anyone
    with the config can recompute it (no privacy guarantee)."""
    text = f"dpsinkhorn reproducible noise|{int(seed)}|{experiment}"
    return hashlib.sha256(text.encode()).digest()


def keyed_generator(key: bytes, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` whose whole state is derived from ``key``.

    ``manual_seed`` takes only 64 bits, so the state is written directly. CPU
    (MT19937): all 624 32-bit state words come from SHAKE-256(key), i.e. the key's
    full entropy (256 bits for :func:`secret_noise_key`). CUDA (Philox4x32): torch's
    state is a 64-bit key and a counter offset (a non-negative int64, multiple of 4),
    so 64 + 61 = 125 bits of the key reach it; other devices: the 64-bit seed only.
    The same key always gives the same stream (reproducible mode); distinct keys give
    independent-looking streams.
    """
    if len(key) < 16:
        raise ValueError(f"noise key must have at least 128 bits, got {8 * len(key)}")
    device = torch.device(device)
    generator = torch.Generator(device=device)
    stream = hashlib.shake_256(b"dpsinkhorn generator state|" + key)
    if device.type == "cpu":
        generator.manual_seed(0)  # a valid state to overwrite: seeded, left = 1, next = 0
        state = generator.get_state().clone()
        words = np.frombuffer(stream.digest(4 * _MT_WORDS), dtype="<u4").astype("<u8")
        if not words.any():  # the all-zero MT state is degenerate (probability 2^-19968)
            words[0] = 1
        state[:8] = 0  # initial_seed(): not the key
        end = _MT_STATE_OFFSET + 8 * _MT_WORDS
        state[_MT_STATE_OFFSET:end] = torch.from_numpy(words.view(np.uint8).copy())
        generator.set_state(state)
        return generator
    seed, offset = struct.unpack("<QQ", stream.digest(16))
    generator.manual_seed(seed)  # Philox key: 64 bits
    if device.type == "cuda":
        # Philox counter offset: int64, a multiple of 4 (62 more bits)
        generator.set_offset(((offset >> 2) & (2**61 - 1)) * 4)
    return generator


def rng_state_bytes(generator: torch.Generator) -> bytes:
    """The generator's state as plain bytes (what a checkpoint stores: ``torch.load``'s
    ``map_location`` never moves bytes, so the state stays a CPU ByteTensor for
    ``set_state`` whatever device the rest of the checkpoint is mapped to)."""
    return bytes(generator.get_state().cpu().numpy().tobytes())


def rng_state_tensor(state) -> torch.Tensor:
    """``state`` (bytes, or a ByteTensor on any device, as older checkpoints hold it)
    as the CPU ByteTensor that ``torch.Generator.set_state`` requires."""
    if isinstance(state, bytes | bytearray):
        return torch.frombuffer(bytearray(state), dtype=torch.uint8)
    if isinstance(state, torch.Tensor):
        if state.is_meta:
            raise ValueError("checkpoint RNG state was loaded on the meta device: no data")
        return state.detach().to("cpu", torch.uint8).contiguous()
    kind = type(state).__name__
    raise ValueError(f"checkpoint RNG state must be bytes or a ByteTensor, got {kind}")


# ---------------------------------------------------------------------------
# Mechanism: clip + Gaussian noise on the gradient w.r.t. the generated images
# ---------------------------------------------------------------------------


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


def _clip_block(block: torch.Tensor, clip: float, per_row: bool) -> torch.Tensor:
    """Scale ``block`` [k, ...] so its L2 norm (or each row's) is at most ``clip``."""
    if block.shape[0] == 0:
        return block
    if per_row:
        norms = block.flatten(1).norm(dim=1).view(-1, *([1] * (block.ndim - 1)))
    else:
        norms = block.norm()
    return block * (clip / (norms + 1e-12)).clamp(max=1.0)


class ImageGradientSanitizer:
    """Clips and noises G = ∇_X S, the gradient w.r.t. the generated batch [n + n', ...].

    Gaussian mechanism on G[0:n] under add/remove-one adjacency; see the module
    docstring for sensitivity (2Δ batch / 2Δ√n per_sample) and noise multiplier
    (σ / σ/√n). Noise std per element: 2Δσ. ``generator`` makes the noise
    reproducible (its state is checkpointed by the trainer).
    """

    def __init__(
        self,
        n: int,
        n_prime: int,
        clip: float,
        sigma: float,
        clipping: str = "batch",
        generator: torch.Generator | None = None,
    ):
        check_positive("clip", clip)
        self.noise_multiplier = noise_multiplier(sigma, n, clipping)
        self.n, self.n_prime = n, n_prime
        self.clip, self.sigma, self.clipping = float(clip), float(sigma), clipping
        self.generator = generator

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to each element of G[0:n]: 2Δσ."""
        return 2.0 * self.clip * self.sigma

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped block G[0:n] under add/remove-one adjacency."""
        per_sample = self.clipping == "per_sample"
        return 2.0 * self.clip * (math.sqrt(self.n) if per_sample else 1.0)

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        """Return the sanitised gradient (same shape as ``grad`` [n + n', ...])."""
        if grad.shape[0] != self.n + self.n_prime:
            raise ValueError(f"expected {self.n + self.n_prime} rows, got {grad.shape[0]}")
        per_row = self.clipping == "per_sample"
        private = _clip_block(grad[: self.n], self.clip, per_row)
        noise = torch.randn(
            private.shape, generator=self.generator, device=grad.device, dtype=grad.dtype
        )
        debias = _clip_block(grad[self.n :], self.clip, per_row)
        return torch.cat([private + self.noise_std * noise, debias])


class StackedImageGradientSanitizer:
    """K runs' :class:`ImageGradientSanitizer` applied at once to stacked gradients.

    For a sweep (``sweep.SweepTrainer``): run k's gradient G_k [n + n'_k, ...] sits in
    ``grads[k, :n + n'_k]`` of a zero-padded stack [K, rows, ...] (n shared, n'_k per
    run). Run k gets exactly run k's mechanism, read from ``sanitizers[k]``: G_k[0:n]
    clipped to Δ_k (as one vector, or per row for ``per_sample``) plus N(0, (2Δ_kσ_k)²)
    noise per element, drawn from run k's generator with the shape and in the order of
    ``ImageGradientSanitizer.__call__``; rows [n:n+n'_k] clipped to Δ_k, no noise. So the
    adjacency, sensitivity and noise multiplier of run k are those of its sanitiser (see
    the module docstring), and its accountant is unchanged. Runs never mix: every norm,
    scale and noise draw is per run. ``None`` passes a run's rows through unchanged
    (non-private, or ``perturbation: parameter``). Padding rows stay zero.
    Only the noise draws loop over runs (one operation each); the rest is batched.
    """

    def __init__(
        self,
        sanitizers: Sequence[ImageGradientSanitizer | None],
        n: int,
        rows: int,
        device: torch.device,
    ):
        for k, s in enumerate(sanitizers):
            if s is not None and (s.n != n or n + s.n_prime > rows):
                raise ValueError(
                    f"run {k}: its sanitiser expects {s.n} + {s.n_prime} rows, "
                    f"the stack has n = {n} and {rows} rows"
                )
        self.sanitizers, self.n = list(sanitizers), n
        row = torch.arange(rows, device=device)
        n_prime = torch.tensor([s.n_prime if s else 0 for s in sanitizers], device=device)
        self.is_private = row < n  # [rows]
        self.private_rows = self.is_private.float()
        self.debias_rows = ((row >= n) & (row[None] < n + n_prime[:, None])).float()  # [K, rows]
        # A run without a sanitiser: clip ∞ (scale 1), noise std 0.
        self.clip = torch.tensor([s.clip if s else math.inf for s in sanitizers], device=device)[
            :, None
        ]
        self.noise_std = torch.tensor(
            [s.noise_std if s else 0.0 for s in sanitizers], device=device
        )
        self.per_row = torch.tensor(
            [bool(s) and s.clipping == "per_sample" for s in sanitizers], device=device
        )[:, None]

    def __call__(self, grads: torch.Tensor) -> torch.Tensor:
        """Sanitised copy of ``grads`` [K, rows, ...] (float32)."""
        k, n = len(self.sanitizers), self.n
        if grads.shape[0] != k or grads.shape[1] != self.private_rows.shape[0]:
            raise ValueError(
                f"expected [{k}, {self.private_rows.shape[0]}, ...] gradients, "
                f"got {tuple(grads.shape)}"
            )
        row_norms = grads.flatten(2).norm(dim=2)  # [K, rows]
        squares = row_norms.square()
        private_norm = (squares * self.private_rows).sum(1, keepdim=True).sqrt()  # [K, 1]
        debias_norm = (squares * self.debias_rows).sum(1, keepdim=True).sqrt()
        block_norm = torch.where(self.is_private, private_norm, debias_norm)
        norms = torch.where(self.per_row, row_norms, block_norm)
        scale = (self.clip / (norms + 1e-12)).clamp(max=1.0)  # as _clip_block, per run
        clipped = grads * scale.view(*scale.shape, *([1] * (grads.ndim - 2)))
        noise = torch.zeros_like(grads[:, :n])
        for run, sanitizer in enumerate(self.sanitizers):
            if sanitizer is not None:  # = torch.randn(G_k[0:n].shape, generator=run k's)
                noise[run].normal_(generator=sanitizer.generator)
        std = self.noise_std.view(k, *([1] * (grads.ndim - 1)))
        return torch.cat([clipped[:, :n] + std * noise, clipped[:, n:]], dim=1)


PERTURBATIONS = ("image", "parameter")


class ParameterGradientSanitizer:
    """Clips and noises the generator's whole parameter gradient g = ∇_θ S (paper Table 2).

    Gaussian mechanism on g, ALL parameters' gradients concatenated into one vector,
    under add/remove-one adjacency with Poisson sampling. g is clipped as one vector
    to L2 norm Δ (``clip``); the clipped vectors of neighbouring batches differ by at
    most 2Δ, so the L2 sensitivity is 2Δ. Each element gets N(0, (2Δσ)²) noise, so
    the noise multiplier (noise std / sensitivity) is σ and the accounting is that
    of the image-gradient mechanism with ``clipping: batch`` (the only mode here).
    ``generator`` makes the noise reproducible (its state is checkpointed by the
    trainer). Call :meth:`apply` after ``loss.backward()`` and before the optimiser step.
    """

    clipping = "batch"

    def __init__(self, clip: float, sigma: float, generator: torch.Generator | None = None):
        check_positive("clip", clip)
        check_positive("sigma", sigma)
        self.clip, self.sigma = float(clip), float(sigma)
        self.generator = generator

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to each element of g: 2Δσ."""
        return 2.0 * self.clip * self.sigma

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped gradient vector under add/remove-one adjacency: 2Δ."""
        return 2.0 * self.clip

    @property
    def noise_multiplier(self) -> float:
        """Noise std / sensitivity = σ."""
        return self.sigma

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        """Return clip_Δ(grad) + N(0, (2Δσ)²) elementwise; ``grad`` is a flat vector [P]."""
        if grad.ndim != 1:
            raise ValueError(f"expected a flat gradient vector, got shape {tuple(grad.shape)}")
        clipped = _clip_block(grad, self.clip, per_row=False)
        noise = torch.randn(
            clipped.shape, generator=self.generator, device=grad.device, dtype=grad.dtype
        )
        return clipped + self.noise_std * noise

    def apply(self, parameters) -> None:
        """Sanitise the ``.grad`` of ``parameters`` in place, as one concatenated vector.

        A parameter without a gradient counts as a zero gradient and is noised too,
        so that every released coordinate is covered by the mechanism.
        """
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        sanitised = self(flat)
        for p, chunk in zip(params, sanitised.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(chunk.view_as(p.grad))


# ---------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def check_count(name: str, value: int, minimum: int = 0) -> None:
    """``value`` must be an integer >= ``minimum`` (steps, batch size)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_rate(q: float) -> None:
    if not (isinstance(q, int | float) and math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"sampling rate q must be in (0, 1], got {q!r}")


def check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _step_event(z: float, q: float) -> dp_accounting.DpEvent:
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))


def _new_accountant(name: str) -> dp_accounting.PrivacyAccountant:
    if name == "rdp":
        return rdp_lib.RdpAccountant()
    if name == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")


#: Smallest noise multiplier the PLD accountant is asked about. Its discretised privacy
#: loss grows as z falls: measured at q = 1/1200, 160,000 steps, z = 0.1 takes 6.7 GB and
#: 67 s; z = 1e-3 (where the σ search used to start) asks for tens of GiB.
PLD_MIN_NOISE_MULTIPLIER = 0.2
#: Smallest noise multiplier a σ search tries (any accountant).
MIN_NOISE_MULTIPLIER = 1e-2


def check_noise_multiplier(z: float, accountant: str) -> None:
    check_positive("noise multiplier", z)
    if accountant == "pld" and z < PLD_MIN_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise multiplier {z:.4g} is below {PLD_MIN_NOISE_MULTIPLIER}, the smallest the "
            "PLD accountant handles in bounded memory; use accountant rdp"
        )


def compute_epsilon(z: float, q: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (rate q, noise multiplier z)."""
    check_noise_multiplier(z, accountant)
    check_rate(q)
    check_delta(delta)
    check_count("steps", steps)
    if steps == 0:
        return 0.0
    acc = _new_accountant(accountant)
    acc.compose(_step_event(z, q), int(steps))
    return float(acc.get_epsilon(delta))


def max_steps(
    target_epsilon: float, z: float, q: float, delta: float, accountant: str = "rdp"
) -> int:
    """Largest T with ε(T) ≤ target_epsilon. Raises ValueError if even T = 1 exceeds it."""
    check_positive("target epsilon", target_epsilon)

    def eps(t: int) -> float:
        return compute_epsilon(z, q, t, delta, accountant)

    if eps(1) > target_epsilon:
        raise ValueError(
            f"target epsilon {target_epsilon} is unreachable: a single step already costs "
            f"ε = {eps(1):.4g} (noise multiplier {z}, q = {q}, δ = {delta})"
        )
    lo, hi = 1, 2
    while eps(hi) <= target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 10**12:
            raise ValueError("target epsilon allows more than 1e12 steps; check the inputs")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) <= target_epsilon else (lo, mid)
    return lo


def solve_noise_multiplier(
    target_epsilon: float, q: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """Smallest noise multiplier z (to 1e-4 relative) with ε(z, T) ≤ target_epsilon."""
    check_positive("target epsilon", target_epsilon)
    check_count("steps", steps, minimum=1)
    floor = PLD_MIN_NOISE_MULTIPLIER if accountant == "pld" else MIN_NOISE_MULTIPLIER
    return _bisect_noise(
        lambda z: compute_epsilon(z, q, steps, delta, accountant), target_epsilon, floor
    )


def _bisect_noise(
    eps_of: Callable[[float], float], target: float, floor: float = MIN_NOISE_MULTIPLIER
) -> float:
    """Smallest z in [floor, 1e4] with eps_of(z) ≤ target (to 1e-4 relative).

    The bracket is found from z = 1 outwards (up by doubling, down by halving to
    ``floor``), so the accountant is never asked about a needlessly small z."""
    lo, hi = 1.0, 1.0
    if eps_of(hi) > target:
        while eps_of(hi) > target:
            lo, hi = hi, hi * 2
            if hi > 1e4:
                raise ValueError(
                    f"target epsilon {target} is unreachable with noise multiplier ≤ 1e4"
                )
    else:
        while eps_of(lo) <= target:
            if lo <= floor:
                return floor  # already within the target at the smallest z searched
            lo, hi = max(lo / 2, floor), lo
    while (hi - lo) / hi > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_of(mid) <= target else (mid, hi)
    return hi


# Orders of the classic TF-Privacy examples (paper convention).
PAPER_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def paper_convention_epsilon(q: float, sigma: float, steps: int, n: int, delta: float) -> float:
    """What the paper's numbers correspond to. NOT a valid guarantee for this mechanism.

    compute_rdp(q, σ, steps·n) over PAPER_ORDERS (σ used as the noise multiplier,
    composed steps·n times), then ε = min over orders of rdp − log(δ)/(order − 1).
    """
    check_rate(q)
    check_positive("sigma", sigma)
    check_delta(delta)
    check_count("steps", steps)
    check_count("batch size", n, minimum=1)
    rdp = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, PAPER_ORDERS) * steps * n
    return float(np.min(rdp - math.log(delta) / (PAPER_ORDERS - 1)))


class PrivacyAccountant:
    """Ledger of the privacy spent by training; ``state_dict`` travels in checkpoints.

    Every call to ``step()`` records one Poisson-subsampled Gaussian mechanism
    with this accountant's rate q and noise multiplier z. Segments with other
    (q, z) (e.g. a resume with another σ) are kept separately and composed.
    """

    def __init__(
        self, sample_rate: float, noise_multiplier: float, delta: float, kind: str = "rdp"
    ):
        check_rate(sample_rate)
        check_positive("noise multiplier", noise_multiplier)
        check_delta(delta)
        if kind not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")
        self.sample_rate, self.noise_multiplier = float(sample_rate), float(noise_multiplier)
        self.delta, self.kind = float(delta), kind
        self.segments: list[list[float]] = []  # [q, z, steps]

    def step(self, num_steps: int = 1) -> None:
        """Record ``num_steps`` more steps of the current mechanism."""
        seg = self.segments[-1] if self.segments else None
        if seg and seg[0] == self.sample_rate and seg[1] == self.noise_multiplier:
            seg[2] += num_steps
        else:
            self.segments.append([self.sample_rate, self.noise_multiplier, num_steps])

    @property
    def steps(self) -> int:
        return int(sum(s[2] for s in self.segments))

    def epsilon(self, delta: float | None = None) -> float:
        """ε of everything recorded so far at ``delta`` (default: the accountant's δ)."""
        if self.steps == 0:
            return 0.0
        acc = _new_accountant(self.kind)
        for q, z, t in self.segments:
            acc.compose(_step_event(z, q), int(t))
        return float(acc.get_epsilon(self.delta if delta is None else delta))

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "delta": self.delta,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "segments": [list(s) for s in self.segments],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind or state["delta"] != self.delta:
            raise ValueError(
                f"checkpoint ledger uses accountant {state['kind']} at δ={state['delta']}, "
                f"this run uses {self.kind} at δ={self.delta}"
            )
        self.segments = [list(s) for s in state["segments"]]

    @staticmethod
    def describe() -> str:
        return f"dp-accounting {importlib.metadata.version('dp-accounting')}"


# ---------------------------------------------------------------------------
# Resolving a training configuration: σ and steps from a target ε
# ---------------------------------------------------------------------------


CONVENTIONS = ("sound", "paper")


def resolve_budget(
    *,
    sigma: float | None,
    steps: int | None,
    target_epsilon: float | None,
    q: float,
    batch_size: int,
    delta: float,
    clipping: str = "batch",
    accountant: str = "rdp",
    convention: str = "sound",
) -> tuple[float, int]:
    """Return (σ, steps) from any two of σ, steps, target ε.

    σ and steps given: used as they are (if a target ε is also given, it must hold).
    σ and target ε: the most steps within it. steps and target ε: the smallest σ
    reaching it. ``convention`` says how the target ε is counted: ``sound`` (the
    accountant of this mechanism, noise multiplier from σ and ``clipping``) or
    ``paper`` (:func:`paper_convention_epsilon`, σ as the noise multiplier, steps·n
    compositions; not a valid guarantee, for reproducing the paper's settings).
    Training always records the sound ε, whichever convention solved the budget.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    check_count("batch size", batch_size, minimum=1)
    if steps is not None:
        check_count("steps", steps, minimum=1)
    if target_epsilon is not None:
        check_positive("target epsilon", target_epsilon)  # rejects NaN and inf too
    if sigma is not None:
        noise_multiplier(sigma, batch_size, clipping)  # validates sigma and clipping

    def eps_of(s: float, t: int) -> float:
        if convention == "paper":
            return paper_convention_epsilon(q, s, t, batch_size, delta)
        return compute_epsilon(noise_multiplier(s, batch_size, clipping), q, t, delta, accountant)

    if sigma is not None:
        if steps is None:
            if target_epsilon is None:
                raise ValueError("give steps or target_epsilon together with sigma")
            check_positive("target epsilon", target_epsilon)
            if convention == "paper":
                steps = _max_steps_paper(eps_of, sigma, target_epsilon)
            else:
                z = noise_multiplier(sigma, batch_size, clipping)
                steps = max_steps(target_epsilon, z, q, delta, accountant)
        elif target_epsilon is not None:
            eps = eps_of(sigma, steps)
            if eps > target_epsilon * (1 + 1e-9):
                raise ValueError(
                    f"target epsilon {target_epsilon} ({convention} convention) is "
                    f"unreachable: sigma={sigma} for {steps} steps gives ε={eps:.4g}"
                )
        return float(sigma), int(steps)
    if steps is None or target_epsilon is None:
        raise ValueError("sigma is null: give both steps and target_epsilon to solve for it")
    if convention == "paper":
        check_positive("target epsilon", target_epsilon)
        check_positive("steps", steps)
        return _bisect_noise(lambda s: eps_of(s, steps), target_epsilon), int(steps)
    z = solve_noise_multiplier(target_epsilon, q, steps, delta, accountant)
    return sigma_from_noise_multiplier(z, batch_size, clipping), int(steps)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def privacy_report(
    *,
    q: float,
    delta: float,
    batch_size: int,
    sigma: float | None = None,
    steps: int | None = None,
    epsilon: float | None = None,
    convention: str = "sound",
    accountant: str = "rdp",
    clipping: str = "batch",
) -> dict:
    """The numbers printed by ``dpsinkhorn privacy`` (see its --help)."""
    check_rate(q)
    check_delta(delta)
    if sigma is not None:
        check_positive("sigma", sigma)
    if convention == "paper" and sigma is None and (steps is None or epsilon is None):
        raise ValueError("without --sigma give both --steps and --epsilon")
    sigma, steps = resolve_budget(
        sigma=sigma, steps=steps, target_epsilon=epsilon, q=q, batch_size=batch_size,
        delta=delta, clipping=clipping, accountant=accountant, convention=convention,
    )  # fmt: skip
    if convention == "sound":
        z = noise_multiplier(sigma, batch_size, clipping)
        eps = compute_epsilon(z, q, steps, delta, accountant)
        method = (
            f"Poisson-subsampled Gaussian, {accountant.upper()} ({PrivacyAccountant.describe()})"
        )
    else:
        z, eps = sigma, paper_convention_epsilon(q, sigma, steps, batch_size, delta)
        method = "paper convention: compute_rdp(q, sigma, steps*n), classic conversion"
    return {
        "epsilon": eps,
        "delta": delta,
        "steps": int(steps),
        "sigma": float(sigma),
        "noise_multiplier": float(z),
        "q": q,
        "batch_size": batch_size,
        "clipping": clipping,
        "convention": convention,
        "valid_guarantee": convention == "sound",
        "accounting": method,
    }


def _max_steps_paper(eps_of: Callable[[float, int], float], sigma: float, target: float) -> int:
    """Largest T with eps_of(σ, T) ≤ target (eps_of increasing in T)."""
    if eps_of(sigma, 1) > target:
        raise ValueError(
            f"target epsilon {target} is unreachable: a single step already costs "
            f"ε = {eps_of(sigma, 1):.4g} (paper convention, sigma {sigma})"
        )
    lo, hi = 1, 2
    while eps_of(sigma, hi) <= target:
        lo, hi = hi, hi * 2
        if hi > 10**12:
            raise ValueError("target epsilon allows more than 1e12 steps; check the inputs")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_of(sigma, mid) <= target else (lo, mid)
    return lo


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "privacy",
        help="(ε, δ) of DP-Sinkhorn training, or the steps / σ for a target ε",
        description="Prints one JSON object. Give --sigma with --steps (ε), --sigma with "
        "--epsilon (most steps), or --steps with --epsilon (solve σ).",
    )
    p.add_argument("--q", type=float, required=True, help="Poisson sampling rate B/N")
    p.add_argument("--sigma", type=float, help="noise scale σ (noise std 2Δσ)")
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="n = B generated cross rows")
    p.add_argument("--steps", type=int)
    p.add_argument("--epsilon", type=float, help="target ε")
    p.add_argument("--convention", choices=["sound", "paper"], default="sound")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp")
    p.add_argument("--clipping", choices=CLIPPING_MODES, default="batch")
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    if args.steps is None and args.epsilon is None:
        raise ValueError("give --steps, --epsilon, or both")
    report = privacy_report(
        q=args.q, delta=args.delta, batch_size=args.batch_size, sigma=args.sigma,
        steps=args.steps, epsilon=args.epsilon, convention=args.convention,
        accountant=args.accountant, clipping=args.clipping,
    )  # fmt: skip
    print(json.dumps(report))
    return 0
