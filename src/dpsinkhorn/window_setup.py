"""The window file of ``dpsinkhorn gpu-window``, and what its calls carry in, planned to fit
each call's transfer limit.

A fresh GPU machine needs the wheels the project's workflow adds to a PyTorch image, the
raw archives of the datasets its work items use, generators to import, and the Inception
weights of FID. Together they exceed one call's transfer (64 MiB by default), so
:func:`plan_carry` packs them into numbered setup folders, one a call, in the order the
work list needs them: the wheels, then per work item its datasets and imports, the FID
weights (without the 1,008-class fc layer, which FID never reads: 87.3 of 95.6 MB) with
the first item that evaluates. Only the weights are split, into byte-range parts, at a
call's boundary. A dataset travels in the first call whose item needs it, never before. The
archive of ``dpsinkhorn gpu-window`` leaves out :data:`DEFAULT_EXCLUDE` (or the window
file's ``archive_exclude``), never the training record (``window.pack_workdir``).
Each call also keeps room for the archive it carries (the last call's, packed within a cap
by :func:`pack_within`, which drops compiled kernels first and never a result; call 1's
may be an archive given to the plan, the one the last allocation left).

On the GPU machine :func:`take_setup` copies a carried folder into the machine's cache
(``/tmp/window`` while the machine stays warm) and joins the weights once all parts are
there, checking the whole file's SHA-256. :func:`missing_needs` tells the window which
items cannot run yet (and why), so they are skipped, not failed. :func:`run_until` runs
one item's Snakemake until the call's deadline. :func:`import_generators` copies a work
item's committed generators in, each checked against its ledger.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from dpsinkhorn import fileio
from dpsinkhorn.config.experiments import experiment_names, prepared_folder_of
from dpsinkhorn.config.validate import OVERRIDABLE, load_config
from dpsinkhorn.window_imports import REPO, REPO_PREFIX

#: What a call can rebuild and the archive therefore leaves out (paths in the working folder;
#: the training record under ``data/trainings/`` is kept all the same: ``window.pack_workdir``).
DEFAULT_EXCLUDE = (
    "data/*",
    "*/samples_seed*.npz",
    "*/fid_ref_*.npz",
    ".snakemake/locks/*",
    ".snakemake/log/*",
    ".snakemake/auxiliary/*",
)
WINDOW_KEYS = {"configfile", "overrides", "work", "archive_exclude", "signal_grace_s", "outputs"}
ITEM_KEYS = {"name", "experiments", "import", "long"}
MIB = 1 << 20
#: The FID weights' name in the machine's cache (joined from ``WEIGHTS_PART*``).
WEIGHTS = "inception_pool3.pth"
WEIGHTS_PART = "inception_pool3.pth.part"
PLAN = "carry.json"
#: The archive the window packs for the next call (``--archive-cap-mib``) and the carry
#: plan keeps room for: the one measured archive that did not travel (H100 at 0f6b577,
#: call 1: 12,855,824 bytes, a compiled-kernel cache and one checkpoint) and results.
ARCHIVE_CAP_MIB = 16.0
#: Raw files of the built-in datasets (torchvision's names), by dataset key.
RAW_FOLDERS = {"mnist": "MNIST", "fmnist": "FashionMNIST"}


#: Keys a window file may no longer hold, and why.
REMOVED_KEYS = {
    "outputs": "removed: an experiment's evaluation is one job (dpsinkhorn evaluate) that "
    "writes FID and every classifier of its dataset; the window asks for all of them",
}


def load_window(path: str | Path) -> dict:
    """The window file, checked: unknown keys, a missing work list or a bad item are
    one-line errors naming the file and key. An item's ``long: true`` lets the window start
    its trainings although they cannot finish in the allocation (or have no measured rate)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: window file not found")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping")
    for key in data:
        if key in REMOVED_KEYS:
            raise ValueError(f"{path}: {key!r} is {REMOVED_KEYS[key]}")
        if key not in WINDOW_KEYS:
            raise ValueError(
                f"{path}: unknown key {key!r} (known: {', '.join(sorted(WINDOW_KEYS))})"
            )
    for key in ("configfile", "work"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    config_path = Path(data["configfile"])
    if not config_path.is_absolute():
        config_path = (
            (path.parent / config_path)
            if (path.parent / config_path).is_file()
            else REPO / config_path
        )
    window = {
        "path": path,
        "configfile": str(data["configfile"]),
        "config_path": config_path.resolve(),
        "overrides": [str(o) for o in data.get("overrides") or []],
        "archive_exclude": list(data.get("archive_exclude") or DEFAULT_EXCLUDE),
        "signal_grace_s": float(data.get("signal_grace_s", 60)),
        "work": [],
    }
    for override in window["overrides"]:
        if override.split("=")[0] not in OVERRIDABLE or "=" not in override:
            raise ValueError(
                f"{path}: overrides: {override!r} is not KEY=VALUE of {', '.join(OVERRIDABLE)}"
            )
    config = load_config([window["config_path"]])
    known = set(experiment_names(config))
    names = set()
    for k, item in enumerate(data["work"] or []):
        at = f"{path}: work[{k}]"
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"{at}: each item needs a name")
        for key in item:
            if key in REMOVED_KEYS:
                raise ValueError(f"{at}.{key}: {REMOVED_KEYS[key]}")
            if key not in ITEM_KEYS:
                raise ValueError(
                    f"{at}: unknown key {key!r} (known: {', '.join(sorted(ITEM_KEYS))})"
                )
        if item["name"] in names:
            raise ValueError(f"{at}.name: {item['name']!r} used twice")
        names.add(item["name"])
        imports, pins = _imports(item.get("import") or {}, f"{at}.import")
        exps = list(item.get("experiments") or []) + [
            e for e in imports if e not in (item.get("experiments") or [])
        ]
        if not exps:
            raise ValueError(f"{at}: give experiments or import")
        for exp in exps:
            if exp not in known:
                raise ValueError(f"{at}: unknown experiment {exp!r} of {config_path}")
        if not isinstance(item.get("long", False), bool):
            raise ValueError(f"{at}.long: must be true or false, got {item['long']!r}")
        window["work"].append(
            {
                "name": item["name"],
                "experiments": exps,
                "import": imports,
                "pins": pins,
                "long": item.get("long", False),
            }
        )
    return window


