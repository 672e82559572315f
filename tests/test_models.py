"""The DCGAN generator against a frozen reference: one class builds both image sizes, and a
seeded ``build_generator`` gives the same parameters (names, shapes, order, values) and the
same images as the two separate classes it replaced, so old generator.pt files load and
reproducible runs stay bit-identical.

The hashes were computed with the code before the merge of ``ConditionalDCGAN`` and
``ConditionalDCGAN32`` by the functions below.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from dpsinkhorn.models import (
    DCGAN_LAYERS,
    ConditionalDCGAN,
    GeneratorConfig,
    build_generator,
    dcgan_widths,
)

CONFIGS = {
    28: GeneratorConfig(),
    32: GeneratorConfig(num_classes=2, latent_dim=32, out_channels=3, image_size=32),
}

#: image size -> (state_dict sha256, sha256 of a float64 forward pass on a 1e-8 grid)
FROZEN = {
    28: (
        "d301591f1e75c80ab871ad9d7dd3ea607b74aa446311707cb8bba61671635a28",
        "49cb3817f11927e42fc51f307bde8500559a91884f02657385b50efc38ec3dd2",
    ),
    32: (
        "512d500fbf7ec94da082cd3af12b35ee732b5b89ae54ae309272e43c3827d0e3",
        "3afafd9d526b7ba55622d91c37db73ff2f07403346aa9340823aaf7ea99d25cd",
    ),
}

#: image size -> the state_dict layout (name, shape) of the old classes, in order.
OLD_LAYOUT = {
    28: [
        ("embedding.weight", (10, 4)),
        ("net.0.weight", (16, 256, 7, 7)),
        ("net.0.bias", (256,)),
        ("net.2.weight", (256, 128, 4, 4)),
        ("net.2.bias", (128,)),
        ("net.4.weight", (128, 64, 4, 4)),
        ("net.4.bias", (64,)),
        ("net.6.weight", (64, 1, 3, 3)),
        ("net.6.bias", (1,)),
    ],
    32: [
        ("embedding.weight", (2, 4)),
        ("net.0.weight", (36, 256, 4, 4)),
        ("net.0.bias", (256,)),
        ("net.2.weight", (256, 128, 4, 4)),
        ("net.2.bias", (128,)),
        ("net.4.weight", (128, 64, 4, 4)),
        ("net.4.bias", (64,)),
        ("net.6.weight", (64, 3, 4, 4)),
        ("net.6.bias", (3,)),
    ],
}


def state_sha(model: torch.nn.Module) -> str:
    """SHA-256 of every state_dict entry's name, shape, dtype and bytes, in order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def output_sha(model: torch.nn.Module) -> str:
    """SHA-256 of a seeded forward pass, computed in float64 and rounded to 1e-8 so that
    it does not depend on the CPU's float32 convolution kernels."""
    z, labels = model.sample_inputs(4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model.double()(z.double(), labels)
    return hashlib.sha256(torch.round(out * 1e8).to(torch.int64).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("size", [28, 32])
def test_seeded_dcgan_matches_the_frozen_reference(size):
    torch.manual_seed(1234)
    model = build_generator(CONFIGS[size])
    assert type(model) is ConditionalDCGAN
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == OLD_LAYOUT[size]
    assert state_sha(model) == FROZEN[size][0]
    assert output_sha(model) == FROZEN[size][1]


@pytest.mark.parametrize("size", [28, 32])
def test_dcgan_loads_an_old_layout_state_dict(size):
    old = {name: torch.randn(shape) for name, shape in OLD_LAYOUT[size]}
    model = build_generator(CONFIGS[size])
    model.load_state_dict(old, strict=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in old.items())
    assert model(*model.sample_inputs(2)).shape == (2, CONFIGS[size].out_channels, size, size)


def test_dcgan_layer_table():
    for size, layers in DCGAN_LAYERS.items():
        widths = (8,) * dcgan_widths(size)
        model = build_generator(GeneratorConfig(image_size=size, channels=widths))
        convs = [m for m in model.net if isinstance(m, torch.nn.ConvTranspose2d)]
        assert [(c.kernel_size[0], c.stride[0], c.padding[0]) for c in convs] == list(layers)
        assert [type(m).__name__ for m in model.net] == ["ConvTranspose2d", "ReLU"] * len(
            widths
        ) + ["ConvTranspose2d", "Tanh"]
    with pytest.raises(ValueError, match="no dcgan layout for 48x48"):
        ConditionalDCGAN(GeneratorConfig(image_size=48))
    with pytest.raises(
        ValueError, match=r"channels must list 4 widths at 64x64, got \[256, 128, 64\]"
    ):
        ConditionalDCGAN(GeneratorConfig(image_size=64))


#: The 64x64 DCGAN (pinned when it was added, not from an older class).
CONFIG_64 = {
    1: GeneratorConfig(num_classes=4, channels=(64, 32, 16, 8), image_size=64),
    3: GeneratorConfig(num_classes=1, channels=(64, 32, 16, 8), out_channels=3, image_size=64),
}
FROZEN_64 = {
    1: (
        "20b3c104d226f85854cdc1b744bf26827efd195d498ebe4e6ee0b675c9f9018b",
        "99befb32ea072e7f2dd866385a02d277307c76b368561ae26dd86d215f82a6b0",
    ),
    3: (
        "06cb495ce591deb4b598e6fd0bd2f8e0c1b6ff1104fcc3355dd2f601fb86342a",
        "9c3057e5354dc9002f303682d13ffbf30f2182cd4c9a895147317f3a78ea8162",
    ),
}


@pytest.mark.parametrize("out_channels", [1, 3])
def test_dcgan_64_shapes_and_frozen_hashes(out_channels):
    config = CONFIG_64[out_channels]
    torch.manual_seed(1234)
    model = build_generator(config)
    assert type(model) is ConditionalDCGAN
    z, labels = model.sample_inputs(5, generator=torch.Generator().manual_seed(3))
    images = model(z, labels)
    assert images.shape == (5, out_channels, 64, 64)
    assert images.abs().max() <= 1
    assert state_sha(model) == FROZEN_64[out_channels][0]
    assert output_sha(model) == FROZEN_64[out_channels][1]
