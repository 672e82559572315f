"""The facts about each dataset (classes, image shape, class names, title), torch-free.

Every stage and the report read them from :data:`DATASETS`; an own dataset (config
``datasets:``) gets them from its entry (:func:`own_dataset_info`), its classes declared or
read from folder names, never counted from the private labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Records in each built-in dataset's training split (q = B / N is known before any data).
TRAIN_SIZES = {"mnist": 60000, "fmnist": 60000, "celeba": 162770}


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one dataset; ``image_shape`` is (C, H, W) in pixels."""

    key: str  # our name, e.g. "fmnist"
    image_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    title: str  # as tables and figures name it
    torchvision_class: str = ""  # built-ins: the class in torchvision.datasets
    folder: str = ""  # built-ins: torchvision's folder under its root (<folder>/raw/*.gz)
    # Own datasets (config ``datasets:``) only: where the images come from and how they
    # were brought to image_shape; the ledger and the tables state both.
    source: str | None = None  # e.g. "image folder /data/scans" or "npz /data/x.npz"
    resize: str | None = None  # e.g. "resized to 32x32 px (PIL bilinear), converted to L"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def torchvision_dataset(self) -> type:
        """The torchvision dataset class (imported lazily)."""
        import torchvision.datasets

        return getattr(torchvision.datasets, self.torchvision_class)

    def archives(self) -> list[tuple[str, str]]:
        """(archive file name, expected MD5) pairs, from torchvision's own ``resources``."""
        # ``resources`` holds (url, md5) in older torchvision, (file name, md5) in newer.
        return [(Path(src).name, md5) for src, md5 in self.torchvision_dataset().resources]


FMNIST_CLASSES = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
DATASETS: dict[str, DatasetInfo] = {
    info.key: info
    for info in (
        DatasetInfo("mnist", (1, 28, 28), tuple("0123456789"), "MNIST", "MNIST", "MNIST"),
        DatasetInfo(
            "fmnist",
            (1, 28, 28),
            tuple(FMNIST_CLASSES.split(",")),
            "Fashion-MNIST",
            "FashionMNIST",
            "FashionMNIST",
        ),
        # CelebA at 32x32 RGB, label = the Male attribute (see dpsinkhorn.data.celeba).
        DatasetInfo("celeba", (3, 32, 32), ("female", "male"), "CelebA 32×32", "CelebA", "celeba"),
    )
}


#: Image files an image folder may hold (torchvision's ImageFolder takes these too).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


def dataset_info(name: str, definition: Mapping[str, Any] | None = None) -> DatasetInfo:
    """A built-in dataset by our key, or an own one from its ``datasets.<name>`` config entry
    (``definition``; an experiment carries it as ``dataset_definition``).

    ``ValueError`` naming the valid keys otherwise.
    """
    if name in DATASETS:
        return DATASETS[name]
    if definition is not None:
        return own_dataset_info(name, definition)
    raise ValueError(
        f"unknown dataset {name!r}; valid datasets: {', '.join(sorted(DATASETS))} or a name "
        "declared under the config's datasets:"
    )


def own_layout(path: Path) -> str:
    """``"npz"`` for a ``.npz`` file, else ``"image folder"``."""
    return "npz" if Path(path).suffix.lower() == ".npz" else "image folder"


def image_folder_not_found(root: Path) -> FileNotFoundError:
    """The error for an own dataset's ``path`` that is no folder (a file: not an .npz)."""
    if Path(root).is_file():
        return FileNotFoundError(
            f"{root}: a file, not an image folder (a dataset file must be an .npz)"
        )
    return FileNotFoundError(f"{root}: image folder not found")


def resize_statement(definition: Mapping[str, Any]) -> str:
    """How an own dataset's images reach the generator's size, in words (ledger, tables)."""
    size, mode = definition["image_size"], "L" if definition["channels"] == 1 else "RGB"
    if definition["resize"]:
        return (
            f"every image converted to PIL mode {mode} and resized to {size}x{size} px "
            "(PIL bilinear, antialiased when shrinking; aspect ratio not kept)"
        )
    return f"none: every image is {size}x{size} px in mode {mode} as given"


def own_dataset_info(name: str, definition: Mapping[str, Any]) -> DatasetInfo:
    """The facts of an own dataset from its validated ``datasets.<name>`` entry.

    The class list is the entry's ``classes``, or an image folder's sorted folder names.
    """
    path = Path(definition["path"])
    layout = own_layout(path)
    classes = definition.get("classes")
    if classes is None:
        if layout == "npz":
            raise ValueError(f"datasets.{name}.classes: an .npz dataset needs its class list")
        if not path.is_dir():
            raise image_folder_not_found(path)
        base = path / "train" if (path / "train").is_dir() else path  # public folder names
        classes = sorted(d.name for d in base.iterdir() if d.is_dir() and d.name[0] != ".")
        if not classes:
            raise ValueError(f"{path}: no class folders (expected {path}/<class>/*.png|jpg)")
        from dpsinkhorn.fileio import check_class_names

        # Refused here, as a declared name is with the config, not after a training spent
        # its budget (sample PNGs go to a folder per class name).
        check_class_names(classes, f"{path}: class folders")
    channels, size = int(definition["channels"]), int(definition["image_size"])
    return DatasetInfo(
        name,
        (channels, size, size),
        tuple(str(c) for c in classes),
        definition.get("title") or name,
        source=f"{layout} {path}",
        resize=resize_statement(definition),
    )
