"""Generators of the paper (appendix D.3): conditional DCGAN, BigGAN-style, and DP-MERF's.

:func:`build_generator` picks the class (:data:`GENERATORS`) from
``GeneratorConfig.architecture`` and ``image_size``; generator.pt stores
``GeneratorConfig.to_dict()``. An unconditional generator has ``num_classes = 1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class GeneratorConfig:
    """Sizes of the conditional DCGAN (defaults: MNIST / Fashion-MNIST in the paper)."""

    num_classes: int = 10
    latent_dim: int = 12
    embed_dim: int = 4
    channels: tuple[int, ...] = (256, 128, 64)
    out_channels: int = 1
    architecture: str = "dcgan"  # dcgan | biggan | merf (see GENERATORS)
    image_size: int = 28  # output height = width

    def to_dict(self) -> dict:
        return {**asdict(self), "channels": list(self.channels)}

    @classmethod
    def from_dict(cls, d: dict) -> GeneratorConfig:
        """From :meth:`to_dict`'s dict (generator.pt's ``model_config``): every field given."""
        missing = sorted(set(cls.__dataclass_fields__) - set(d))
        if missing:
            raise ValueError(f"generator model_config lacks {missing}")
        return cls(**{**d, "channels": tuple(d["channels"])})

    @classmethod
    def from_settings(
        cls, settings, num_classes: int, image_shape: tuple[int, ...]
    ) -> GeneratorConfig:
        """The generator ``settings`` name (sizes, ``generator`` kind) for ``num_classes``
        classes and images ``image_shape`` [C,H,W]: channels and size come from the data."""
        return cls(
            num_classes=num_classes,
            latent_dim=settings.latent_dim,
            embed_dim=settings.embed_dim,
            channels=settings.channels,
            out_channels=image_shape[0],
            architecture=settings.generator,
            image_size=image_shape[1],
        )


#: DCGAN image size -> (kernel, stride, padding) of its four transposed convolutions.
DCGAN_LAYERS: dict[int, tuple[tuple[int, int, int], ...]] = {
    28: ((7, 1, 0), (4, 2, 1), (4, 2, 1), (3, 1, 1)),
    32: ((4, 1, 0), (4, 2, 1), (4, 2, 1), (4, 2, 1)),
    # The standard DCGAN stack (Radford et al. 2016): 1 -> 4 -> 8 -> 16 -> 32 -> 64.
    64: ((4, 1, 0), (4, 2, 1), (4, 2, 1), (4, 2, 1), (4, 2, 1)),
}


def dcgan_widths(image_size: int) -> int:
    """How many hidden widths (``channels``) the DCGAN at this image size takes."""
    return len(DCGAN_LAYERS[image_size]) - 1


class ConditionalDCGAN(nn.Module):
    """Maps (z [N, latent_dim] in [0,1], labels [N] int64) to images [N, C, S, S] in [-1, 1],
    S = ``config.image_size`` (a key of :data:`DCGAN_LAYERS`)."""

    def __init__(self, config: GeneratorConfig = GeneratorConfig()):
        super().__init__()
        if config.image_size not in DCGAN_LAYERS:
            raise ValueError(f"no dcgan layout for {config.image_size}x{config.image_size} images")
        widths_needed = dcgan_widths(config.image_size)
        if len(config.channels) != widths_needed:
            raise ValueError(
                f"channels must list {widths_needed} widths at {config.image_size}x"
                f"{config.image_size}, got {list(config.channels)}"
            )
        self.config = config
        # The embedding is created (and initialised from the global RNG) before the
        # convolutions: that order is what makes a seeded generator reproducible.
        self.embedding = nn.Embedding(config.num_classes, config.embed_dim)
        widths = [config.latent_dim + config.embed_dim, *config.channels, config.out_channels]
        layers: list[nn.Module] = []
        for c_in, c_out, (kernel, stride, padding) in zip(
            widths[:-1], widths[1:], DCGAN_LAYERS[config.image_size], strict=True
        ):
            layers += [nn.ConvTranspose2d(c_in, c_out, kernel, stride, padding), nn.ReLU()]
        layers[-1] = nn.Tanh()
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.cat([z, self.embedding(labels)], dim=1)
        return self.net(h[:, :, None, None])

    def sample_inputs(
        self,
        num: int,
        generator: torch.Generator | None = None,
        device: torch.device | None = None,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw z ~ Uniform(0,1)^latent_dim and labels uniform over classes (paper Algorithm 1),
        into ``out`` = (z [num, latent_dim], labels [num] int64) if given (a sweep's buffer)."""
        device = device or next(self.parameters()).device
        z_out, labels_out = out or (None, None)
        z = torch.rand(num, self.config.latent_dim, generator=generator, device=device, out=z_out)
        labels = torch.randint(
            0, self.config.num_classes, (num,), generator=generator, device=device, out=labels_out
        )
        return z, labels


