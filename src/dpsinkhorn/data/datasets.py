"""Datasets (MNIST, Fashion-MNIST, CelebA): preparation, loading and pixel conversions.

``dpsinkhorn data`` turns the official idx archives (MD5-checked) into
``<root>/<dataset>/{train,test}.npz`` (``images`` uint8 [N,28,28], ``labels`` int64 [N]).
:func:`to_unit_range` / :func:`from_unit_range`: the only pixel conversions.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn.config.experiments import (
    definition_sha256,
    experiment,
    experiment_names,
    prepared_folder,
)
from dpsinkhorn.data.catalog import DATASETS, DatasetInfo, dataset_info
from dpsinkhorn.data.owndata import RECORD as OWN_RECORD
from dpsinkhorn.data.owndata import prepare_own
from dpsinkhorn.fileio import atomic_path, load_samples, md5_of, save_splits

SPLITS = ("train", "test")


def split_path(
    root: Path, dataset: str, split: str, definition: dict | None = None, folder: str | None = None
) -> Path:
    """``<root>/<folder>/<split>.npz``: ``folder`` when given (an experiment's
    ``prepared_folder``), else ``config.prepared_folder(dataset, definition)``; without
    ``definition`` and no such folder, the one ``<dataset>-<hash>`` folder under ``root``
    (a built-in dataset prepared from a source of its own, or an own dataset)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    root = Path(root)
    if folder is None and definition is not None:
        folder = prepared_folder(dataset, definition)
    if folder is None and not (root / dataset).is_dir():
        own = dataset not in DATASETS  # own datasets' folders hold their dataset.json
        found = sorted(
            p.name
            for p in root.glob(f"{dataset}-*")
            if p.is_dir() and (p / OWN_RECORD).is_file() == own
        )
        if len(found) > 1:
            raise ValueError(
                f"{root}: {dataset} prepared from {len(found)} sources ({', '.join(found)}); give "
                "the experiment of a config (its prepared_folder or datasets: entry says which)"
            )
        if found:
            folder = found[0]
        elif own:
            dataset_info(dataset)  # an unknown name: the error names the valid ones
    return root / (folder or dataset) / f"{split}.npz"


# --------------------------------------------------------------------------- prepare


def prepare(dataset: str, root: Path, mirror: Path | None = None) -> dict[str, Path]:
    """Write ``<root>/<dataset>/{train,test}.npz``; return {split: path}.

    With ``mirror`` (a folder holding ``<FolderName>/raw/*.gz``) the archives are copied,
    not downloaded; either way MD5-checked. Reruns give identical files. Raises
    ``FileNotFoundError`` or ``ValueError`` naming the file and how to provide it.
    """
    info = dataset_info(dataset)
    root = Path(root)
    if dataset == "celeba":  # JPEGs + text files, not idx archives
        from dpsinkhorn.data.celeba import prepare_celeba

        return prepare_celeba(root, mirror)  # into the folder of its source
    raw = root / "torchvision" / info.folder / "raw"
    if mirror is not None:
        _copy_from_mirror(info, Path(mirror), raw)
    else:
        _download(info, raw)
    # Read from the MD5-checked archives themselves: never from extracted files, which
    # nothing checks (a damaged one would give wrong pixels silently).
    paths = {split: split_path(root, dataset, split) for split in SPLITS}
    save_splits(
        {
            paths[split]: (
                _read_idx(raw / f"{prefix}-images-idx3-ubyte.gz", info),
                _read_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", info).astype(np.int64),
            )
            for split, prefix in (("train", "train"), ("test", "t10k"))
        }
    )
    return paths


def _how_to_provide(info: DatasetInfo, archive: str, dest: Path) -> str:
    return (
        f"place the official file {archive} at {dest / archive}, or set data_mirror "
        f"(make: DATA=) to a folder holding {info.folder}/raw/*.gz, or run online to download"
    )


