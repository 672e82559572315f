"""A short GPU window filled in one go: ``dpsinkhorn gpu-window``.

Many users get a GPU only briefly, in separate commands of a few minutes, each starting from
a fresh checkout. Each call of this command:

1. unpacks ``--archive-in`` (what the last call left: the workflow's ``results/`` with
   training checkpoints, Snakemake's metadata and this window's own log) into a working
   folder, or starts empty;
2. works through the window file's ``work`` list in order, each item one Snakemake call
   for the trainings, then one for the evaluations, of its experiments whose files do not
   exist yet, until ``--budget-s`` less ``--reserve-s`` has passed; then the Snakemake
   process group gets SIGTERM (training checkpoints and exits 75, Snakemake removes
   incomplete outputs) and, after ``signal_grace_s``, SIGKILL. Only work that can finish
   starts: a training only when it fits what is left of the allocation (this call and
   ``--later-s``) at the measured rate of its step's shape (longer ones, and ones without a
   rate, need a cluster or ``long: true``); an evaluation only when this call can reach its
   next saved phase, from the phase seconds earlier calls measured. While the FID weights
   are still travelling (call 1) the trainings of every item run, most cells per minute
   first;
3. packs the working folder into ``--archive-out`` (atomically; split into parts of at most
   ``--part-mib`` MiB; over ``--archive-cap-mib`` the compiled kernels are left out) and
   writes the finished cells as a results set (``<results-set root>/<device>-<commit>/``,
   :mod:`dpsinkhorn.report.windowset`) with provenance: device, commit, config, the
   command, each call's start and end, and the call that finished each experiment.

The archive holds private workspaces (checkpoints) and the training record: it stays with
the user, never publish it. Left out of it, because every call can rebuild them: ``data/``
(from the mirror), synthetic samples and FID reference statistics (``archive_exclude``).
The training record (``<data_dir>/trainings/``, ``privacy.trainings``) is never left out,
whatever ``archive_exclude`` says (:func:`pack_workdir`): a record whose data folder lies
outside the working folder travels as a copy (:data:`RECORD_COPY`) and is merged back into
it by the next call (:func:`restore_record`). Snakemake runs with ``--rerun-triggers``
without ``mtime``, so freshly prepared data never retrains a finished generator.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config.experiments import (
    dataset_of,
    experiment_dir,
    needs_training,
    prepared_folder_of,
)
from dpsinkhorn.config.targets import TRAINING_FILES, evaluation_files, results_dir
from dpsinkhorn.config.validate import load_config
from dpsinkhorn.fileio import relative_inside, unpack
from dpsinkhorn.privacy.trainings import RECORD_DIR, merge_copy
from dpsinkhorn.window_imports import ImportRefused, import_generators
from dpsinkhorn.window_plan import (
    commit_of,
    device_name,
    device_slug,
    done_training,
    evaluation_refusal,
    measure_phases,
    step_rates,
    training_refusal,
)
from dpsinkhorn.window_setup import (
    ARCHIVE_CAP_MIB,
    load_window,
    pack_within,
    run_until,
)

REPO = Path(__file__).resolve().parents[2]
STATE = "window_state.json"
#: The workflow config's copy in the working folder (a path equal in every call).
CONFIG_COPY = "window/config.yaml"
#: The training record's copy in the archive, when the data folder is outside the working one.
RECORD_COPY = "window/trainings"


def item_targets(config: Mapping, item: Mapping, exps: Sequence[str] | None = None) -> list[str]:
    """The evaluation files (FID and every classifier, every seed: what one evaluation job
    writes) of an item's experiments, or of ``exps`` (relative to the working folder):
    ``config.targets.evaluation_files``, the one place their names are made."""
    chosen = item["experiments"] if exps is None else exps
    return [Path(p).as_posix() for p in evaluation_files(config, results_dir(config), chosen)]


def training_targets(config: Mapping, item: Mapping) -> list[str]:
    """The ledgers (privacy.json) of an item's experiments that train here (not imported)."""
    root = results_dir(config)
    return [
        (experiment_dir(config, root, exp) / "privacy.json").as_posix()
        for exp in item["experiments"]
        if needs_training(config, exp) and exp not in item["import"]
    ]


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# -------------------------------------------------------------------------- the work


