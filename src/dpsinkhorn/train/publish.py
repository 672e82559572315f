"""The release of a run, defined by the code: its manifest, and ``dpsinkhorn release``.

A run folder ``results/<run>/`` holds two kinds of files:

* **DP releases**: each DP experiment's folder ``<run>/<exp>/`` holds only what its ledger
  ``privacy.json`` covers: ``generator.pt``, ``privacy.json``, ``train_log.csv``
  (``train.release``), ``samples_seed*.npz`` drawn from the generator, and the FID and
  classifier scores of those samples when the test split they are scored against is
  public (``config.PUBLIC_TEST_SPLITS``). ``privacy_summary.json`` (the composed ε of all
  releases, ``report.privacy_summary``) reads the ledgers only and is covered by them all.
* **Not private**: everything else computed from the private data lives under
  ``<run>/nonprivate/``: non-private experiments (``sinkhorn``, ``real_data``: a raw draw
  from the training set), gradient studies (Figure 4c), FID statistics of test splits, and
  scores against a private test split. Tables, figures, ``reproduction.md`` and the
  Snakemake report mix both kinds and are never part of a release.

:func:`write_manifest` (``dpsinkhorn release-manifest``, the workflow's last step) writes
``<run>/release_manifest.json``: every publishable file with its sha256, the ledger(s)
covering it and their guarantee. :func:`release` (``dpsinkhorn release --run <run> --out
DIR``) copies exactly those files, after refusing an incomplete run (a missing or changed
file, a ledger missing from the manifest, a ``private_workspace/`` left), a file outside a
DP folder, a non-private ledger, and a ledger whose guarantee is ``none…`` (public noise
seed) unless ``--accept-no-guarantee``. Torch-free.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from dpsinkhorn import fileio
from dpsinkhorn.config import NONPRIVATE, experiment_dir, load_config, private_experiments
from dpsinkhorn.config.targets import (
    privacy_summary_file,
    release_inputs,
    release_manifest_file,
)
from dpsinkhorn.fileio import sha256_of

MANIFEST = "release_manifest.json"
LEDGER = "privacy.json"
WORKSPACE = "private_workspace"
#: A ledger's ``guarantee`` starts with this when it covers nothing (public noise seed).
NO_GUARANTEE = "none"
#: Version of the manifest's layout.
MANIFEST_VERSION = 1


#: What the code publishes, by kind: a file of a DP folder ``<exp>/<name>`` or the run's
#: summary, and where the hash it is checked against was written when it was produced.
KINDS = {
    "generator": "generator.pt: content_sha256 in its ledger (train.release.publish)",
    "ledger": "privacy.json: the ledger itself",
    "train_log": "train_log.csv: train_log_sha256 in its ledger (train.release.publish)",
    "samples": "samples_seed<k>.npz: <file>.sha256 (fileio.save_samples)",
    "scores": "fid_seed<k>.json, acc_<model>_seed<k>.json: <file>.sha256 "
    "(fileio.write_json(..., record=True))",
    "privacy_summary": "privacy_summary.json: <file>.sha256 (dpsinkhorn privacy-summary)",
}
_IN_DP_FOLDER = {
    "generator": r"generator\.pt",
    "ledger": re.escape(LEDGER),
    "train_log": r"train_log\.csv",
    "samples": r"samples_seed\d+\.npz",
    "scores": r"(fid|acc_[a-z0-9]+)_seed\d+\.json",
}


def file_kind(rel: str) -> str | None:
    """The kind (:data:`KINDS`) of a path relative to a run or experiment folder, or None:
    a file the code never publishes."""
    parts = PurePosixPath(rel).parts
    if parts == ("privacy_summary.json",):
        return "privacy_summary"
    if not 1 <= len(parts) <= 2 or (len(parts) == 2 and parts[0] in (NONPRIVATE, WORKSPACE)):
        return None
    return next(
        (k for k, pattern in _IN_DP_FOLDER.items() if re.fullmatch(pattern, parts[-1])), None
    )


def check_produced(path: Path, rel: str) -> None:
    """Refuse (ValueError, one line naming the file) a file the code does not publish, or
    whose bytes are not those its producing step recorded (:data:`KINDS`)."""
    kind = file_kind(rel)
    if kind is None:
        raise ValueError(
            f"{path}: not a file dpsinkhorn publishes (no ledger covers it); refusing an "
            "entry the code did not write"
        )
    if kind == "ledger":
        return
    digest = sha256_of(path)
    if kind in ("generator", "train_log"):
        ledger_path = path.parent / LEDGER
        key = "content_sha256" if kind == "generator" else "train_log_sha256"
        expected = fileio.read_json(ledger_path).get(key) if ledger_path.is_file() else None
        where = f"{key} in {ledger_path}"
    else:
        expected, where = fileio.recorded_sha256(path), f"{path.name}{fileio.SHA256_SUFFIX}"
    if expected is None:
        raise ValueError(f"{path}: no hash recorded when it was produced ({where} missing)")
    if digest != expected:
        raise ValueError(
            f"{path}: not the file that was produced (sha256 differs from {where}); "
            "refusing to publish it"
        )


def _workspaces(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob(WORKSPACE) if p.is_dir())


def build_manifest(config: Mapping, results: str | Path) -> dict:
    """The manifest of a finished run: every publishable file, its hash and its ledgers."""
    run = Path(results)
    left = _workspaces(run)
    if left:
        raise ValueError(f"{left[0]}: a private workspace is left (the run is not complete)")
    ledgers = {
        e: (experiment_dir(config, run, e) / LEDGER).relative_to(run).as_posix()
        for e in private_experiments(config)
    }
    guarantees = {}
    for ledger in ledgers.values():
        if not (run / ledger).exists():
            raise FileNotFoundError(f"{run / ledger}: missing (the run is not complete)")
        record = fileio.read_json(run / ledger)
        if record.get("private") is not True:
            raise ValueError(
                f"{run / ledger}: not a DP ledger (private is {record.get('private')!r})"
            )
        guarantees[ledger] = record.get("guarantee")
    files = []
    summary = Path(privacy_summary_file(run)).relative_to(run).as_posix()
    for path in release_inputs(config, run) if ledgers else []:
        rel = Path(path).relative_to(run).as_posix()
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: missing (the run is not complete)")
        check_produced(Path(path), rel)
        covering = (
            sorted(ledgers.values()) if rel == summary else [rel.split("/")[0] + "/" + LEDGER]
        )
        files.append({
            "path": rel,
            "sha256": sha256_of(Path(path)),
            "ledgers": covering,
            "guarantees": [guarantees[x] for x in covering],
        })  # fmt: skip
    return {
        "version": MANIFEST_VERSION,
        "run": config.get("run_name"),
        "ledgers": guarantees,
        "files": files,
        "not_released": f"everything else in this folder, {NONPRIVATE}/ first: it is computed "
        "from the private data without a ledger, or mixes such rows (tables, figures, reports)",
    }


def write_manifest(config: Mapping, results: str | Path) -> Path:
    """Write ``<results>/release_manifest.json`` (atomically); return its path."""
    path = Path(release_manifest_file(results))
    fileio.write_json(path, build_manifest(config, results))
    return path


#: What a single experiment folder (``dpsinkhorn train --out``, ``api.train``) publishes:
#: the files its ledger covers, as ``train.release`` writes them.
EXPERIMENT_FILES = ("generator.pt", LEDGER, "train_log.csv")


def write_experiment_manifest(exp_dir: str | Path) -> Path:
    """The manifest of one experiment folder trained alone (no workflow run around it):
    its ``generator.pt``, ``privacy.json`` and ``train_log.csv``, all covered by that
    ``privacy.json``. Refuses (ValueError / FileNotFoundError, one line) a folder with a
    private workspace left, a missing file, or a ledger that is not a DP one."""
    exp = Path(exp_dir)
    left = _workspaces(exp)
    if left:
        raise ValueError(f"{left[0]}: a private workspace is left (the run is not complete)")
    for name in EXPERIMENT_FILES:
        if not (exp / name).is_file():
            raise FileNotFoundError(f"{exp / name}: missing (the run is not complete)")
    record = fileio.read_json(exp / LEDGER)
    if record.get("private") is not True:
        raise ValueError(f"{exp / LEDGER}: not a DP ledger (private is {record.get('private')!r})")
    for name in EXPERIMENT_FILES:
        check_produced(exp / name, name)
    guarantee = record.get("guarantee")
    manifest = {
        "version": MANIFEST_VERSION,
        "run": record.get("experiment"),
        "ledgers": {LEDGER: guarantee},
        "files": [
            {"path": name, "sha256": sha256_of(exp / name), "ledgers": [LEDGER],
             "guarantees": [guarantee]}
            for name in EXPERIMENT_FILES
        ],
        "not_released": "everything else in this folder",
    }  # fmt: skip
    path = exp / MANIFEST
    fileio.write_json(path, manifest)
    return path


#: How ``dpsinkhorn release`` names the option that accepts a public-seed ledger.
ACCEPT_FLAG = "--accept-no-guarantee"


def _checked_entry(
    run: Path, entry: Mapping, ledgers: Mapping, accept_none: bool, flag: str = ACCEPT_FLAG
) -> Path:
    """The file of one manifest entry, after every refusal that concerns it."""
    rel = PurePosixPath(str(entry.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"{run / MANIFEST}: path {str(rel)!r} is not inside the run")
    if rel.parts[0] == NONPRIVATE or WORKSPACE in rel.parts:
        raise ValueError(f"{run / rel}: not private (no ledger covers it); refusing to release")
    for ledger in entry.get("ledgers") or [None]:
        if ledger not in ledgers:
            raise ValueError(f"{run / rel}: its ledger {ledger!r} is not in the manifest")
        guarantee = ledgers[ledger]
        if guarantee is None:
            raise ValueError(f"{run / ledger}: no guarantee (a non-private run); refusing")
        if str(guarantee).startswith(NO_GUARANTEE) and not accept_none:
            raise ValueError(
                f"{run / ledger}: guarantee is {guarantee!r}; pass {flag} to publish it anyway"
            )
    if file_kind(str(rel)) is None:
        raise ValueError(
            f"{run / rel}: not a file dpsinkhorn publishes (no ledger covers it); refusing a "
            "manifest entry the code did not write"
        )
    expected = [rel.parts[0] + "/" + LEDGER] if len(rel.parts) == 2 else None
    if expected is not None and list(entry.get("ledgers") or []) != expected:
        raise ValueError(f"{run / rel}: listed with ledgers {entry.get('ledgers')!r}, not its own")
    path = run / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the run is not complete)")
    if sha256_of(path) != entry.get("sha256"):
        raise ValueError(f"{path}: changed since the manifest was written (sha256 differs)")
    check_produced(path, str(rel))
    return path


def check_release(
    run: str | Path, accept_no_guarantee: bool = False, flag: str = ACCEPT_FLAG
) -> list[Path]:
    """The files a release of ``run`` copies (its manifest first), or a one-line refusal
    (``flag``: how the caller names the option that accepts a public-seed ledger)."""
    run = Path(run)
    manifest_path = run / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: missing (the run is not complete)")
    left = _workspaces(run)
    if left:
        raise ValueError(f"{left[0]}: a private workspace is left (the run is not complete)")
    manifest = fileio.read_json(manifest_path)
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{manifest_path}: version {manifest.get('version')!r}, expected 1")
    ledgers = manifest.get("ledgers") or {}
    on_disk = {p.relative_to(run).as_posix() for p in [*run.glob(LEDGER), *run.glob(f"*/{LEDGER}")]}
    unlisted = sorted(on_disk - set(ledgers))
    if unlisted:
        raise ValueError(f"{run / unlisted[0]}: a ledger the manifest does not list (stale?)")
    entries = manifest.get("files") or []
    if not entries:
        raise ValueError(f"{manifest_path}: lists no DP release (nothing to publish)")
    paths = [_checked_entry(run, e, ledgers, accept_no_guarantee, flag) for e in entries]
    listed = {e["path"] for e in entries}
    for ledger in ledgers:
        if ledger not in listed:
            raise ValueError(f"{run / ledger}: a ledger that is not itself in the manifest")
    return [manifest_path, *paths]


def check_out(out: str | Path) -> None:
    """Refuse a release folder that exists and is not an empty folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty folder")


