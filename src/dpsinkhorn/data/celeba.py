"""CelebA at 32x32, gender-conditioned (paper section 5.3, Tables 3 and 6).

Reads torchvision's on-disk layout (``<source>/celeba/img_align_celeba/*.jpg`` and the
MD5-checked attribute and partition lists), centre-crops to 178x178, resizes to 32x32 (PIL
bilinear) and writes ``{train,test}.npz`` (``images`` uint8 [N,32,32,3], ``labels`` int64
[N] = ``Male``; partitions 0 and 2) into :func:`prepared_dir`. ``dpsinkhorn
celeba-fixture`` writes a marked synthetic source in the same formats.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dpsinkhorn.config.experiments import builtin_source, prepared_folder
from dpsinkhorn.fileio import md5_of, save_splits, write_text

IMAGE_DIR = "img_align_celeba"
ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
SOURCE_MARKER = "SYNTHETIC_FIXTURE"  # in <source>/celeba/: written by celeba-fixture
FIXTURE_MARKER = "FIXTURE"  # in the prepared folder: its arrays come from the fixture
SIZE = 32
WIDTH, HEIGHT = 178, 218
SPLIT_PARTITIONS = {"train": 0, "test": 2}  # CelebA: 0 train, 1 valid, 2 test
CHUNK = 2048  # images decoded per progress line

#: CelebA's 40 attributes, in the order of list_attr_celeba.txt.
ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
    "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses "
    "Goatee Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache "
    "Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks "
    "Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick "
    "Wearing_Necklace Wearing_Necktie Young"
).split()
LANDMARKS = (
    "lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y "
    "leftmouth_x leftmouth_y rightmouth_x rightmouth_y"
).split()

HOW_TO_PLACE = (
    "place CelebA by hand: from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html get "
    "img_align_celeba.zip (unzip it), list_attr_celeba.txt and list_eval_partition.txt "
    "(Anno/ and Eval/ folders) into <DIR>/celeba/ so that "
    "<DIR>/celeba/img_align_celeba/000001.jpg exists, then set data_mirror to <DIR> "
    "(make: DATA=, CLI: --mirror)"
)


# --------------------------------------------------------------------------- source


def find_source(root: Path, mirror: Path | None) -> Path:
    """The folder holding ``celeba/``: the mirror, or ``<root>/torchvision``, where
    torchvision's Google-Drive download puts it when it is not there yet."""
    if mirror is not None:
        return Path(mirror)
    tv_root = Path(root) / "torchvision"
    if all((tv_root / "celeba" / f).exists() for f in (ATTR_FILE, PARTITION_FILE, IMAGE_DIR)):
        return tv_root
    from torchvision.datasets import CelebA

    try:
        CelebA(str(tv_root), split="all", target_type=[], download=True)
    except Exception as err:  # gdown raises its own types (FileURLRetrievalError, ...)
        text = " ".join(str(err).split())
        if "too many users" in text.lower() or "quota" in text.lower():
            why = "Google Drive refused the download (quota: 'Too many users have viewed or "
            why += "downloaded this file recently')"
        else:
            why = f"the download failed ({type(err).__name__}: {text[:300]})"
        raise FileNotFoundError(
            f"celeba: {why}; " + HOW_TO_PLACE + f", or put them into {tv_root / 'celeba'}/"
        ) from err
    return tv_root