def snakemake_command(
    window: Mapping, workdir: Path, targets: Sequence[str], extra_config: Sequence[str], cores: str
) -> list[str]:
    """The Snakemake call for ``targets``, run with ``workdir`` as its current folder. The
    config is read from its copy ``workdir/CONFIG_COPY`` by that relative path, so the rules'
    params (which name the config file) are equal in every call, wherever the folder lies;
    mtime is no rerun trigger: data rebuilt in a fresh call must not retrain a generator."""
    exe = Path(sys.executable).with_name("snakemake")
    cmd = [
        str(exe) if exe.exists() else "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        CONFIG_COPY,
    ]
    overrides = [*window["overrides"], *extra_config]
    if overrides:
        cmd += ["--config", *overrides]
    cmd += ["--cores", cores, "--rerun-incomplete", "--printshellcmds"]
    if importlib.util.find_spec("pulp") is None:  # the ILP scheduler's solver (16 MB wheel)
        cmd += ["--scheduler", "greedy"]
    cmd += ["--rerun-triggers", "params", "input", "software-env", "code", "--", *targets]
    return cmd


def data_targets(config: Mapping, item: Mapping) -> list[str]:
    """The prepared splits of an item's datasets (relative to the working folder)."""
    return [
        f"{config['data_dir']}/{prepared_folder_of(config, d)}/{split}.npz"
        for d in dict.fromkeys(dataset_of(config, e) for e in item["experiments"])
        for split in ("train", "test")
    ]


def touch_imports(config: Mapping, item: Mapping, workdir: Path) -> None:
    """Make an item's imported training outputs newer than the data prepared for them.

    Snakemake has no record of files it did not make, so it judges them by modification
    time alone: a generator imported before its dataset was prepared (or prepared again, in
    a fresh call) would look outdated and be trained again, a new release of the private
    data. So the data is prepared first and the imports are then touched."""
    for exp in item["import"]:
        folder = experiment_dir(config, workdir / results_dir(config), exp)
        for name in TRAINING_FILES:
            if (folder / name).is_file():
                os.utime(folder / name)


def _override(options: Sequence[str], key: str) -> Path | None:
    """The path of ``key=PATH`` among Snakemake --config options (None when absent)."""
    found = [o.split("=", 1)[1] for o in options if o.startswith(f"{key}=")]
    return Path(found[-1]) if found else None


