"""Samples (uint8 [N,H,W(,C)], labels [N], -1: unconditional) as PNG files, atomically: one
grid image, or one file per sample in a folder per class. Torch-free."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn.fileio import channels_last, check_class_names, write_all, write_bytes

#: The folder (``--png-dir``) and grid row of an unconditional generator's samples.
UNCONDITIONAL_FOLDER = "unconditional"


def png_bytes(image: np.ndarray) -> bytes:
    """One uint8 image [H,W,C] (C in 1, 3) as PNG bytes (grayscale "L" or "RGB")."""
    from PIL import Image

    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


def unconditional(labels: np.ndarray) -> bool:
    """Samples of an unconditional generator: every label -1."""
    return bool(len(labels)) and bool((np.asarray(labels) == -1).all())


def _groups(labels: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Indices of each class 0..num_groups-1 in sample order; unconditional (labels -1): one."""
    if unconditional(labels):
        return [np.arange(len(labels))]
    if len(labels) and ((labels < 0) | (labels >= num_groups)).any():
        bad = labels[(labels < 0) | (labels >= num_groups)][0]
        raise ValueError(f"label {int(bad)} is outside the {num_groups} classes")
    return [np.flatnonzero(labels == k) for k in range(num_groups)]


def grid_image(
    images: np.ndarray, labels: np.ndarray, num_classes: int, per_class: int, pad: int = 2
) -> np.ndarray:
    """A uint8 grid [rows·(H+pad)+pad, per_class·(W+pad)+pad, C]: row k holds the first
    ``per_class`` samples of class k (blank where fewer); unconditional samples (labels
    -1) fill ``per_class`` columns row by row, at most ``per_class`` rows."""
    if per_class < 1:
        raise ValueError(f"per_class must be positive, got {per_class}")
    images, labels = channels_last(images, "images"), np.asarray(labels)
    groups = _groups(labels, num_classes)
    if unconditional(labels):
        flat = groups[0][: per_class * per_class]
        groups = [flat[i : i + per_class] for i in range(0, len(flat), per_class)] or [flat]
    h, w, c = images.shape[1:]
    grid = np.zeros((len(groups) * (h + pad) + pad, per_class * (w + pad) + pad, c), np.uint8)
    for row, indices in enumerate(groups):
        for col, i in enumerate(indices[:per_class]):
            y, x = pad + row * (h + pad), pad + col * (w + pad)
            grid[y : y + h, x : x + w] = images[i]
    return grid


def save_png_grid(
    path: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    per_class: int = 10,
) -> None:
    """Write :func:`grid_image` to ``path`` as one PNG (atomic)."""
    write_bytes(path, png_bytes(grid_image(images, labels, num_classes, per_class)))


def save_png_dir(
    out_dir: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
) -> list[Path]:
    """Write ``out_dir/<class name>/<i>.png`` (i counts within the class, from 0; a path
    separator in a name becomes "-": Fashion-MNIST's "T-shirt/top" → ``T-shirt-top/``); an
    unconditional generator's samples (labels -1) go to ``out_dir/unconditional/``.
    All files are committed together; returns their paths."""
    images = channels_last(images, "images")
    labels = np.asarray(labels)
    folders = [str(n).replace("/", "-").replace("\\", "-") for n in class_names]
    names = check_class_names(folders, "class names")
    groups = _groups(labels, len(names))
    if unconditional(labels):
        names = (UNCONDITIONAL_FOLDER,)
    files = [
        (Path(out_dir) / name / f"{i}.png", png_bytes(images[index]))
        for name, indices in zip(names, groups, strict=True)
        for i, index in enumerate(indices)
    ]
    write_all(files)
    return [path for path, _ in files]