def _imports(given: Mapping, at: str) -> tuple[dict[str, str], dict[str, str]]:
    """An item's ``import:`` as {experiment: source} and {experiment: pinned sha256}. Each
    value is a source folder, or ``{source: ..., sha256: ...}`` pinning the generator's
    SHA-256 (needed when its ledger predates ``content_sha256``)."""
    if not isinstance(given, Mapping):
        raise ValueError(f"{at}: must map experiments to source folders")
    imports, pins = {}, {}
    for exp, value in given.items():
        if isinstance(value, Mapping):
            unknown = set(value) - {"source", "sha256"}
            digest = str(value.get("sha256", ""))
            if (
                unknown
                or "source" not in value
                or len(digest) != 64
                or not all(c in "0123456789abcdef" for c in digest)
            ):
                raise ValueError(
                    f"{at}.{exp}: give a source folder, or {{source: <folder>, sha256: "
                    "<64 lowercase hex digits>}"
                )
            imports[exp], pins[exp] = str(value["source"]), digest
        else:
            imports[exp] = str(value)
    return imports, pins


def _size(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else (path.stat().st_size)
    )


def item_needs(config: Mapping, item: Mapping) -> dict[str, list[str]]:
    """``{"datasets": [...], "imports": [...]}`` of one work item (config: the workflow's)."""
    from dpsinkhorn.config.experiments import dataset_of

    datasets = list(dict.fromkeys(dataset_of(config, e) for e in item["experiments"]))
    return {"datasets": datasets, "imports": list(item["import"].values())}