def _sn(module: nn.Module) -> nn.Module:
    return nn.utils.parametrizations.spectral_norm(module)


class ResBlock(nn.Module):
    """BigGAN-style residual block without batch norm, all layers spectrally normalised.

    main:     ReLU -> [upsample x2] -> conv3x3 -> ReLU -> conv3x3 -> ReLU -> conv3x3
    shortcut: [upsample x2] -> [conv1x1 when the width changes]
    """

    def __init__(self, c_in: int, c_out: int, upsample: bool):
        super().__init__()
        self.upsample = upsample
        self.conv1 = _sn(nn.Conv2d(c_in, c_out, 3, 1, 1))
        self.conv2 = _sn(nn.Conv2d(c_out, c_out, 3, 1, 1))
        self.conv3 = _sn(nn.Conv2d(c_out, c_out, 3, 1, 1))
        self.shortcut = _sn(nn.Conv2d(c_in, c_out, 1)) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        h = self.conv1(torch.relu(x))
        h = self.conv2(torch.relu(h))
        h = self.conv3(torch.relu(h))
        return h + self.shortcut(x)


class ConditionalBigGAN(nn.Module):
    """BigGAN-style generator for 32x32 images (paper appendix D.3, CelebA).

    [z | embedding(label)] -> SN-Linear -> c0 x 4 x 4 -> four :class:`ResBlock` of widths
    ``channels`` (4 -> 8 -> 16 -> 32 -> 32 px) -> ReLU -> SN conv3x3 -> tanh. No batch norm
    (it would mix the samples of a batch).
    """

    def __init__(self, config: GeneratorConfig):
        super().__init__()
        if len(config.channels) != 4:
            raise ValueError(f"biggan channels must list 4 block widths, got {config.channels}")
        self.config = config
        widths = config.channels
        self.embedding = nn.Embedding(config.num_classes, config.embed_dim)
        self.linear = _sn(nn.Linear(config.latent_dim + config.embed_dim, widths[0] * 16))
        inputs = (widths[0], *widths[:-1])
        self.blocks = nn.Sequential(*(ResBlock(inputs[i], widths[i], i < 3) for i in range(4)))
        self.out = _sn(nn.Conv2d(widths[-1], config.out_channels, 3, 1, 1))

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.linear(torch.cat([z, self.embedding(labels)], dim=1))
        h = self.blocks(h.view(len(h), -1, 4, 4))
        return torch.tanh(self.out(torch.relu(h)))

    sample_inputs = ConditionalDCGAN.sample_inputs


