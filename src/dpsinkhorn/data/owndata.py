"""Own datasets (config ``datasets:``): an image folder (``ImageFolder`` layout, optionally
split into ``train/`` and ``test/``) or an .npz -> ``<root>/<name>-<entry hash>/`` with
``{train,test}.npz`` and ``dataset.json`` (:func:`prepare_own`). Classes are public
(declared or folder names); bad input is a one-line :class:`DatasetError` naming the file.
Torch-free; docs/OWN_DATA.md."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpsinkhorn.config.experiments import prepared_folder
from dpsinkhorn.data.catalog import (
    IMAGE_EXTENSIONS,
    DatasetInfo,
    image_folder_not_found,
    own_dataset_info,
    own_layout,
    resize_statement,
)
from dpsinkhorn.fileio import check_samples, json_bytes, save_splits

#: The public record of a prepared own dataset, beside its train.npz / test.npz.
RECORD = "dataset.json"

Arrays = tuple[np.ndarray, np.ndarray]  # images uint8 [N,S,S(,3)], labels int64 [N]


class DatasetError(ValueError):
    """A bad own dataset; the message is one line that names the file or folder."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _to_pixels(image: Any, where: Path | str, definition: Mapping[str, Any]) -> np.ndarray:
    """One PIL image -> uint8 [S,S] (channels 1) or [S,S,3], converted and resized only
    with ``resize: true``; otherwise a :class:`DatasetError` when size or mode differ."""
    from PIL import Image

    size, mode = int(definition["image_size"]), "L" if definition["channels"] == 1 else "RGB"
    if image.mode.startswith(("I", "F")):
        # PIL's convert() to L or RGB clips 16-bit and float pixels to 0..255 instead of
        # scaling them: a 16-bit scan would come out mostly white. Never guessed here.
        kind = "16/32-bit integer" if image.mode[0] == "I" else "float"
        raise DatasetError(
            f"{where}: mode {image.mode} ({kind} pixels), which PIL would clip to 0..255 "
            "rather than scale; convert the images to 8 bits per channel first"
        )
    if definition["resize"]:
        if image.mode != mode:
            image = image.convert(mode)
        if image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BILINEAR)
    elif image.mode != mode or image.size != (size, size):
        width, height = image.size
        raise DatasetError(
            f"{where}: {width}x{height} px in mode {image.mode}, but the dataset is "
            f"{size}x{size} px in mode {mode} (image_size, channels); set resize: true to "
            "convert and resize every image"
        )
    return np.asarray(image, dtype=np.uint8)