def plan_carry(
    window: Mapping,
    dest: Path,
    *,
    mirror: Path,
    weights: Path,
    import_root: Path | None = None,
    wheels: Path | None = None,
    limit_mib: float = 64,
    tree_bytes: int = 0,
    archive_mib: float = ARCHIVE_CAP_MIB,
    archive_in: Path | None = None,
) -> list[dict]:
    """Write ``dest/setup1``, ``dest/setup2``, ... and ``dest/carry.json``; return one
    entry per call: its folder, bytes, the archive it carries and what it holds.

    Each call keeps free ``tree_bytes`` (the working tree that travels with every call),
    1 MiB of margin and the archive it will carry: call 1 the archive given here
    (``archive_in``, e.g. the one the last allocation left: its measured bytes), or none;
    every later call the last call's archive, which the window packs within
    ``archive_mib`` (:func:`pack_within`)."""
    from dpsinkhorn.evaluate.inception import strip_fc

    for flag, value in (("--archive-mib", archive_mib), ("--tree-bytes", tree_bytes)):
        if not 0 <= value < float("inf"):  # less would plan calls beyond the limit
            raise ValueError(f"{flag} {value}: give a number of at least 0")
    config = load_config([window["config_path"]])
    first = sum(p.stat().st_size for p in fileio.archive_parts(archive_in)) if archive_in else 0
    carried = [first]  # the archive each call carries: call 1's, then the cap

    def room(call: int) -> int:
        while len(carried) <= call:
            carried.append(int(archive_mib * MIB))
        return int(limit_mib * MIB) - tree_bytes - MIB - carried[call]

    if room(0) <= 0 or room(1) <= 0:
        raise ValueError(
            f"--limit-mib {limit_mib}: no room beside the tree ({tree_bytes} bytes) and the "
            f"archive ({max(carried[:2])} bytes; --archive-mib {archive_mib})"
        )
    pieces: list[tuple[str, Path]] = []  # (name in the setup folder, source)
    if wheels is not None:
        pieces.append(("wheels", wheels))
    stripped = dest / "work" / WEIGHTS
    shutil.rmtree(dest / "work", ignore_errors=True)  # an earlier plan's, stopped: strip again
    for item in window["work"]:
        needs = item_needs(config, item)
        for dataset in needs["datasets"]:
            folder = RAW_FOLDERS.get(dataset)
            if folder is None:
                raise ValueError(f"work item {item['name']}: no raw archives for {dataset!r}")
            pieces.append((f"mirror/{folder}", mirror / folder))
        for source in needs["imports"]:
            if source.startswith(REPO_PREFIX):
                continue  # a folder of the repository: the tree carries it
            if import_root is None:
                raise ValueError(f"work item {item['name']}: imports need --import-root")
            pieces.append((f"import/{source}", import_root / source))
        if not stripped.exists():
            strip_fc(weights, stripped)
            pieces.append((WEIGHTS, stripped))
    seen, calls, used = set(), [[]], 0
    for name, source in pieces:
        if name in seen:
            continue
        seen.add(name)
        size = _size(source)
        if name != WEIGHTS:
            if size > min(room(0), room(1)):
                raise ValueError(
                    f"{source}: {size} bytes do not fit one call "
                    f"({min(room(0), room(1))} free beside the tree and the archive)"
                )
            if used + size > room(len(calls) - 1):
                calls.append([])
                used = 0
            calls[-1].append((name, source, 0, size))
            used += size
            continue
        start = 0
        while start < size:  # the weights: byte ranges filling each call
            if used >= room(len(calls) - 1):
                calls.append([])
                used = 0
            take = min(size - start, room(len(calls) - 1) - used)
            calls[-1].append((name, source, start, take))
            used += take
            start += take
    plan = _write_calls(calls, dest, stripped)
    room(len(plan))  # the archive of every call known
    for k, call in enumerate(plan):
        call["archive_bytes"] = carried[k]
        call["archive"] = (
            f"{archive_in} (measured)"
            if k == 0 and archive_in
            else "none"
            if k == 0
            else f"call {k}'s, packed within {archive_mib} MiB"
        )
        call["total_bytes"] = tree_bytes + call["bytes"] + carried[k]
    fileio.write_json(dest / PLAN, plan)
    shutil.rmtree(dest / "work", ignore_errors=True)
    for old in dest.glob("setup*"):  # an earlier, longer plan's calls: never carried now
        if old.is_dir() and old.name not in {c["folder"] for c in plan}:
            shutil.rmtree(old)
    return plan