def work(
    window: Mapping,
    workdir: Path,
    deadline: float,
    extra_config: Sequence[str],
    import_root: Path | None,
    cores: str,
    state: dict,
    log: Path,
    limits: Mapping | None = None,
) -> str:
    """Run the work list until done or the deadline; returns how the call ended: ``done``,
    ``waiting`` (what is left cannot finish in what is left of the allocation, or needs
    what has not arrived: a dataset, an import, the FID weights),
    ``deadline``, or ``failed:<items>`` (the list went on past them). ``limits``: ``rates``
    (measured step rates), ``later_s`` (work seconds of the allocation's later calls),
    ``start_long``.

    Items are independent: one whose datasets or FID weights are not here yet waits (and
    is not run), one that fails is recorded in ``state["items"]`` and the next starts;
    items that failed before come after the others, so one broken item never stalls the
    list. Work that cannot finish is not started (:func:`training_refusal`,
    :func:`evaluation_refusal`); the item's outcome says why. Without the FID weights,
    the trainings of all items run, most Table 1 cells per training minute first. Each
    item's wall seconds and outcome add up in ``state["items"]``."""
    from dpsinkhorn.plan import cells_of, training_minutes
    from dpsinkhorn.window_setup import missing_needs

    limits = {"rates": [], "later_s": 0.0, "start_long": False, **(limits or {})}
    config = load_config([window["config_path"]])
    fileio.write_bytes(workdir / CONFIG_COPY, Path(window["config_path"]).read_bytes())
    options = [*window["overrides"], *extra_config]
    mirror, weights = _override(options, "data_mirror"), _override(options, "fid_weights")
    records = state.setdefault("items", {})
    order = sorted(window["work"], key=lambda i: records.get(i["name"], {}).get("failures", 0) > 0)
    failed, trainings, held, waits = [], [], [], {}

    def run(item: Mapping, record: dict, targets: list[str]) -> str:
        cmd = snakemake_command(window, workdir, targets, extra_config, cores)
        for exp in item["experiments"]:
            state.setdefault("commands", {}).setdefault(
                exp,
                shlex.join(
                    [
                        "snakemake",
                        "--configfile",
                        window["configfile"],
                        *(["--config", *window["overrides"]] if window["overrides"] else []),
                        "--",
                        *[t for t in item_targets(config, item) if f"/{exp}/" in t],
                    ]
                ),
            )
        begin = time.monotonic()
        outcome = "done"
        if item["import"]:  # data first, then the imports made newer than it (see below)
            data = data_targets(config, item)
            data_cmd = snakemake_command(window, workdir, data, extra_config, cores)
            outcome = run_until(data_cmd, deadline, window["signal_grace_s"], log, cwd=workdir)
            touch_imports(config, item, workdir)
        if outcome == "done":
            outcome = run_until(cmd, deadline, window["signal_grace_s"], log, cwd=workdir)
        record["seconds"] += time.monotonic() - begin
        record["outcome"] = outcome
        measure_phases(config, workdir, state)
        if outcome == "failed":
            record["failures"] += 1
            failed.append(item["name"])
        return outcome

    for item in order:
        record = records.setdefault(item["name"], {"seconds": 0.0, "failures": 0})
        missing = missing_needs(config, item, mirror, workdir / config["data_dir"], weights)
        if any(not m.startswith("FID weights") for m in missing):
            record["outcome"] = "waiting: needs " + ", ".join(missing)
            held.append(item["name"])
            continue
        try:
            import_generators(item, config, workdir, import_root, state)
        except ImportRefused as err:  # not what its ledger describes: failed, not waiting
            record["outcome"] = f"failed: {err}"
            record["failures"] += 1
            failed.append(item["name"])
            continue
        except (FileNotFoundError, ValueError) as err:  # its import source is not here yet
            record["outcome"] = f"waiting: {err}"
            held.append(item["name"])
            continue
        if time.monotonic() >= deadline:
            return "deadline"
        left_s = deadline - time.monotonic()
        refused, train = [], []
        for exp in item["experiments"]:
            if exp in item["import"] or done_training(config, workdir, exp):
                continue
            why = training_refusal(config, item, exp, workdir, left_s + limits["later_s"], limits)
            refused += [why] if why else []
            train += [] if why else [exp]
        if missing:  # the FID weights are still travelling: trainings only, after the loop
            minutes = {e: training_minutes(config, limits["rates"], e) for e in train}
            trainings += [(cells_of(config, e) / (minutes[e] or math.inf), item, e) for e in train]
            record["outcome"] = waits[item["name"]] = "waiting: needs " + "; ".join(
                [*missing, *refused]
            )
            held.append(item["name"])
            continue
        if train:
            ledgers = training_targets(config, {**item, "experiments": train})
            if run(item, record, ledgers) == "deadline":
                return "deadline"
        left_s = deadline - time.monotonic()
        evaluate = []
        for exp in item["experiments"]:
            files = item_targets(config, item, [exp])
            if not done_training(config, workdir, exp) or all(
                (workdir / f).is_file() for f in files
            ):
                continue
            why = evaluation_refusal(config, exp, workdir, left_s, state)
            refused += [why] if why else []
            evaluate += [] if why else [exp]
        pending = [t for t in item_targets(config, item, evaluate) if not (workdir / t).is_file()]
        if pending and run(item, record, pending) == "deadline":
            return "deadline"
        if refused:
            record["outcome"] = "not started: " + "; ".join(refused)
            held.append(item["name"])
        elif not pending and not train:
            record["outcome"] = "done"
    for _, item, exp in sorted(trainings, key=lambda t: -t[0]):  # most cells per minute first
        if time.monotonic() >= deadline:
            return "deadline"
        record = records[item["name"]]
        left_s = deadline - time.monotonic() + limits["later_s"]  # what the ones before left
        why = training_refusal(config, item, exp, workdir, left_s, limits)
        if why:
            record["outcome"] = waits[item["name"]] = f"{waits[item['name']]}; {why}"
            held.append(item["name"])
            continue
        ledger = training_targets(config, {**item, "experiments": [exp]})
        if run(item, record, ledger) == "deadline":
            return "deadline"
        if record["outcome"] == "done":
            record["outcome"] = f"trained {exp}; {waits[item['name']]}"
    return f"failed:{','.join(failed)}" if failed else "waiting" if held else "done"


