"""Conditional DCGAN generator of the paper (appendix D.3).

g(z, label): z ~ Uniform(0, 1)^latent_dim and a learned label embedding of size
embed_dim are concatenated and fed, as a 1x1 feature map, to four transposed
convolutions:

    ConvT(latent+embed -> 256, k7, s1, p0)   1x1  -> 7x7
    ConvT(256 -> 128, k4, s2, p1)            7x7  -> 14x14
    ConvT(128 -> 64,  k4, s2, p1)            14x14 -> 28x28
    ConvT(64 -> C,    k3, s1, p1)            28x28 -> 28x28

with ReLU between layers and tanh at the output, so images lie in [-1, 1].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class GeneratorConfig:
    """Sizes of the conditional DCGAN (defaults: MNIST / Fashion-MNIST in the paper)."""

    num_classes: int = 10
    latent_dim: int = 12
    embed_dim: int = 4
    channels: tuple[int, ...] = field(default=(256, 128, 64))
    out_channels: int = 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["channels"] = list(self.channels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> GeneratorConfig:
        return cls(**{**d, "channels": tuple(d["channels"])})


class ConditionalDCGAN(nn.Module):
    """Maps (z [N, latent_dim] in [0,1], labels [N] int64) to images [N, C, 28, 28] in [-1, 1]."""

    def __init__(self, config: GeneratorConfig = GeneratorConfig()):
        super().__init__()
        if len(config.channels) != 3:
            raise ValueError(f"channels must list 3 widths, got {list(config.channels)}")
        self.config = config
        c1, c2, c3 = config.channels
        self.embedding = nn.Embedding(config.num_classes, config.embed_dim)
        self.net = nn.Sequential(
            nn.ConvTranspose2d(config.latent_dim + config.embed_dim, c1, 7, 1, 0),
            nn.ReLU(),
            nn.ConvTranspose2d(c1, c2, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(c2, c3, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(c3, config.out_channels, 3, 1, 1),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.cat([z, self.embedding(labels)], dim=1)
        return self.net(h[:, :, None, None])

    def sample_inputs(
        self, num: int, generator: torch.Generator | None = None, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw z ~ Uniform(0,1)^latent_dim and labels uniform over classes (paper Algorithm 1)."""
        device = device or next(self.parameters()).device
        z = torch.rand(num, self.config.latent_dim, generator=generator, device=device)
        labels = torch.randint(
            0, self.config.num_classes, (num,), generator=generator, device=device
        )
        return z, labels