def _write_calls(calls: list[list[tuple]], dest: Path, stripped: Path) -> list[dict]:
    parts = [c for call in calls for c in call if c[0] == WEIGHTS]
    digest = fileio.sha256_of(stripped) if parts else None
    plan, index = [], 0
    for k, call in enumerate(calls, start=1):
        folder = dest / f"setup{k}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        holds = []
        for name, source, start, size in call:
            if name == WEIGHTS:
                with open(source, "rb") as fh:
                    fh.seek(start)
                    part = folder / f"{WEIGHTS_PART}{index:03d}"
                    part.write_bytes(fh.read(size))
                meta = {"part": index, "parts": len(parts), "sha256": digest}
                fileio.write_json(folder / f"{part.name}.json", meta)
                holds.append(f"{part.name} ({size} bytes of {WEIGHTS})")
                index += 1
            elif source.is_dir():
                shutil.copytree(source, folder / name)
                holds.append(f"{name} ({size} bytes)")
            else:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, folder / name)
                holds.append(f"{name} ({size} bytes)")
        plan.append({"call": k, "folder": folder.name, "bytes": _size(folder), "holds": holds})
    return plan


def take_setup(carried: Path, cache: Path) -> list[str]:
    """Copy a carried setup folder into ``cache`` (merging folders) and join the weights
    when all their parts are there; returns what was taken."""
    taken = []
    for path in sorted(carried.iterdir()):
        target = cache / path.name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        taken.append(path.name)
    _join_weights(cache)
    return taken