# ----------------------------------------------------------------------- the archive


def record_folder(config: Mapping, workdir: Path) -> Path:
    """The training record's folder of the workflow run in ``workdir``."""
    return workdir / config["data_dir"] / RECORD_DIR


def pack_workdir(
    window: Mapping,
    workdir: Path,
    archive: str | Path,
    part_mib: float,
    state: Mapping,
    cap_mib: float | None = None,
) -> tuple[list[Path], list[str], int]:
    """Pack the working folder into ``archive`` within ``cap_mib`` (``window_setup.pack_within``:
    files, what was dropped, bytes): less the window's ``archive_exclude`` and the imported
    generators (copied again from ``--import-root`` when missing), but never the training
    record, whatever the patterns say. A record outside the working folder (an absolute
    ``data_dir``) is copied into :data:`RECORD_COPY` first, and packed from there."""
    config = load_config([window["config_path"]])
    imported = [
        (experiment_dir(config, results_dir(config), e) / "generator.pt").as_posix()
        for e in state.get("imports", {})
    ]
    records = record_folder(config, workdir)
    keep = [f"{RECORD_COPY}/*"]
    inside = relative_inside(records, workdir)
    if inside is not None:
        keep.append(f"{inside}/*")
    elif records.is_dir():
        for path in sorted(records.glob("*.jsonl")):
            fileio.write_bytes(workdir / RECORD_COPY / path.name, path.read_bytes())
    exclude = [*window["archive_exclude"], *imported]
    return pack_within(workdir, Path(archive), exclude, part_mib, cap_mib, keep=keep)


def restore_record(config: Mapping, workdir: Path) -> list[Path]:
    """Merge the record's copy an archive brought (:data:`RECORD_COPY`) into the record
    folder (events it lacks appended, ``privacy.trainings.merge_copy``); returns the
    record files merged into."""
    copies = sorted((workdir / RECORD_COPY).glob("*.jsonl"))
    return [merge_copy(record_folder(config, workdir), copy) for copy in copies]


# ------------------------------------------------------------------------------- CLI


def check_numbers(args: argparse.Namespace) -> None:
    """One-line errors for a budget, reserve, later time, part size or cap that no call can
    work with: found before any work, not when packing (its work lost, or no archive)."""
    if not (0 < args.budget_s < math.inf and 0 <= args.reserve_s < math.inf):
        raise ValueError(
            f"--budget-s {args.budget_s} --reserve-s {args.reserve_s}: give a budget larger "
            "than 0 and a reserve of at least 0 (a budget within the reserve only packs)"
        )
    if not (math.isfinite(args.later_s) and args.later_s >= 0):
        raise ValueError(f"--later-s {args.later_s}: give seconds of at least 0")
    for flag, value in (("--part-mib", args.part_mib), ("--archive-cap-mib", args.archive_cap_mib)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} {value}: give a number of MiB larger than 0")