def _copy_from_mirror(info: DatasetInfo, mirror: Path, raw: Path) -> None:
    """Copy the archives from ``mirror/<folder>/raw`` to ``raw`` (those there with the
    right MD5 are kept), verifying each MD5."""
    src_dir = mirror / info.folder / "raw"
    for archive, md5 in info.archives():
        dest = raw / archive
        if dest.is_file() and md5_of(dest) == md5:
            continue
        src = src_dir / archive
        if not src.is_file():
            raise FileNotFoundError(
                f"missing archive {src} (data mirror {mirror}); "
                + _how_to_provide(info, archive, src_dir)
            )
        with atomic_path(dest) as tmp:  # a bad copy never appears under the real name
            shutil.copyfile(src, tmp)
            if (digest := md5_of(tmp)) != md5:
                raise ValueError(
                    f"corrupt archive {src}: MD5 {digest}, expected {md5}; "
                    + _how_to_provide(info, archive, src_dir)
                )


def _download(info: DatasetInfo, raw: Path) -> None:
    """Download the archives that ``raw`` lacks (or holds damaged) from torchvision's
    mirrors, MD5-checked; a ``FileNotFoundError`` says how to work offline."""
    from torchvision.datasets.utils import download_url

    for archive, md5 in info.archives():
        if (raw / archive).is_file() and md5_of(raw / archive) == md5:
            continue
        for url in info.torchvision_dataset().mirrors:
            try:
                download_url(f"{url}{archive}", str(raw), archive, md5)
                break
            except (OSError, RuntimeError) as err:  # URLError is an OSError
                failure = " ".join(str(err).split())
        else:
            raise FileNotFoundError(
                f"{info.key}: download failed ({failure}); this machine seems to be offline; "
                "set data_mirror in the config (make: DATA=, CLI: --mirror) to a folder "
                f"holding {info.folder}/raw/*.gz"
            )


def _read_idx(path: Path, info: DatasetInfo) -> np.ndarray:
    """The uint8 array of an idx file (images [N,H,W], labels [N]) in a gzip archive."""
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
        if data[:3] != b"\0\0\x08":  # two zero bytes, then the type code of uint8
            raise ValueError("not an idx file of unsigned bytes")
        shape = struct.unpack(f">{data[3]}I", data[4 : 4 + 4 * data[3]])
        return np.frombuffer(data, np.uint8, offset=4 + 4 * data[3]).reshape(shape)
    except (OSError, EOFError, zlib.error, struct.error, ValueError) as err:
        raise ValueError(
            f"corrupt archive {path}: cannot be extracted ({type(err).__name__}: {err}); "
            + _how_to_provide(info, path.name, path.parent)
        ) from err