def read_annotations(folder: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(file names, Male label 0/1 int64, partition int64) from the two text files."""
    attr_path, part_path = folder / ATTR_FILE, folder / PARTITION_FILE
    try:
        lines = attr_path.read_text().splitlines()
        count, names = int(lines[0].split()[0]), lines[1].split()
        rows = [line.split() for line in lines[2:] if line.strip()]
        male = names.index("Male")
        files = [r[0] for r in rows]
        labels = np.array([(int(r[1 + male]) + 1) // 2 for r in rows], dtype=np.int64)
        if len(rows) != count or any(len(r) != len(names) + 1 for r in rows):
            raise ValueError(f"expected {count} rows of a name and {len(names)} values")
    except (IndexError, ValueError) as err:
        raise ValueError(f"corrupt CelebA file {attr_path}: cannot parse it ({err})") from err
    try:
        parts = dict(line.split() for line in part_path.read_text().splitlines() if line.strip())
        partition = np.array([int(parts[f]) for f in files], dtype=np.int64)
    except (KeyError, ValueError) as err:
        raise ValueError(
            f"corrupt CelebA file {part_path}: cannot parse it or it lacks {err}"
        ) from err
    if not set(np.unique(labels)) <= {0, 1}:
        raise ValueError(f"corrupt CelebA file {attr_path}: Male values must be -1 or 1")
    return files, labels, partition


def downsample(path: Path) -> np.ndarray:
    """One aligned CelebA JPEG -> uint8 [32,32,3]: center square crop, antialiased bilinear."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise FileNotFoundError(f"missing CelebA image {path}; " + HOW_TO_PLACE)
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            w, h = img.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            img = img.crop((left, top, left + side, top + side))
            small = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
            return np.asarray(small, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, SyntaxError) as err:
        raise ValueError(f"corrupt CelebA image {path}: {err}") from err


def prepared_dir(root: Path, mirror: Path | None) -> Path:
    """Where CelebA read from ``mirror`` (None: the download) is prepared under ``root``:
    ``<root>/celeba`` for the download, ``<root>/celeba-<source hash>`` for a mirror or the
    fixture (``config.prepared_folder``: two sources never share a folder)."""
    source = builtin_source("celeba", mirror, root)
    return Path(root) / prepared_folder("celeba", None, source)


def prepare_celeba(root: Path, mirror: Path | None = None) -> dict[str, Path]:
    """Write ``<folder>/{train,test}.npz`` (and FIXTURE for the fixture), the folder that of
    its source (:func:`prepared_dir`); {split: path}."""
    root = Path(root)
    folder = find_source(root, mirror) / "celeba"
    fixture = (folder / SOURCE_MARKER).is_file()
    from torchvision.datasets import CelebA

    md5s = {} if fixture else {name: md5 for _, md5, name in CelebA.file_list}
    for path in (folder / ATTR_FILE, folder / PARTITION_FILE):
        if not path.is_file():
            raise FileNotFoundError(f"missing CelebA file {path}; " + HOW_TO_PLACE)
        if path.name in md5s and md5_of(path) != md5s[path.name]:
            raise ValueError(
                f"corrupt CelebA file {path}: MD5 differs from torchvision's {md5s[path.name]}; "
                + HOW_TO_PLACE
            )
    if not (folder / IMAGE_DIR).is_dir():
        raise FileNotFoundError(f"missing CelebA image folder {folder / IMAGE_DIR}; {HOW_TO_PLACE}")
    files, labels, partition = read_annotations(folder)

    out_dir = prepared_dir(root, mirror)
    paths = {split: out_dir / f"{split}.npz" for split in SPLIT_PARTITIONS}
    arrays = {}
    for split, part in SPLIT_PARTITIONS.items():
        index = np.flatnonzero(partition == part)
        images = np.empty((len(index), SIZE, SIZE, 3), dtype=np.uint8)
        for start in range(0, len(index), CHUNK):
            for j in range(start, min(start + CHUNK, len(index))):
                images[j] = downsample(folder / IMAGE_DIR / files[index[j]])
            print(f"celeba {split}: {min(start + CHUNK, len(index))}/{len(index)} images")
        arrays[paths[split]] = (images, labels[index])
    save_splits(arrays)
    marker = out_dir / FIXTURE_MARKER
    if fixture:
        write_text(marker, f"prepared from the synthetic fixture in {folder}\n")
    else:
        marker.unlink(missing_ok=True)
    return paths


def is_fixture(prepared: Path) -> bool:
    """Whether the prepared CelebA folder ``prepared`` (``<data_dir>/`` and
    ``config.prepared_folder_of(config, "celeba")``) holds the synthetic fixture."""
    return (Path(prepared) / FIXTURE_MARKER).is_file()


# -------------------------------------------------------------------------- fixture


def _fixture_image(rng: np.random.Generator, male: bool):
    """A 178x218 face-like drawing; hair length, beard and colours depend on ``male``."""
    from PIL import Image, ImageDraw

    def colour(base, spread=25):
        return tuple(int(np.clip(c + rng.integers(-spread, spread + 1), 0, 255)) for c in base)

    img = Image.new("RGB", (WIDTH, HEIGHT), colour((150, 160, 175), 60))
    draw = ImageDraw.Draw(img)
    hair = colour((60, 45, 35) if male else (150, 110, 60), 40)
    cx, cy = WIDTH // 2 + int(rng.integers(-6, 7)), 118 + int(rng.integers(-6, 7))
    if not male:  # long hair behind the face, down to the shoulders
        draw.ellipse((cx - 62, cy - 75, cx + 62, cy + 95), fill=hair)
    face = colour((225, 180, 150) if not male else (200, 150, 120))
    fw, fh = (48, 62) if not male else (54, 66)
    draw.ellipse((cx - fw, cy - fh, cx + fw, cy + fh), fill=face)
    draw.chord((cx - fw, cy - fh - 6, cx + fw, cy + 10), 180, 360, fill=hair)  # hair top
    for dx in (-20, 20):  # eyes
        draw.ellipse((cx + dx - 7, cy - 8, cx + dx + 7, cy + 2), fill=(40, 30, 30))
    mouth = (190, 60, 70) if not male else (150, 80, 70)
    draw.ellipse((cx - 16, cy + 28, cx + 16, cy + 38), fill=mouth)
    if male and rng.random() < 0.6:  # beard
        draw.chord((cx - fw + 6, cy + 5, cx + fw - 6, cy + fh), 0, 180, fill=hair)
    pixels = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (HEIGHT, WIDTH, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_fixture(out: Path, num: int = 300, seed: int = 0) -> Path:
    """Write a synthetic CelebA of ``num`` images under ``out/celeba``; return that folder.

    Formats as in the real files (and as torchvision's ``CelebA`` parses them); images
    1..80% are partition 0 (train), the next 10% partition 1 (valid), the rest 2 (test),
    like CelebA's consecutive ranges. About 42% are male, as in CelebA.
    """
    if num < 10:
        raise ValueError(f"--num must be at least 10, got {num}")
    rng = np.random.default_rng(seed)
    folder = Path(out) / "celeba"
    (folder / IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(1, num + 1)]
    attrs = np.where(rng.random((num, len(ATTRIBUTES))) < 0.3, 1, -1)
    male = rng.random(num) < 0.42
    attrs[:, ATTRIBUTES.index("Male")] = np.where(male, 1, -1)
    n_train, n_valid = int(num * 0.8), int(num * 0.1)
    partition = [0] * n_train + [1] * n_valid + [2] * (num - n_train - n_valid)
    for name, is_male in zip(names, male, strict=True):
        _fixture_image(rng, bool(is_male)).save(folder / IMAGE_DIR / name, quality=95)

    def table(header: list[str] | None, rows: list[str]) -> str:
        head = [str(num), " ".join(header) + " "] if header else []
        return "\n".join(head + rows) + "\n"

    values = [" ".join(f"{v:2d}" for v in row) for row in attrs]
    ids = rng.integers(1, 10178, num)
    marks = " ".join(f"{v:>4d}" for v in (69, 109, 106, 113, 77, 142, 73, 152, 108, 154))
    box = f"{95:>5d} {71:>4d} {226:>4d} {313:>4d}"
    texts = {  # each text file's header and its value columns after the file name
        ATTR_FILE: (ATTRIBUTES, values),
        PARTITION_FILE: (None, partition),
        "identity_CelebA.txt": (None, [int(i) for i in ids]),
        "list_bbox_celeba.txt": ("image_id x_1 y_1 width height".split(), [box] * num),
        "list_landmarks_align_celeba.txt": (LANDMARKS, [marks] * num),
    }
    for file, (header, column) in texts.items():
        rows = [f"{n} {v}" for n, v in zip(names, column, strict=True)]
        write_text(folder / file, table(header, rows))
    write_text(folder / SOURCE_MARKER, f"synthetic CelebA fixture: {num} images, seed {seed}\n")
    return folder


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "celeba-fixture",
        help="write a small synthetic CelebA (torchvision layout) for tests and the smoke run",
    )
    p.add_argument("--out", type=Path, required=True, help="folder; writes OUT/celeba/...")
    p.add_argument("--num", type=int, default=300, help="number of images")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    folder = make_fixture(args.out, args.num, args.seed)
    print(f"wrote a synthetic CelebA of {args.num} images to {folder}")
    return 0
