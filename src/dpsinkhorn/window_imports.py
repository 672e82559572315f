"""What a GPU window imports: a committed run's generator, ledger and training log, copied
into the working folder only when they are what the ledger describes (``dpsinkhorn
gpu-window``'s ``import:`` items; docs in benchmarks/README.md). The bytes checked are the
bytes written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config.experiments import experiment_dir
from dpsinkhorn.config.targets import results_dir

#: An import source ``repo:<path>`` is a folder of this repository (a committed results set):
#: it travels with the tree, so the carry plan leaves it out.
REPO_PREFIX = "repo:"
REPO = Path(__file__).resolve().parents[2]


def source_path(source: str, import_root: Path | None, item: str, exp: str) -> Path:
    """Where the import ``source`` of ``exp`` lies: ``repo:<path>`` under the repository,
    an absolute path as it is, anything else under ``--import-root``."""
    if source.startswith(REPO_PREFIX):
        return REPO / source[len(REPO_PREFIX) :]
    if Path(source).is_absolute():
        return Path(source)
    if import_root is None:
        raise ValueError(f"work item {item}: import {exp} from {source!r} needs --import-root")
    return import_root / source


class ImportRefused(ValueError):
    """An import whose generator or log is not the one its ledger describes (one line
    naming the file): the window item fails, it does not wait."""


def _checked(path: Path, expected: Mapping[str, str | None]) -> bytes:
    """The bytes of ``path``, read once, whose sha256 equals every non-None value of
    ``expected`` (where it was recorded -> the hash); else :class:`ImportRefused`."""
    data = path.read_bytes()
    digest = fileio.sha256_of_bytes(data)
    for where, want in expected.items():
        if want is not None and digest != want:
            raise ImportRefused(
                f"{path}: not the file its ledger describes (sha256 differs from {where}); "
                "refusing to import it"
            )
    return data


def import_generators(
    item: Mapping, config: Mapping, workdir: Path, import_root: Path | None, state: dict
) -> None:
    """Copy a committed run's generator.pt, privacy.json and train_log.csv into the working
    folder (once a call): its FID is then measured by the workflow's own rules.

    Each file is checked against its ledger (privacy.json), and the bytes checked are the
    bytes written: generator.pt against ``content_sha256`` (and the window file's pinned
    ``sha256``, which a ledger written before ``content_sha256`` existed needs),
    train_log.csv against ``train_log_sha256`` (a log its ledger records no hash of is not
    imported). A mismatch or a generator nothing can check is :class:`ImportRefused`."""
    pins = item.get("pins", {})
    for exp, source in item["import"].items():
        dest = experiment_dir(config, workdir / results_dir(config), exp)
        if (dest / "generator.pt").is_file():
            continue
        src = source_path(source, import_root, item["name"], exp)
        if not (src / "generator.pt").is_file() or not (src / "privacy.json").is_file():
            raise FileNotFoundError(f"{src}: no generator.pt and privacy.json to import for {exp}")
        ledger_bytes = (src / "privacy.json").read_bytes()
        try:
            ledger = json.loads(ledger_bytes)
        except json.JSONDecodeError as err:
            raise ImportRefused(f"{src / 'privacy.json'}: not JSON ({err.msg})") from None
        expected = {
            f"content_sha256 in {src / 'privacy.json'}": ledger.get("content_sha256"),
            f"the sha256 the window file pins for {exp}": pins.get(exp),
        }
        if not any(expected.values()):
            raise ImportRefused(
                f"{src / 'generator.pt'}: its ledger records no content_sha256 to check it "
                f"against; pin it in the window file (import: {{{exp}: {{source: {source}, "
                "sha256: <hex>}})"
            )
        generator = _checked(src / "generator.pt", expected)
        files = {"privacy.json": ledger_bytes, "generator.pt": generator}
        log_sha256 = ledger.get("train_log_sha256")
        if log_sha256 is not None:
            if not (src / "train_log.csv").is_file():
                raise ImportRefused(
                    f"{src / 'train_log.csv'}: missing (its ledger records train_log_sha256)"
                )
            where = f"train_log_sha256 in {src / 'privacy.json'}"
            files["train_log.csv"] = _checked(src / "train_log.csv", {where: log_sha256})
        for name in ("train_log.csv", "privacy.json", "generator.pt"):  # the generator last
            if name in files:
                fileio.write_bytes(dest / name, files[name])
        state.setdefault("imports", {})[exp] = {
            "source": str(source),
            "bytes": len(generator),
            "sha256": fileio.sha256_of_bytes(generator),
            "checked_against": [where for where, want in expected.items() if want],
        }
