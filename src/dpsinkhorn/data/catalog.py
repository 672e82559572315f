"""The facts about each dataset (classes, image shape, class names, title), torch-free.

Every stage takes a dataset's class count, shape and names from :data:`DATASETS`, and the
report takes its title from there too: adding a dataset starts here (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one dataset; ``image_shape`` is (C, H, W) in pixels."""

    key: str  # our name, e.g. "fmnist"
    torchvision_class: str  # class name in torchvision.datasets
    folder: str  # torchvision's folder under its root: <root>/<folder>/raw/*.gz
    num_classes: int
    image_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    title: str  # as tables and figures name it

    def torchvision_dataset(self) -> type:
        """The torchvision dataset class (imported lazily)."""
        import torchvision.datasets

        return getattr(torchvision.datasets, self.torchvision_class)

    def archives(self) -> list[tuple[str, str]]:
        """(archive file name, expected MD5) pairs, from torchvision's own ``resources``."""
        # ``resources`` holds (url, md5) in older torchvision, (file name, md5) in newer.
        return [(Path(src).name, md5) for src, md5 in self.torchvision_dataset().resources]


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo(
        key="mnist",
        torchvision_class="MNIST",
        folder="MNIST",
        num_classes=10,
        image_shape=(1, 28, 28),
        class_names=tuple(str(d) for d in range(10)),
        title="MNIST",
    ),
    "fmnist": DatasetInfo(
        key="fmnist",
        torchvision_class="FashionMNIST",
        folder="FashionMNIST",
        num_classes=10,
        image_shape=(1, 28, 28),
        class_names=(
            "T-shirt/top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle boot",
        ),
        title="Fashion-MNIST",
    ),
    # CelebA at 32x32 RGB, label = the Male attribute (see dpsinkhorn.data.celeba).
    "celeba": DatasetInfo(
        key="celeba",
        torchvision_class="CelebA",
        folder="celeba",
        num_classes=2,
        image_shape=(3, 32, 32),
        class_names=("female", "male"),
        title="CelebA 32×32",
    ),
}


def dataset_info(name: str) -> DatasetInfo:
    """Look up a dataset by our key; ``ValueError`` naming the valid keys otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name!r}; valid datasets: {', '.join(sorted(DATASETS))}"
        ) from None
