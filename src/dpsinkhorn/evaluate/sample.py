"""Samples to evaluate: a trained generator's (read without running its pickle; balanced
labels, -1 if unconditional) or a "Real data" row's seeded subset of the training set."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.data.catalog import DATASETS
from dpsinkhorn.evaluate.pngs import UNCONDITIONAL_FOLDER
from dpsinkhorn.fileio import check_class_names, load_samples
from dpsinkhorn.models import GeneratorConfig, build_generator


def read_generator_file(path: Path) -> dict:
    """The dict stored in generator.pt (:func:`read_generator_bytes` of the file's bytes)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"generator not found: {path} (train the experiment first)")
    return read_generator_bytes(path.read_bytes(), str(path))


def read_generator_bytes(payload: bytes, where: str) -> dict:
    """The dict in generator.pt's bytes ``payload`` by ``torch.load(weights_only=True)``:
    anything but tensors and plain containers is refused in one line naming ``where``."""
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError (refused type), RuntimeError, EOFError, ...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"{where} is not a generator.pt that can be loaded safely ({type(err).__name__}: "
            f"{reason}); it was not loaded: only tensors and plain values are accepted"
        ) from err
    if not isinstance(state, dict) or not {"state_dict", "model_config"} <= set(state):
        raise ValueError(f"{where} is not a dpsinkhorn generator.pt (no state_dict/model_config)")
    return state


def generator_classes(state: dict) -> tuple[bool, tuple[str, ...]]:
    """(conditional, class names) of a generator.pt's dict: the declared ``class_names``,
    else the catalogue's names of its ``dataset``, else "0", "1", ...; an unconditional
    generator (``conditional: false``) has the one class ``unconditional``."""
    if state.get("conditional", True) is False:
        return False, (UNCONDITIONAL_FOLDER,)
    num_classes = GeneratorConfig.from_dict(state["model_config"]).num_classes
    names = state.get("class_names")
    if names is not None:  # from the file (it may come from elsewhere): checked
        names = check_class_names(names, "generator.pt class_names")
    elif state.get("dataset") in DATASETS:  # the catalogue's (e.g. "T-shirt/top"): trusted
        names = DATASETS[state["dataset"]].class_names
    if names is None or len(names) != num_classes:
        names = [str(k) for k in range(num_classes)]
    return True, tuple(names)


def load_generator(path: Path, device: torch.device, state: dict | None = None) -> torch.nn.Module:
    """Load generator.pt written by ``dpsinkhorn train`` (any architecture of ``models``);
    read safely (:func:`read_generator_file`: no code in the file runs), or built from its
    dict ``state`` when given. The model gets ``conditional`` and ``class_names``
    attributes (:func:`generator_classes`)."""
    state = read_generator_file(path) if state is None else state
    model = build_generator(GeneratorConfig.from_dict(state["model_config"])).to(device)
    model.load_state_dict(state["state_dict"])
    model.conditional, model.class_names = generator_classes(state)
    return model.eval()


def balanced_labels(num: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """``num`` labels, each class ⌊num/K⌋ or ⌈num/K⌉ times, in random order."""
    labels = np.arange(num) % num_classes
    rng.shuffle(labels)
    return labels.astype(np.int64)


@torch.no_grad()
def generate(
    model: torch.nn.Module, num: int, seed: int, batch_size: int = 5000
) -> tuple[torch.Tensor, np.ndarray]:
    """``num`` samples with balanced labels: images uint8 [N,H,W(,C)] on the model's device
    (pixels as ``data.from_unit_range`` rounds them), labels int64 [N] on the host (-1 for an
    unconditional generator, fed its one class 0)."""
    device = next(model.parameters()).device
    labels = balanced_labels(num, model.config.num_classes, np.random.default_rng(seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    size, channels = model.config.image_size, model.config.out_channels
    images = torch.empty((num, size, size, channels), dtype=torch.uint8, device=device)
    finite = torch.ones((), dtype=torch.bool, device=device)
    for start in range(0, num, batch_size):
        y = torch.as_tensor(labels[start : start + batch_size], device=device)
        z = torch.rand(len(y), model.config.latent_dim, generator=gen, device=device)
        x = model(z, y).float()
        finite &= torch.isfinite(x).all()
        pixels = ((x.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
        images[start : start + len(y)] = pixels.permute(0, 2, 3, 1)
    if not finite:  # one host synchronisation for all batches
        raise ValueError("the generator's images contain NaN or infinite values")
    if not getattr(model, "conditional", True):
        labels = np.full(num, -1, np.int64)
    return (images[..., 0] if channels == 1 else images), labels


def sample_generator(
    model: torch.nn.Module, num: int, seed: int, batch_size: int = 5000
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`generate`'s samples with the images on the host, uint8 [N,H,W(,C)]."""
    images, labels = generate(model, num, seed, batch_size)
    return images.cpu().numpy(), labels


def channels_last(images: np.ndarray | torch.Tensor, where: str) -> np.ndarray | torch.Tensor:
    """Checked uint8 images [N,H,W] or [N,H,W,C] (``fileio.check_images``), a numpy array or
    a tensor on any device, as [N,H,W,C] of the same kind (grayscale gets C = 1)."""
    if not torch.is_tensor(images):
        return fileio.channels_last(images, where)
    fileio.check_images(torch.empty((0, *images.shape[1:]), dtype=images.dtype).numpy(), where)
    return images.unsqueeze(-1) if images.ndim == 3 else images


def sample_real(train_path: Path, num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random subset (without replacement) of ``num`` real training records."""
    images, labels = load_samples(train_path)
    if num > len(labels):
        raise ValueError(f"{train_path} holds {len(labels)} records, fewer than --num {num}")
    keep = np.sort(np.random.default_rng(seed).permutation(len(labels))[:num])
    return images[keep], labels[keep]