def load_split(
    root: Path, dataset: str, split: str, definition: dict | None = None, folder: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read :func:`split_path`: (images uint8 [N,H,W(,C)], labels int64 [N])."""
    path = split_path(root, dataset, split, definition, folder)
    if not path.exists():
        config = "" if dataset in DATASETS else " --config <the config that declares it>"
        raise FileNotFoundError(
            f"{path} not found; run `dpsinkhorn data --dataset {dataset} --root {root}{config}` "
            "first"
        )
    return load_samples(path)


# ------------------------------------------------------------------------ conversions


def to_unit_range(images_uint8: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 [N,H,W] or [N,H,W,C] in [0, 255] -> float32 [N,C,H,W] in [-1, 1]."""
    x = torch.as_tensor(images_uint8)
    if x.dtype != torch.uint8 or x.ndim not in (3, 4):
        raise ValueError(f"to_unit_range expects uint8 [N,H,W(,C)], got {x.dtype} {list(x.shape)}")
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    return (x.to(torch.float32) / 127.5 - 1.0).contiguous()


def from_unit_range(x: torch.Tensor) -> np.ndarray:
    """float [N,C,H,W] in [-1, 1] -> uint8 [N,H,W] (C = 1) or [N,H,W,3], clamped and
    rounded: the exact inverse of ``to_unit_range``."""
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(
            f"from_unit_range expects [N,C,H,W] with C in (1, 3), got {tuple(x.shape)}"
        )
    x = x.detach().to("cpu", torch.float32)
    if not torch.isfinite(x).all():
        raise ValueError("from_unit_range: images contain NaN or infinite values")
    pixels = ((x.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    pixels = pixels[:, 0] if pixels.shape[1] == 1 else pixels.permute(0, 2, 3, 1)
    return pixels.contiguous().numpy()


# ------------------------------------------------------------------------------- CLI


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dpsinkhorn data``."""
    parser = subparsers.add_parser(
        "data",
        help="prepare datasets as <root>/<dataset>/{train,test}.npz",
        description="Download (or copy from a local mirror) MNIST / Fashion-MNIST / CelebA, or "
        "read an own dataset (config datasets:, an image folder or an .npz), and write "
        "<root>/<dataset>/{train,test}.npz (images uint8 [N,28,28]; CelebA [N,32,32,3]; own "
        "[N,S,S] or [N,S,S,3]; labels int64 [N]); an own dataset goes to "
        "<root>/<dataset>-<hash of its datasets: entry>/, with dataset.json.",
    )
    parser.add_argument(
        "--dataset",
        nargs="+",
        action="extend",
        required=True,
        help=f"one or more datasets (repeatable: --dataset mnist fmnist): {', '.join(DATASETS)} "
        "or an own dataset declared under the --config file's datasets:",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="output folder (default: the --config's data_dir, else data)",
    )
    parser.add_argument(
        "--config",
        nargs="+",
        default=None,
        help="config file(s): needed for own datasets (datasets:); their experiments' "
        "batch_size is checked against the training records",
    )
    parser.add_argument(
        "--definition-sha256",
        default=None,
        help="(workflow) refuse an own dataset whose datasets: entry in --config does not "
        "have this hash (config.experiments.definition_sha256)",
    )
    parser.add_argument(
        "--mirror",
        type=Path,
        default=None,
        help="folder holding <FolderName>/raw/*.gz (e.g. ../shared/data), or celeba/... in "
        "torchvision's layout for CelebA; never downloads",
    )
    parser.set_defaults(handler=_cli_handler)


def _cli_handler(args: argparse.Namespace) -> int:
    cfg = {}
    if args.config:
        from dpsinkhorn.config import load_config

        cfg = load_config(args.config)
    own = cfg.get("datasets") or {}
    # Where training looks for them: the config's data_dir, unless --root says otherwise.
    root = args.root if args.root is not None else Path(cfg.get("data_dir", "data"))
    names = list(dict.fromkeys(args.dataset))  # de-duplicated, order kept
    for dataset in names:  # check every name before preparing any
        if dataset not in DATASETS and dataset not in own:
            where = f" in {', '.join(args.config)}" if args.config else " (give --config)"
            raise ValueError(
                f"--dataset {dataset}: unknown dataset; built-in: {', '.join(DATASETS)}; "
                f"own (datasets:){where}: {', '.join(own) or 'none'}"
            )
    for dataset in names:
        if dataset in DATASETS:
            paths = prepare(dataset, root, mirror=args.mirror)
        else:
            sha = definition_sha256(own[dataset])  # the workflow's hash of the entry it read
            if args.definition_sha256 and sha != args.definition_sha256:
                raise ValueError(
                    f"{', '.join(args.config)}: datasets.{dataset} changed since the workflow "
                    f"read it (sha256 {sha}, expected {args.definition_sha256})"
                )
            # The largest batch of a trained experiment on it is checked against its records.
            batches = [
                (exp["batch_size"], f"experiment {name}")
                for name in experiment_names(cfg)
                if (exp := experiment(cfg, name))["dataset"] == dataset
                and exp["method"] != "real_data"
            ]
            paths = prepare_own(dataset, own[dataset], root, *max(batches, default=(None, "")))
        for split, path in paths.items():
            print(f"{dataset} {split}: wrote {path}")
    return 0
