"""Sample grids: mosaics with one row of samples per class, and their PNG figures (Table 1's
samples_<dataset>.png, the paper's Figures 2, 3, 6 and 7)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.report.common import CLASS_NAMES


def sample_grid(
    images: np.ndarray, labels: np.ndarray, num_classes: int, per_class: int
) -> np.ndarray:
    """Mosaic with one row per class (its first ``per_class`` samples, blank where it has
    fewer), 2 px gaps."""
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    h, w = images.shape[1:3]
    pad = 2
    shape = (num_classes * (h + pad) - pad, per_class * (w + pad) - pad) + images.shape[3:]
    grid = np.full(shape, 255, dtype=np.uint8)  # white gaps, like the page
    for c in range(num_classes):
        for j, idx in enumerate(np.flatnonzero(labels == c)[:per_class]):
            y, x = c * (h + pad), j * (w + pad)
            grid[y : y + h, x : x + w] = images[idx]
    return grid


def grid_classes(
    images: np.ndarray, labels: np.ndarray, dataset: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images, labels, row names) of a sample file for a grid: the dataset's class names,
    else "0", "1", …; an unconditional generator's samples (labelled -1) as one row."""
    if len(labels) and int(labels.max()) < 0:
        return images, np.zeros_like(labels), ["unconditional"]
    names = list(CLASS_NAMES.get(dataset) or [])
    if len(names) <= int(labels.max(initial=0)):
        names = [str(c) for c in range(int(labels.max(initial=0)) + 1)]
    return images, labels, names


def save_grid_figure(
    panels: Sequence[tuple[np.ndarray, np.ndarray, str]],
    class_names: Sequence[str],
    out: Path,
    title: str,
    per_class: int = 10,
) -> None:
    """PNG of sample sets stacked top to bottom, one row per class of each (atomic);
    ``panels``: (images, labels, row-label prefix) per sample set."""
    from matplotlib.figure import Figure  # Agg via Figure.savefig; no pyplot state

    grids, names = [], []
    for images, labels, prefix in panels:
        grids.append(sample_grid(images, labels, len(class_names), per_class))
        names += [f"{prefix} {c}".strip() for c in class_names]
    blank = np.full((2, *grids[0].shape[1:]), 255, dtype=np.uint8)  # the 2 px gap
    grid = np.concatenate([g for grid in grids for g in (grid, blank)][:-1])
    fig = Figure(figsize=(1.0 + 0.45 * per_class, 0.5 + 0.45 * len(names)), dpi=100)
    draw_grid(fig.add_subplot(), grid, names, title)
    fig.tight_layout()
    with fileio.atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")


def draw_grid(
    ax, grid: np.ndarray, names: Sequence[str], title: str, fontsize: int | str = "medium"
) -> None:
    """Show a :func:`sample_grid` mosaic on ``ax`` with one y label per row (class)."""
    h = (grid.shape[0] + 2) // len(names)  # a row of images and its 2 px gap
    ax.imshow(grid, cmap="gray" if grid.ndim == 2 else None, vmin=0, vmax=255)
    ax.set_yticks([c * h + (h - 2) / 2 for c in range(len(names))], names, fontsize=fontsize)
    ax.set_xticks([])
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)
    ax.set_title(title, fontsize=9)
