"""Atomic file writes and the sample-file contract shared by every stage.

Nothing in the pipeline is ever half-written: each writer goes to a temporary
file in the destination folder and is moved into place with ``os.replace``,
which is atomic on POSIX file systems.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` on success.

    The temporary file keeps the destination's suffix, so libraries that pick a
    format from the extension (matplotlib, numpy) behave as for the real name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give files the usual mode
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def save_samples(path: str | os.PathLike, images: np.ndarray, labels: np.ndarray) -> None:
    """Save a sample file: ``images`` uint8 [N,H,W] or [N,H,W,C], ``labels`` int64 [N]."""
    images = np.asarray(images)
    labels = np.asarray(labels)
    check_samples(images, labels, str(path))
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, images=images, labels=labels.astype(np.int64))


def check_samples(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless the arrays follow the sample contract."""
    if images.dtype != np.uint8:
        raise ValueError(f"{where}: 'images' must be uint8, got {images.dtype}")
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
        raise ValueError(
            f"{where}: 'images' must have shape [N,H,W] or [N,H,W,C] with C in (1, 3), "
            f"got {tuple(images.shape)}"
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{where}: 'labels' must have shape [N] with N = {images.shape[0]} "
            f"(number of images), got {tuple(labels.shape)}"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{where}: 'labels' must be integers, got {labels.dtype}")


def load_samples(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Load and validate a sample file; returns (images uint8, labels int64)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sample file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"images", "labels"} - set(npz.files)
            if missing:
                raise ValueError(f"{path}: missing array(s) {sorted(missing)}; found {npz.files}")
            images, labels = npz["images"], npz["labels"]
    except (OSError, ValueError) as err:
        if isinstance(err, ValueError) and str(path) in str(err):
            raise
        raise ValueError(f"{path}: not a readable .npz sample file ({err})") from err
    check_samples(images, labels, str(path))
    return images, labels.astype(np.int64)