class MerfGenerator(nn.Module):
    """DP-MERF's convolutional conditional generator (``code_balanced/models_gen.ConvCondGen``),
    28x28 or 32x32 (``architecture: merf``). Maps (z [N, latent_dim] in [0,1], labels [N])
    to images [N, C, S, S] in [-1, 1]:

    [Φ⁻¹(z), onehot(label)] -> two Linear+BN+ReLU -> [c2, S/4, S/4] -> two (bilinear x2,
    Conv5x5) -> sigmoid -> 2·(·) − 1; ``channels`` = (c1, c2, c3), DP-MERF's (200, 16, 8).
    """

    def __init__(self, config: GeneratorConfig = GeneratorConfig()):
        super().__init__()
        if len(config.channels) != 3:
            raise ValueError(f"merf channels must list 3 widths, got {list(config.channels)}")
        self.config = config
        c1, c2, c3 = config.channels
        self.hw = config.image_size // 4
        self.fc = nn.Sequential(
            nn.Linear(config.latent_dim + config.num_classes, c1),
            nn.BatchNorm1d(c1),
            nn.ReLU(),
            nn.Linear(c1, c2 * self.hw * self.hw),
            nn.BatchNorm1d(c2 * self.hw * self.hw),
            nn.ReLU(),
        )
        self.conv = nn.Sequential(
            nn.UpsamplingBilinear2d(scale_factor=2),
            nn.Conv2d(c2, c3, 5, padding=2),
            nn.ReLU(),
            nn.UpsamplingBilinear2d(scale_factor=2),
            nn.Conv2d(c3, config.out_channels, 5, padding=2),
        )

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        u = torch.special.ndtri(z.clamp(1e-6, 1 - 1e-6))
        onehot = nn.functional.one_hot(labels, self.config.num_classes).to(u.dtype)
        h = self.fc(torch.cat([u, onehot], dim=1))
        x = self.conv(h.view(len(h), -1, self.hw, self.hw))
        return 2 * torch.sigmoid(x) - 1

    sample_inputs = ConditionalDCGAN.sample_inputs


#: (architecture, image size) -> generator class.
GENERATORS = {("dcgan", size): ConditionalDCGAN for size in DCGAN_LAYERS} | {
    ("biggan", 32): ConditionalBigGAN,
    ("merf", 28): MerfGenerator,
    ("merf", 32): MerfGenerator,
}


def build_generator(config: GeneratorConfig) -> nn.Module:
    """The generator a :class:`GeneratorConfig` describes (also rebuilds one from generator.pt)."""
    key = (config.architecture, config.image_size)
    if key not in GENERATORS:
        valid = ", ".join(f"{a} at {s}x{s}" for a, s in GENERATORS)
        raise ValueError(f"no {key[0]} generator for {key[1]}x{key[1]} images (have: {valid})")
    return GENERATORS[key](config)


#: How the generator computes while it trains (config key ``precision``).
PRECISIONS = ("fp32", "tf32", "bf16")


class GeneratorPrecision:
    """Arithmetic of the generator's forward and backward passes during training.

    ``fp32``: IEEE float32 (cuDNN TF32 off); ``tf32``: CUDA convolutions may use TF32;
    ``bf16``: the forward pass under ``torch.autocast(bfloat16)``, weights float32. The
    Sinkhorn solve, clipping and noise are always float32: the guarantee is unchanged.
    """

    def __init__(self, precision: str, device: torch.device):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision, self.device = precision, device

    def step(self):
        """Around the whole step (forward and backward): cuDNN's TF32 switch (CUDA)."""
        if self.device.type == "cuda":
            return cudnn_tf32(self.precision == "tf32")
        return nullcontext()

    def forward(self):
        """Around the generator's forward pass: bfloat16 autocast for ``bf16`` (no
        cast-weight cache, as CUDA graph capture requires)."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)
        return nullcontext()


@contextmanager
def cudnn_tf32(allowed: bool) -> Iterator[None]:
    """cuDNN convolutions may use TF32 inside the block iff ``allowed`` (process-wide,
    so autograd's backward threads too); restored after."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9
        flags, name, value = conv, "fp32_precision", "tf32" if allowed else "ieee"
    else:
        flags, name, value = torch.backends.cudnn, "allow_tf32", allowed
    saved = getattr(flags, name)
    setattr(flags, name, value)
    try:
        yield
    finally:
        setattr(flags, name, saved)