def _read_image(path: Path, definition: Mapping[str, Any]) -> np.ndarray:
    """Decode one image file (fully: a truncated file fails here) -> pixels."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return _to_pixels(image, path, definition)
    except DatasetError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise DatasetError(f"{path}: not a readable image ({_one_line(err)})") from err


# ------------------------------------------------------------------------ image folder


def _image_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively, sorted; hidden files left out). A broken
    link with an image's name is listed, so that it is refused by name, not left out."""
    found = [
        p
        for p in folder.rglob("*")
        if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    for p in found:  # rglob lists a linked folder but does not read it
        if p.is_symlink() and p.is_dir():
            raise DatasetError(
                f"{p}: not read: a linked folder inside a class folder (link the images, "
                "or copy them in)"
            )
    return sorted(
        p for p in found if (p.is_file() or p.is_symlink()) and p.suffix.lower() in IMAGE_EXTENSIONS
    )


def _read_class_folders(
    base: Path, classes: tuple[str, ...], definition: Mapping[str, Any], field: str
) -> tuple[Arrays, list[Path]]:
    """Read ``base/<class>/*`` with labels = index in ``classes``; and each record's file."""
    class_dirs = sorted(d for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not class_dirs:
        loose = "; images must lie in <class>/ sub-folders" if _image_files(base) else ""
        raise DatasetError(f"{base}: no images (expected {base}/<class>/*.png|jpg|jpeg){loose}")
    for entry in sorted(base.iterdir()):  # an image beside the class folders has no class
        if entry.is_file() and entry.suffix.lower() in IMAGE_EXTENSIONS and entry.name[0] != ".":
            raise DatasetError(
                f"{entry}: not read: an image beside the class folders has no class "
                f"(move it into {base}/<class>/, or out of the folder)"
            )
    index = {name: i for i, name in enumerate(classes)}
    images, labels, names = [], [], []
    for folder in class_dirs:
        if folder.name not in index:
            raise DatasetError(
                f"{folder}: class folder {folder.name!r} is not among the declared classes "
                f"({field}: {', '.join(classes)})"
            )
        files = _image_files(folder)
        if not files:
            raise DatasetError(f"{folder}: class folder without images (.png, .jpg, .jpeg)")
        images += [_read_image(file, definition) for file in files]
        labels += [index[folder.name]] * len(files)
        names += files
    return (np.stack(images), np.asarray(labels, dtype=np.int64)), names


def _read_image_folder(
    root: Path, classes: tuple[str, ...], definition: Mapping[str, Any], field: str
) -> tuple[Arrays, Arrays | None, list[Path]]:
    """(train, test or None, the files of train's records) of an image folder. ``root/train``
    marks the split layout, which reads ``train/`` and ``test/`` only: a folder or an image
    beside them (``val/``, a stray image) is refused by name, never left out without a word."""
    if not root.is_dir():
        raise image_folder_not_found(root)
    if not (root / "train").is_dir():
        train, names = _read_class_folders(root, classes, definition, field)
        return train, None, names
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.name in ("train", "test"):
            continue
        if entry.is_dir() or entry.suffix.lower() in IMAGE_EXTENSIONS:
            raise DatasetError(
                f"{entry}: not read: beside train/, an image folder holds only an optional "
                "test/ (name a held-out split test/, or move this out of the folder)"
            )
    train, names = _read_class_folders(root / "train", classes, definition, field)
    test = root / "test"
    if not test.is_dir():
        return train, None, names
    return train, _read_class_folders(test, classes, definition, field)[0], names


# --------------------------------------------------------------------------------- npz


def _npz_pair(
    path: Path, arrays: Mapping[str, np.ndarray], keys: tuple[str, str], definition, field
) -> Arrays:
    """Check and convert one (images, labels) pair of an .npz."""
    images, labels = (np.asarray(arrays[k]) for k in keys)
    try:  # the sample files' own contract, for each pair of the .npz
        check_samples(images, labels, f"{path} ({keys[0]}, {keys[1]})")
    except ValueError as err:
        raise DatasetError(str(err)) from None
    if len(images) == 0:
        raise DatasetError(f"{path}: {keys[0]} holds no images")
    if 0 in images.shape[1:3]:  # resize would make blank images of them
        raise DatasetError(f"{path}: {keys[0]} has a side of 0 pixels: {list(images.shape)}")
    num_classes = len(definition["classes"])
    if labels.min() < 0 or labels.max() >= num_classes:
        # No label value is printed: the labels are private.
        raise DatasetError(
            f"{path}: {keys[1]} outside the {num_classes} declared classes (values must lie "
            f"in [0, {num_classes}), {field})"
        )
    from PIL import Image

    pixels = []
    for i, image in enumerate(images):
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        pixels.append(_to_pixels(Image.fromarray(image), f"{path} ({keys[0]}[{i}])", definition))
    return np.stack(pixels), labels.astype(np.int64)


def _read_npz(
    path: Path, definition: Mapping[str, Any], field: str
) -> tuple[Arrays, Arrays | None]:
    """(train, test or None) of an .npz (``test_images`` / ``test_labels`` = a given test split)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: .npz file not found")
    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and say so
        raise DatasetError(f"{path}: not a readable .npz (not a zip archive: np.savez writes one)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{path}: not a readable .npz ({_one_line(err)})") from err
    for key in ("images", "labels"):
        if key not in arrays:
            raise DatasetError(
                f"{path}: no {key!r} array (has: {', '.join(sorted(arrays)) or 'nothing'})"
            )
    given = [key for key in ("test_images", "test_labels") if key in arrays]
    if len(given) == 1:
        raise DatasetError(
            f"{path}: {given[0]} without its pair (give test_images and test_labels)"
        )
    train = _npz_pair(path, arrays, ("images", "labels"), definition, field)
    return train, _npz_pair(path, arrays, tuple(given), definition, field) if given else None


def refuse_repeated_images(images: np.ndarray, name: Callable[[int], str]) -> None:
    """A :class:`DatasetError` naming two records (``name(i)``) that are the same image.

    A record is an image (docs/PRIVACY.md): an image held twice is one record in two rows,
    which the ledger's add/remove-one guarantee (one row) does not cover: its ε is that of
    a group of two (as the record store counts it)."""
    first: dict[bytes, int] = {}
    for i, image in enumerate(images):
        j = first.setdefault(hashlib.blake2b(image.tobytes(), digest_size=16).digest(), i)
        if j != i:
            raise DatasetError(
                f"{name(i)}: the same image as {name(j)} (as prepared): an image trained on "
                "twice is one record in two rows, which the privacy guarantee of one row does "
                "not cover; remove one of them"
            )


def split_off(arrays: Arrays, fraction: float, seed: int, where: Path) -> tuple[Arrays, Arrays]:
    """Hold out ``round(N * fraction)`` records (at least 1), the first of
    ``default_rng(seed).permutation(N)``, as the test split; both keep the source order."""
    images, labels = arrays
    n = len(labels)
    n_test = max(1, round(n * fraction))
    if n - n_test < 1:
        raise DatasetError(f"{where}: {n} records cannot be split into train and test")
    order = np.random.default_rng(seed).permutation(n)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    return (images[train], labels[train]), (images[test], labels[test])


def prepare_own(
    name: str,
    definition: Mapping[str, Any],
    root: Path,
    batch_size: int | None = None,
    batch_owner: str = "",
) -> dict[str, Path]:
    """Write ``<root>/<name>-<entry hash>/{train,test}.npz`` and ``dataset.json`` of the
    validated ``datasets.<name>`` entry ``definition``; {split: path}. ``batch_size`` (the
    largest batch on it, of experiment ``batch_owner``) is checked against the records."""
    info = own_dataset_info(name, definition)
    out = Path(root) / prepared_folder(name, definition)
    declared = definition.get("classes") is not None
    definition = {**definition, "classes": list(info.class_names)}
    source, layout = Path(definition["path"]), own_layout(Path(definition["path"]))
    field = f"datasets.{name}.classes" if declared else f"the folder names of {source}"
    if layout == "npz":  # classes declared: field is datasets.<name>.classes
        train, test = _read_npz(source, definition, field)
        refuse_repeated_images(train[0], lambda i: f"{source} (images[{i}])")
    else:
        train, test, files = _read_image_folder(source, info.class_names, definition, field)
        refuse_repeated_images(train[0], lambda i: str(files[i]))
    split: dict[str, Any] = {"test": "given"}
    if test is None:
        train, test = split_off(
            train, definition["test_fraction"], definition["split_seed"], source
        )
        split = {
            "test": "held out",
            "test_fraction": definition["test_fraction"],
            "split_seed": definition["split_seed"],
            "how": "numpy.random.default_rng(split_seed).permutation(N): the first "
            "round(N * test_fraction) records are the test split",
        }
    paths = {"train": out / "train.npz", "test": out / "test.npz"}
    if batch_size is not None and batch_size > len(train[1]):
        raise DatasetError(
            f"{paths['train']} (from {source}): {len(train[1])} training records, fewer than "
            f"batch_size {batch_size}{f' of {batch_owner}' if batch_owner else ''}: the "
            "sampling rate q = batch_size / N must be at most 1"
        )
    record = {
        "name": name,
        "title": info.title,
        "layout": layout,
        "path": str(source),
        "classes": list(info.class_names),
        "classes_from": "config" if declared else "folder names",
        "image_size": int(definition["image_size"]),
        "channels": int(definition["channels"]),
        "resize": resize_statement(definition),
        "split": split,
        "num_train": len(train[1]),
        "num_test": len(test[1]),
        "note": "public: no label is counted here; an evaluation on the test split uses "
        "private data and is not covered by the privacy guarantee",
    }
    # The record comes last and goes first: it never describes a half-written dataset.
    arrays = {paths["train"]: train, paths["test"]: test}
    save_splits(arrays, [(out / RECORD, json_bytes(record))], remove_first=[out / RECORD])
    return paths


def prepared_dataset_info(folder: Path) -> DatasetInfo:
    """The facts of an own dataset prepared in ``folder`` (from its public dataset.json)."""
    path = Path(folder) / RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (prepare the dataset with dpsinkhorn data)")
    record = json.loads(path.read_text())
    size, channels = int(record["image_size"]), int(record["channels"])
    return DatasetInfo(
        record["name"],
        (channels, size, size),
        tuple(record["classes"]),
        record["title"],
        source=f"{record['layout']} {record['path']}",
        resize=record["resize"],
    )