def gpu_window(args: argparse.Namespace) -> int:
    """One call: unpack, work until the deadline, pack, write the results set."""
    start = time.monotonic()
    started = _now()
    from dpsinkhorn.report.windowset import write_set

    if args.archive_in is None and args.export_set:
        raise ValueError("--export-set needs --archive-in")
    check_numbers(args)
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dpsinkhorn-window-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        window = load_window(args.config)
        if args.archive_in:
            unpack(args.archive_in, workdir)
            restore_record(load_config([window["config_path"]]), workdir)
        state_path = workdir / STATE
        state = fileio.read_json(state_path) if state_path.is_file() else {"calls": []}
        if args.export_set:
            calls = state["calls"]
            name = args.set_name or (
                f"{device_slug(calls[-1]['device'])}-{calls[-1]['commit']}" if calls else "unknown"
            )
            for path in write_set(window, workdir, Path(args.export_set) / name, state):
                print(path)
            return 0
        if args.archive_out is None:
            raise ValueError("--archive-out is required (where the next call resumes from)")
        for folder in args.setup:  # what this call carried: into the machine's cache
            from dpsinkhorn.window_setup import take_setup

            print(f"setup {folder}: " + ", ".join(take_setup(Path(folder), Path(args.cache))))
        # compiled kernels (compile_solver) travel in the archive: no recompiling per call
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor-cache"))
        device, commit = args.device_name or device_name(), args.commit or commit_of(REPO)
        os.environ["DPSINKHORN_COMMIT"] = commit  # evaluate_phases.json: who computed what
        deadline = start + args.budget_s - args.reserve_s
        log = Path(args.log) if args.log else workdir / "window.log"
        outcome = work(
            window,
            workdir,
            deadline,
            args.snakemake_config,
            args.import_root,
            args.cores,
            state,
            log,
            {
                "rates": step_rates(args.rates, window["config_path"], REPO),
                "later_s": args.later_s,
                "start_long": args.start_long,
            },
        )
        state["calls"].append(
            {
                "call": len(state["calls"]) + 1,
                "device": device,
                "commit": commit,
                "started": started,
                "finished": _now(),
                "outcome": outcome,
                "command": shlex.join(["dpsinkhorn", *sys.argv[1:]]),
            }
        )
        fileio.write_json(state_path, state)
        name = args.set_name or f"{device_slug(device)}-{commit}"
        if args.results_set:
            write_set(window, workdir, Path(args.results_set) / name, state)
            fileio.write_json(state_path, state)
        parts, dropped, size = pack_workdir(
            window, workdir, args.archive_out, args.part_mib, state, args.archive_cap_mib
        )
        over = args.archive_cap_mib is not None and size > args.archive_cap_mib * 2**20
        print(
            f"gpu-window call {len(state['calls'])}: {outcome}; archive {size} bytes "
            + (f"(left out: {', '.join(dropped)}) " if dropped else "")
            + (f"(OVER the {args.archive_cap_mib} MiB cap: it may not travel) " if over else "")
            + " ".join(str(p) for p in parts)
        )
        return 0 if outcome in ("done", "deadline", "waiting") else 1
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpu-window",
        help="fill a short GPU allocation: resume from an archive, run the work list in order "
        "until a deadline, pack the archive, write the finished cells as a results set",
    )
    p.add_argument("--config", default="benchmarks/gpu/window.yaml", help="the window file")
    p.add_argument("--archive-in", help="what the last call left (absent: start empty)")
    p.add_argument("--archive-out", help="where this call leaves its state (tar.gz, parts)")
    p.add_argument("--budget-s", type=float, default=540, help="seconds this call may take")
    p.add_argument(
        "--reserve-s", type=float, default=45, help="seconds kept for stopping and packing"
    )
    p.add_argument("--part-mib", type=float, default=15, help="largest archive file (MiB)")
    p.add_argument(
        "--archive-cap-mib",
        type=float,
        default=ARCHIVE_CAP_MIB,
        help="pack the archive within this (gpu-window-carry --archive-mib keeps the room): "
        "over it, compiled kernels are left out; never a result",
    )
    p.add_argument(
        "--later-s",
        type=float,
        default=0,
        help="work seconds of this allocation's calls after this one: a training starts "
        "only when it fits this call's time and these",
    )
    p.add_argument(
        "--rates",
        help="measured step rates (JSON; default the config's cluster.step_rates): how long "
        "each training takes",
    )
    p.add_argument(
        "--start-long",
        action="store_true",
        help="also start trainings that cannot finish in the allocation (or have no rate)",
    )
    p.add_argument("--results-set", help="root of results sets (e.g. results-paper-scale)")
    p.add_argument("--export-set", help="with --archive-in and no work: write the set here")
    p.add_argument("--set-name", help="results set name (default <device>-<commit>)")
    p.add_argument("--commit", help="the checkout's commit (default git rev-parse)")
    p.add_argument("--device-name", help="the device, in words (default: torch's name)")
    p.add_argument("--import-root", type=Path, help="folder holding the import: sources")
    p.add_argument("--workdir", help="keep the working folder here (default: a temp folder)")
    p.add_argument("--log", help="Snakemake's output (default <workdir>/window.log)")
    p.add_argument("--cores", default="all", help="Snakemake --cores")
    p.add_argument(
        "--setup", nargs="*", default=[], help="carried setup folders (gpu-window-carry)"
    )
    p.add_argument("--cache", default="/tmp/window", help="where setup folders are taken")
    p.add_argument(
        "--snakemake-config",
        nargs="*",
        default=[],
        help="extra KEY=VALUE for snakemake --config (data_mirror, fid_weights, device)",
    )
    p.set_defaults(handler=gpu_window)