def release(
    run: str | Path, out: str | Path, accept_no_guarantee: bool = False, flag: str = ACCEPT_FLAG
) -> list[Path]:
    """Copy the run's release into ``out`` (new or empty), all at once; return its files."""
    run, out = Path(run), Path(out)
    check_out(out)
    files = check_release(run, accept_no_guarantee, flag)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        for src in files:
            dst = tmp / src.relative_to(run)
            dst.parent.mkdir(parents=True, exist_ok=True)
            fileio.write_bytes(dst, src.read_bytes())
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return [out / src.relative_to(run) for src in files]


def _release_cli(args: argparse.Namespace) -> int:
    files = release(args.run, args.out, args.accept_no_guarantee)
    print(f"released {len(files)} files of {args.run} to {args.out}")
    return 0


def _manifest_cli(args: argparse.Namespace) -> int:
    print(write_manifest(load_config(args.config), args.results))
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    r = subparsers.add_parser(
        "release", help="copy a finished run's DP releases (its manifest) to a new folder"
    )
    r.add_argument("--run", required=True, help="results/<run>")
    r.add_argument("--out", required=True, help="a new or empty folder")
    r.add_argument(
        "--accept-no-guarantee",
        action="store_true",
        help='also release runs whose ledger says "guarantee": "none..." (public noise seed)',
    )
    r.set_defaults(handler=_release_cli)
    m = subparsers.add_parser(
        "release-manifest", help="write <results>/release_manifest.json (the workflow's last step)"
    )
    m.add_argument("--config", nargs="+", default=["config/config.yaml"])
    m.add_argument("--results", required=True, help="results/<run>")
    m.set_defaults(handler=_manifest_cli)