def _join_weights(cache: Path) -> None:
    metas = sorted(cache.glob(f"{WEIGHTS_PART}*.json"))
    if not metas or (cache / WEIGHTS).exists():
        return
    meta = json.loads(metas[0].read_text())
    parts = [cache / f"{WEIGHTS_PART}{k:03d}" for k in range(meta["parts"])]
    if not all(p.is_file() for p in parts):
        return
    with fileio.atomic_path(cache / WEIGHTS) as tmp:
        with open(tmp, "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        if fileio.sha256_of(tmp) != meta["sha256"]:
            raise ValueError(f"{cache / WEIGHTS}: joined parts have another SHA-256")
    for path in [*parts, *metas]:
        path.unlink()


def missing_needs(
    config: Mapping, item: Mapping, mirror: Path | None, prepared: Path, weights: Path | None
) -> list[str]:
    """What item ``item`` needs that is not here yet: a dataset neither prepared (under
    ``prepared``) nor in the mirror, or the FID weights file."""
    missing = []
    for dataset in item_needs(config, item)["datasets"]:
        folder = RAW_FOLDERS.get(dataset, dataset)
        in_mirror = mirror is not None and (mirror / folder / "raw").is_dir()
        if (
            not in_mirror
            and not (prepared / prepared_folder_of(config, dataset) / "test.npz").is_file()
        ):
            missing.append(f"dataset {dataset}")
    if weights is not None and not Path(weights).is_file():
        missing.append(f"FID weights {weights}")
    return missing


def describe(plan: Sequence[Mapping]) -> str:
    """One line per call: its folder, bytes, the archive beside it, contents."""
    return "\n".join(
        f"call {c['call']}: {c['folder']}/ {c['bytes']} bytes + archive {c['archive_bytes']} "
        f"bytes ({c['archive']}) + tree = {c['total_bytes']} bytes: {'; '.join(c['holds'])}"
        for c in plan
    )


#: What the window drops from an archive over its cap, cheapest to rebuild first: only the
#: compiled kernels (the next call compiles them again); never results, generators,
#: checkpoints or ledgers.
REBUILDABLE = (("compiled kernels", ("inductor-cache/*",)),)


def pack_within(
    workdir: Path,
    archive: Path,
    exclude: Sequence[str],
    part_mib: float,
    cap_mib: float | None,
    keep: Sequence[str] = (),
) -> tuple[list[Path], list[str], int]:
    """:func:`fileio.pack` ``workdir``; while the archive is over ``cap_mib`` (None: no
    cap), pack it again without the next of :data:`REBUILDABLE`. Returns the files, what
    was dropped and the bytes; an archive still over the cap is kept whole (never a result
    dropped) and the caller says so."""
    parts, dropped = fileio.pack(workdir, archive, exclude, part_mib, keep=keep), []
    size = sum(p.stat().st_size for p in parts)
    for what, patterns in REBUILDABLE:
        if cap_mib is None or size <= cap_mib * MIB:
            break
        exclude = [*exclude, *patterns]
        parts = fileio.pack(workdir, archive, exclude, part_mib, keep=keep)
        size = sum(p.stat().st_size for p in parts)
        dropped.append(what)
    return parts, dropped, size


def run_until(
    cmd: Sequence[str], deadline: float, grace_s: float, log: Path, cwd: Path | None = None
) -> str:
    """Run ``cmd`` in its own process group until it ends or ``deadline`` (time.monotonic);
    at the deadline SIGTERM the group, after ``grace_s`` SIGKILL it. Returns ``done``,
    ``failed`` or ``deadline``."""
    with open(log, "a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
        stop = []  # this command stopped (SIGTERM, SIGINT): stop Snakemake as at the deadline
        handlers = {
            sig: signal.signal(sig, lambda *_: stop.append(1))
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            while proc.poll() is None and time.monotonic() < deadline and not stop:
                time.sleep(0.2)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        if proc.poll() is not None:
            return "done" if proc.returncode == 0 else "failed"
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # children of the group that outlived Snakemake
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return "deadline"


def register_cli(subparsers) -> None:  # argparse._SubParsersAction
    """Add ``gpu-window-carry``."""
    p = subparsers.add_parser(
        "gpu-window-carry",
        help="pack what the calls of a GPU window carry in (setup1/, setup2/, ...), each "
        "within one call's transfer limit",
    )
    p.add_argument("--config", default="benchmarks/gpu/window.yaml", help="the window file")
    p.add_argument("--out", required=True, help="folder for setup<k>/ and carry.json")
    p.add_argument("--mirror", required=True, help="folder with MNIST/raw, FashionMNIST/raw")
    p.add_argument("--weights", required=True, help="pytorch-fid's Inception weights")
    p.add_argument("--import-root", type=Path, help="folder holding the import: sources")
    p.add_argument("--wheels", type=Path, help="wheels folder (fetch_wheels.sh)")
    p.add_argument("--limit-mib", type=float, default=64, help="one call's transfer limit")
    p.add_argument("--tree-bytes", type=int, default=0, help="the tree that travels anyway")
    p.add_argument(
        "--archive-mib",
        type=float,
        default=ARCHIVE_CAP_MIB,
        help="room kept in every call after the first for the last call's archive (the cap "
        "gpu-window --archive-cap-mib packs within)",
    )
    p.add_argument(
        "--archive-in",
        type=Path,
        help="the archive call 1 carries (e.g. the last allocation's state.tgz): its bytes "
        "are kept free in call 1",
    )
    p.set_defaults(handler=_cmd_carry)


def _cmd_carry(args) -> int:
    plan = plan_carry(
        load_window(args.config),
        Path(args.out),
        mirror=Path(args.mirror),
        weights=Path(args.weights),
        import_root=args.import_root,
        wheels=args.wheels,
        limit_mib=args.limit_mib,
        tree_bytes=args.tree_bytes,
        archive_mib=args.archive_mib,
        archive_in=args.archive_in,
    )
    print(describe(plan))
    return 0
