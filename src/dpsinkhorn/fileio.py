"""Atomic file writes (a temporary file beside the destination, moved into place with
``os.replace``: nothing is ever half-written) and the sample-file contract of every stage."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}  # the file system (or the user's quota) is full


class NoSpaceError(OSError):
    """Writing a file failed because its file system is full (ENOSPC / EDQUOT); the message
    names the file and the temporary file is already removed."""


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Delete temporary files a killed writer left next to ``path``; returns them. Call it
    only while no other process can write ``path`` (e.g. under ``runlock.OutputLock``)."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{path.stem}.*.tmp{path.suffix}"))  # see _temp_beside
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


#: The name of a temporary file of ``atomic_path`` / ``write_all`` (mkstemp's 8 characters).
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp(\.[^.]+)?$")


def remove_stale_temps_under(root: str | os.PathLike) -> list[Path]:
    """Delete every temporary file of this module's writers under ``root``; returns them.
    Call it only when no writer can be running there (the workflow: once every job ended)."""
    root = Path(root)
    stale = [p for p in root.rglob(".*.tmp*") if p.is_file() and _TEMP_NAME.match(p.name)]
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


def _raise_no_space(err: OSError, path: Path) -> None:
    """Raise ``err``, as ``NoSpaceError`` naming ``path`` when the file system is full."""
    if err.errno in _NO_SPACE and not isinstance(err, NoSpaceError):
        raise NoSpaceError(
            err.errno, f"no space left on device while writing {path}; free space and rerun"
        ) from err
    raise err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` (with its suffix, for libraries that pick a
    format from it); move it onto ``path`` on success."""
    path = Path(path)
    tmp_path = _temp_beside(path)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give files the usual mode
        os.replace(tmp_path, path)
    except OSError as err:
        _raise_no_space(err, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def _temp_beside(path: Path) -> Path:
    """A new empty temporary file next to ``path``: ``.<stem>.<8 characters>.tmp<suffix>``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    return Path(tmp)


def _write_synced(tmp: Path, payload: bytes) -> None:
    """Write ``payload`` to ``tmp`` and fsync it: a full disk shows here, not after the rename."""
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def write_bytes(path: str | os.PathLike, payload: bytes) -> None:
    """Write ``payload`` to ``path`` atomically (``NoSpaceError`` naming it when full)."""
    write_all([(path, payload)])


def write_all(
    files: list[tuple[str | os.PathLike, bytes]], remove_first: list[str | os.PathLike] = ()
) -> None:
    """Write several files as one commit: all in full (an error, e.g. ``NoSpaceError``
    naming the file, changes nothing), then ``remove_first`` deleted and the files moved into
    place in order, so a file listed later never appears without the ones before it."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, payload in files:
            path = Path(path)
            tmp = _temp_beside(path)
            staged.append((tmp, path))
            try:
                _write_synced(tmp, payload)
            except OSError as err:
                _raise_no_space(err, path)
            os.chmod(tmp, 0o666 & ~_UMASK)
        for path in remove_first:
            Path(path).unlink(missing_ok=True)
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)`` as bytes that depend on ``obj`` only (saving to a path would
    store the file's random temporary name inside)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _file_digest(path: str | os.PathLike, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def md5_of(path: str | os.PathLike) -> str:
    """Hex MD5 of a file, as the datasets' published checksums."""
    return _file_digest(path, "md5")


def sha256_of(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file: the one file hash of the package."""
    return _file_digest(path, "sha256")


def sha256_of_bytes(data: bytes) -> str:
    """Hex SHA-256 of bytes in memory (what :func:`sha256_of` gives for a file of them)."""
    return hashlib.sha256(data).hexdigest()


def json_bytes(obj: Any) -> bytes:
    """The bytes :func:`write_json` writes for ``obj`` (indented JSON, a final newline)."""
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON (:func:`json_bytes`), atomically."""
    write_bytes(path, json_bytes(obj))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a UTF-8 text file atomically."""
    write_bytes(path, text.encode())


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file."""
    return json.loads(Path(path).read_text())


#: The zip entries' time stamp in a sample file (zip's earliest): fixed, so that equal
#: arrays give equal bytes (``np.savez`` stamps the current time).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def samples_bytes(images: np.ndarray, labels: np.ndarray, where: str = "samples") -> bytes:
    """The bytes of a sample file (an .npz: ``images`` uint8 [N,H,W(,C)], ``labels`` int64
    [N]), a function of the arrays alone (uncompressed, fixed entry order and time stamps),
    so that ``dpsinkhorn release`` can redraw a generator's samples and compare them."""
    images, labels = np.ascontiguousarray(images), np.asarray(labels)
    check_samples(images, labels, where)
    labels = np.ascontiguousarray(labels.astype(np.int64))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in (("images", images), ("labels", labels)):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)
    return buf.getvalue()


def save_samples(path: str | os.PathLike, images: np.ndarray, labels: np.ndarray) -> None:
    """Save a sample file (:func:`samples_bytes`) atomically."""
    write_bytes(path, samples_bytes(np.asarray(images), np.asarray(labels), str(path)))


def save_splits(
    arrays: dict[Path, tuple[np.ndarray, np.ndarray]],
    extra: list[tuple[Path, bytes]] = (),
    remove_first: list[Path] = (),
) -> None:
    """Save sample files ``{path: (images, labels)}``, then ``extra`` (path, bytes) files,
    as one commit (:func:`write_all`): no split is ever replaced without the others."""
    files = [(path, samples_bytes(*pair, str(path))) for path, pair in arrays.items()]
    write_all(files + list(extra), remove_first)


def check_images(images: np.ndarray, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``images`` are uint8 [N,H,W] or
    [N,H,W,C] with C in (1, 3): the one image check of sample files, FID and classifiers."""
    if images.dtype != np.uint8:
        raise ValueError(f"{where}: 'images' must be uint8, got {images.dtype}")
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
        raise ValueError(
            f"{where}: 'images' must have shape [N,H,W] or [N,H,W,C] with C in (1, 3), "
            f"got {tuple(images.shape)}"
        )


def channels_last(images: np.ndarray, where: str) -> np.ndarray:
    """Checked images (:func:`check_images`) as [N,H,W,C]: grayscale [N,H,W] gets C = 1."""
    images = np.asarray(images)
    check_images(images, where)
    return images[..., None] if images.ndim == 3 else images


def check_class_names(names, where: str) -> tuple[str, ...]:
    """``names`` as a tuple, refused (ValueError naming ``where`` and the name) unless one or
    more distinct non-empty strings usable as a folder name (no path separator, not . or ..)."""
    names = tuple(names) if not isinstance(names, str) else (names,)
    if not names:
        raise ValueError(f"{where}: no class names given (need at least one)")
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(f"{where}: class name {name!r} is not usable as a folder name")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{where}: class name {dup!r} is given twice")
    return names


def check_samples(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless the arrays follow the sample contract."""
    check_images(images, where)
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
            arrays = {name: npz[name] for name in npz.files if name in ("images", "labels")}
            found = npz.files
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(f"{path}: not a readable .npz sample file ({err})") from err
    if missing := {"images", "labels"} - set(arrays):
        raise ValueError(f"{path}: missing array(s) {sorted(missing)}; found {found}")
    check_samples(arrays["images"], arrays["labels"], str(path))
    return arrays["images"], arrays["labels"].astype(np.int64)


def relative_inside(path: str | os.PathLike, folder: str | os.PathLike) -> str | None:
    """``path`` relative to ``folder`` (both resolved, POSIX), or None when outside it."""
    try:
        return Path(path).resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        return None
