"""Randomness of the mechanism: a secret key per run (or a public one, reproducible mode).

The key seeds one ``torch.Generator`` per run (:func:`keyed_generator`) that draws the
run's z, labels, Poisson samples and noise; checkpoints store that generator's state
as bytes (:func:`rng_state_bytes`), never the key.
"""

from __future__ import annotations

import hashlib
import secrets
import struct

import numpy as np
import torch

#: Bits of operating-system randomness behind every private run's noise and Poisson draws.
SECRET_KEY_BITS = 256
#: ``guarantee`` in privacy.json of a run whose noise seed is derived from the config.
NO_GUARANTEE_PUBLIC_SEED = "none: the noise seed is public"
_MT_WORDS = 624  # MT19937 state words (CPU generator)
_MT_STATE_OFFSET = 24  # byte offset of the state words in torch's CPU generator state


def secret_noise_key() -> bytes:
    """A fresh 256-bit key from the operating system (``secrets``); never stored (a resume
    needs only the generator's state, in the private checkpoint)."""
    return secrets.token_bytes(SECRET_KEY_BITS // 8)


def public_noise_key(seed: int, experiment: str) -> bytes:
    """The key of a ``reproducible: true`` run: a hash of the config seed and the
    experiment name, so two experiments of one config never share noise, but anyone
    with the config can recompute it (no privacy guarantee)."""
    text = f"dpsinkhorn reproducible noise|{int(seed)}|{experiment}"
    return hashlib.sha256(text.encode()).digest()


def keyed_generator(key: bytes, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` whose whole state is derived from SHAKE-256(key)
    (``manual_seed`` takes only 64 bits): all 624 MT19937 words on CPU; on CUDA the Philox
    key and counter offset (125 bits); elsewhere the 64-bit seed. Same key, same stream."""
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


def rng_state_tensor(state: bytes) -> torch.Tensor:
    """A checkpoint's RNG ``state`` (bytes, :func:`rng_state_bytes`) as the CPU ByteTensor
    that ``torch.Generator.set_state`` requires."""
    if not isinstance(state, bytes | bytearray):
        raise ValueError(f"checkpoint RNG state must be bytes, got {type(state).__name__}")
    return torch.frombuffer(bytearray(state), dtype=torch.uint8)
