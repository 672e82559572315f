"""Fill short GPU allocations with the workflow's work, one call after another.

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl  # fetch_wheels.sh's
    PYTHONPATH=/tmp/site:src PATH=/tmp/site/bin:$PATH python benchmarks/gpu/window.py \\
        --minutes 9 --archive-in .window/state.tgz --archive-out $OUT/state.tgz \\
        --results-set /tmp/sets/mnist-rows-h200 --config data_mirror=... fid_weights=...
    tar czf $OUT/set.tgz -C /tmp/sets mnist-rows-h200  # a device returns few files

Each call unpacks what the last call left (``results/``, Snakemake's metadata, the privacy
training record, this tool's state), copies the window file's ``imports`` (a committed run
folder's generator, ledger and log, checked against the ledger's hashes) and runs the
ordinary workflow (the repository's Snakefile and default profile) on the window file's
ordered experiments: each one's training, then its evaluation. Only work that fits the time
left starts: a training at the measured steps/s of its step shape (the config's
``cluster.step_rates`` or ``--rates``; one with no measured rate only when the window file's
``start_unmeasured`` names it), an evaluation when sampling and its next unsaved phase fit
at the seconds earlier calls logged.
At the deadline Snakemake gets SIGTERM (a training checkpoints), then SIGKILL. Then the
working folder is packed into ``--archive-out`` (within ``--archive-cap-mib``, in files of
at most ``--part-mib``) and the finished experiments are written as a results set, each DP
experiment trained here with its release (``publish.decision.release``: the proven
generator, ledger, log, scores and manifest; the samples, which the manifest names by hash,
stay behind).

The archive holds private checkpoints, the training record (under the config's
``data_dir``, which must lie in the working folder) and, unless ``DPSINKHORN_RECORD_STORE``
names another, the record store of the window's trainings (``record-store/``; merge it
into yours with ``dpsinkhorn records export --store`` and ``records merge``): keep it,
never publish it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from dpsinkhorn import config as cfg
from dpsinkhorn import fileio
from dpsinkhorn.config.cluster import load_rates, rates_file
from dpsinkhorn.config.targets import evaluation_files, results_dir
from dpsinkhorn.plan import plan_from_rates
from dpsinkhorn.privacy.record_store import STORE_ENV
from dpsinkhorn.privacy.trainings import RECORD_DIR
from dpsinkhorn.publish import decision
from dpsinkhorn.report.resultset import render

REPO = Path(__file__).resolve().parents[2]
STATE = "window_state.json"
CONFIG_COPY = "window/config.yaml"  # the config, by a path equal in every call
#: The record store's folder in the working folder when the environment names none.
STORE_FOLDER = "record-store"
#: What every call rebuilds, so the archive leaves it out (the training record never).
EXCLUDE = ["data/*", "*/samples_seed*.npz", "*/fid_ref_*.npz", "bin/*"]
EXCLUDE += [".snakemake/locks/*", ".snakemake/log/*", ".snakemake/auxiliary/*"]
REBUILDABLE = ["inductor-cache/*"]  # left out over the cap: compiled kernels, never a result
WINDOW_KEYS = {"configfile", "overrides", "experiments", "exclude", "signal_grace_s"}
WINDOW_KEYS |= {"imports", "start_unmeasured"}
IMPORTED = {"generator.pt": "content_sha256", "train_log.csv": "train_log_sha256"}
SET_FILES = ("privacy.json", "train_log.csv", "fid_seed*.json", "acc_*_seed*.json")
#: A phase's wall seconds as the evaluation job logs it (``[12:00:00] fid: 135.6 s``).
PHASE_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (sample|fid|classify_\w+): ([\d.]+) s$", re.M)


def load_window(path: Path) -> dict:
    """The window file, checked; a bad key or experiment is a one-line error naming it."""
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, dict) or not data.get("configfile") or not data.get("experiments"):
        raise ValueError(f"{path}: not a window file (a mapping with configfile, experiments)")
    if set(data) - WINDOW_KEYS:
        unknown = sorted(set(data) - WINDOW_KEYS)[0]
        raise ValueError(f"{path}: unknown key {unknown!r} (known: {sorted(WINDOW_KEYS)})")
    config_path = Path(data["configfile"])
    if not config_path.is_absolute():
        near = path.parent / config_path
        config_path = near if near.is_file() else REPO / config_path
    window = {
        "configfile": str(data["configfile"]),
        "config_path": config_path.resolve(),
        "overrides": [str(o) for o in data.get("overrides") or []],
        "experiments": [str(e) for e in data["experiments"]],
        "exclude": list(data.get("exclude") or EXCLUDE),
        "signal_grace_s": float(data.get("signal_grace_s", 60)),
        "imports": {str(e): REPO / str(f) for e, f in (data.get("imports") or {}).items()},
        "start_unmeasured": [str(e) for e in data.get("start_unmeasured") or []],
    }
    for option in window["overrides"]:
        if option.split("=")[0] not in cfg.OVERRIDABLE or "=" not in option:
            raise ValueError(f"{path}: overrides: {option!r} is not KEY=VALUE of OVERRIDABLE")
    config = cfg.load_config([window["config_path"]])
    data_dir = Path(config["data_dir"])
    if data_dir.is_absolute() or ".." in data_dir.parts:  # the record must travel in the archive
        raise ValueError(
            f"{path}: {window['configfile']}: data_dir {data_dir} is not inside the "
            "working folder, so its training record would not travel"
        )
    window["keep"] = [f"{data_dir.as_posix()}/{RECORD_DIR}/*"]  # packed whatever is excluded
    known = cfg.experiment_names(config)
    for key in ("experiments", "imports", "start_unmeasured"):
        for exp in window[key]:
            if exp not in known:
                raise ValueError(f"{path}: {key}: {exp!r} is not in {window['configfile']}")
    for exp, folder in window["imports"].items():
        if not (folder / "privacy.json").is_file():
            raise ValueError(f"{path}: imports: {exp}: {folder} holds no privacy.json")
    return window


def import_runs(window: dict, config, workdir: Path) -> None:
    """Copy each import's generator.pt, train_log.csv and privacy.json into its experiment
    folder (the ledger last), once; a file whose sha256 is not its ledger's is refused."""
    for exp, source in window["imports"].items():
        dest = cfg.experiment_dir(config, workdir / results_dir(config), exp)
        if (dest / "privacy.json").is_file():
            continue
        files = {name: (source / name).read_bytes() for name in [*IMPORTED, "privacy.json"]}
        for name, key in IMPORTED.items():
            if fileio.sha256_of_bytes(files[name]) != json.loads(files["privacy.json"]).get(key):
                raise ValueError(f"{source / name}: sha256 is not its ledger's {key}; not imported")
        fileio.write_all([(dest / name, data) for name, data in files.items()])


def training_refusal(
    config, rates, workdir: Path, exp: str, left_s: float, start_long: bool, unmeasured=False
):
    """Why ``exp``'s training does not start now (None: start it). It starts when its steps
    at the measured rate of its step shape fit ``left_s``, or it resumes (its private
    workspace is here), or ``start_long``; with no measured rate only when ``unmeasured``."""
    folder = cfg.experiment_dir(config, workdir / results_dir(config), exp)
    if start_long or (folder / "private_workspace").is_dir():
        return None
    (job,) = plan_from_rates(config, rates, [exp])["jobs"]
    if job["hours"] is None and not unmeasured:
        return f"{exp}: no measured step rate for its step shape (--start-long starts it)"
    if job["hours"] is not None and job["hours"] * 3600 > left_s:
        return f"{exp}: {job['hours'] * 60:.1f} min of training, {left_s / 60:.1f} min left"
    return None


def evaluation_refusal(config, workdir: Path, exp: str, left_s: float, measured: dict):
    """Why ``exp``'s evaluation does not start now (None: start it): sampling and its next
    unsaved phase take longer than ``left_s`` at the seconds earlier calls measured. A phase
    never measured starts (it cannot be known not to fit)."""
    scores = cfg.evaluation_dir(config, workdir / results_dir(config), exp)
    progress = scores / "evaluate_progress.json"
    done = fileio.read_json(progress).get("done", {}) if progress.is_file() else {}
    phases = ["fid", *(f"classify_{m}" for m in cfg.experiment_classifiers(config, exp))]
    left = [p for p in phases if p.removeprefix("classify_") not in done]
    if not left or left[0] not in measured or "sample" not in measured:
        return None
    need = measured["sample"] + measured[left[0]]
    return None if need <= left_s else f"{exp}: {left[0]} takes {need:.0f} s, {left_s:.0f} s left"


def measure_phases(config, workdir: Path, measured: dict) -> dict:
    """The longest seconds of each evaluation phase the jobs' logs show (into ``measured``)."""
    for log in (workdir / results_dir(config) / cfg.LOGS_DIR).rglob("evaluate_*.log"):
        for phase, seconds in PHASE_LINE.findall(log.read_text(errors="replace")):
            measured[phase] = max(measured.get(phase, 0.0), float(seconds))
    return measured


def trained(config, workdir: Path, exp: str) -> bool:
    folder = cfg.experiment_dir(config, workdir / results_dir(config), exp)
    names = ("privacy.json", "generator.pt")
    return not cfg.needs_training(config, exp) or all((folder / n).is_file() for n in names)


def finished(config, workdir: Path, exp: str) -> bool:
    """Every evaluation file (FID, each classifier, every seed) of ``exp`` exists."""
    files = evaluation_files(config, workdir / results_dir(config), [exp])
    return all(Path(f).is_file() for f in files)


def run_until(cmd: list[str], deadline: float, grace_s: float, log: Path, cwd: Path) -> str:
    """Run ``cmd`` in its own process group until it ends or ``deadline`` (monotonic); then
    SIGTERM the group and, ``grace_s`` later, SIGKILL it. Returns done, failed or deadline."""
    with open(log, "a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        options = {"stdin": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
        proc = subprocess.Popen(cmd, stdout=out, cwd=cwd, start_new_session=True, **options)
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is not None:
        return "done" if proc.returncode == 0 else "failed"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    try:  # children of the group that outlived Snakemake
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return "deadline"


def snakemake(window: dict, workdir: Path, targets: list[str], args) -> list[str]:
    """The Snakemake call for ``targets`` in ``workdir``: the repository's Snakefile and
    default profile; mtime is no rerun trigger (data rebuilt in a fresh call must not
    retrain a generator)."""
    exe = Path(sys.executable).with_name("snakemake")
    cmd = [str(exe) if exe.exists() else "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["-d", str(workdir), "--configfile", CONFIG_COPY]
    options = [*window["overrides"], *args.config]
    cmd += ["--config", *options] if options else []
    cmd += ["--scheduler", "greedy"] if importlib.util.find_spec("pulp") is None else []
    cmd += ["-n"] if args.dry_run else []
    return [*cmd, "--rerun-triggers", "params", "input", "software-env", "code", "--", *targets]


def work(window: dict, workdir: Path, deadline: float, args, state: dict) -> str:
    """Train and evaluate the experiments in order until done or the deadline; returns
    ``done``, ``waiting`` (work left that did not fit), ``deadline`` or ``failed:<names>``.
    Experiments that failed in an earlier call come after the others."""
    config = cfg.load_config([window["config_path"]])
    path = Path(args.rates or rates_file(config, [REPO]))
    rates = load_rates(path) if args.rates or path.is_file() else []
    records = state.setdefault("experiments", {})
    order = sorted(window["experiments"], key=lambda e: records.get(e, {}).get("failures", 0) > 0)
    failed, held, root = [], [], results_dir(config)
    for exp in order:
        record = records.setdefault(exp, {"failures": 0, "seconds": 0.0})
        measured = measure_phases(config, workdir, state.setdefault("phase_seconds", {}))
        if finished(config, workdir, exp):
            record["outcome"] = "done"
            continue
        if time.monotonic() >= deadline:
            return "deadline"
        training = not trained(config, workdir, exp)
        if training:
            left_s = deadline - time.monotonic() + args.later_minutes * 60
            unmeasured = exp in window["start_unmeasured"]
            why = training_refusal(config, rates, workdir, exp, left_s, args.start_long, unmeasured)
            targets = [f"{cfg.experiment_dir(config, root, exp)}/privacy.json"]
        else:
            left_s = deadline - time.monotonic()
            why = evaluation_refusal(config, workdir, exp, left_s, measured)
            why = why or (args.train_only and f"{exp}: evaluation (--train-only)")
            targets = evaluation_files(config, root, [exp])
        if why:
            record["outcome"] = f"not started: {why}"
            held.append(exp)
            continue
        begin, log = time.monotonic(), args.archive_out.parent / "window.log"  # beside it
        folder = cfg.prepared_folder_of(config, cfg.dataset_of(config, exp))
        data = [f"{config['data_dir']}/{folder}/{split}.npz" for split in ("train", "test")]
        calls = [targets]  # the data alone first: rebuilt in one call, it reruns a training
        calls[:0] = [] if args.dry_run or all((workdir / f).is_file() for f in data) else [data]
        for files in calls:
            if files is targets and exp in window["imports"]:  # no Snakemake metadata: by
                home = cfg.experiment_dir(config, workdir / root, exp)  # mtime newer than data
                for name in (*IMPORTED, "privacy.json"):
                    os.utime(home / name)
            cmd = snakemake(window, workdir, files, args)
            outcome = run_until(cmd, deadline, window["signal_grace_s"], log, workdir)
            if outcome != "done":
                break
        record["seconds"] += time.monotonic() - begin
        record["outcome"] = outcome
        if outcome == "deadline":
            return "deadline"
        if outcome == "failed":
            record["failures"] += 1
            failed.append(exp)
        elif args.dry_run:
            record["outcome"] = "would start"
            held.append(exp)
        elif training:
            order.append(exp)  # trained now: its evaluation next, if it fits
    return f"failed:{','.join(failed)}" if failed else "waiting" if held else "done"


def pack(workdir: Path, archive: Path, exclude, keep, part_mib: float, cap_mib: float):
    """Tar and gzip ``workdir`` less ``exclude`` (never what ``keep`` matches) into
    ``archive``; over ``cap_mib`` pack again without :data:`REBUILDABLE`. Atomic; split into
    ``archive.partNNN`` of at most ``part_mib`` MiB when larger. Returns the files, whether
    the rebuildable files were left out, and the bytes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    for dropped in (False, True):
        patterns = exclude + REBUILDABLE * dropped
        tmp = Path(tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.")[1])
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(p for p in workdir.rglob("*") if p.is_file() and not p.is_symlink()):
                rel = path.relative_to(workdir).as_posix()
                if not any(fnmatch.fnmatch(rel, p) for p in patterns) or any(
                    fnmatch.fnmatch(rel, k) for k in keep
                ):
                    tar.add(path, arcname=rel, recursive=False)
        size = tmp.stat().st_size
        if size <= cap_mib * 2**20 or dropped:
            break
        tmp.unlink()
    old = sorted(archive.parent.glob(f"{archive.name}.part[0-9][0-9][0-9]"))
    limit, parts = max(1, int(part_mib * 2**20)), [archive]
    if size > limit:  # every part written before an old file goes
        with open(tmp, "rb") as fh:
            chunks = list(iter(lambda: fh.read(limit), b""))
        parts = [archive.parent / f"{archive.name}.part{k:03d}" for k in range(len(chunks))]
        fileio.write_all(list(zip(parts, chunks, strict=True)))
        tmp.unlink()
    else:
        os.replace(tmp, archive)
    for path in {archive, *old} - set(parts):
        path.unlink(missing_ok=True)
    return parts, dropped, size


def unpack(archive: Path, workdir: Path) -> None:
    """Extract ``archive`` (or its parts, joined) into ``workdir``."""
    parts = sorted(archive.parent.glob(f"{archive.name}.part[0-9][0-9][0-9]"))
    parts = [archive] if archive.is_file() else parts
    if not parts:
        raise FileNotFoundError(f"{archive}: no archive (nor {archive.name}.part000, ...)")
    try:  # the parts joined in memory: an archive is a call's transfer, some MiB
        joined = io.BytesIO(b"".join(part.read_bytes() for part in parts))
        with tarfile.open(fileobj=joined, mode="r:gz") as tar:
            tar.extractall(workdir, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ValueError(f"{archive}: not a readable tar.gz archive ({err})") from None


def export_set(window: dict, workdir: Path, set_dir: Path, state: dict) -> list[Path]:
    """Copy the finished experiments' ledgers, logs and scores (never a generator) into
    ``set_dir`` with ``provenance.json`` (device, commit, date, calls); render its Table 1."""
    config = cfg.load_config([window["config_path"]])
    results, calls = workdir / results_dir(config), state["calls"]
    stamps, experiments = state.setdefault("finished", {}), {}
    for exp in filter(lambda e: finished(config, workdir, e), window["experiments"]):
        stamps.setdefault(exp, {k: calls[-1][k] for k in ("call", "device", "commit")})
        home = cfg.experiment_dir(config, results, exp)
        scores = cfg.evaluation_dir(config, results, exp)
        for path in sorted({p for d in (home, scores) for s in SET_FILES for p in d.glob(s)}):
            fileio.write_bytes(set_dir / exp / path.name, path.read_bytes())
        experiments[exp] = {"evaluated_in": stamps[exp]}
        if (home / "generator.pt").is_file():
            experiments[exp]["generator_sha256"] = fileio.sha256_of(home / "generator.pt")
        if (scores / "evaluate_phases.json").is_file():
            experiments[exp]["phases"] = fileio.read_json(scores / "evaluate_phases.json")
        if cfg.is_private(config, exp) and exp not in window["imports"]:
            experiments[exp]["release"] = publish(config, workdir, exp, set_dir / exp / "release")
    provenance = {
        "name": set_dir.name,
        "what": "outputs of benchmarks/gpu/window.py calls (scores, training ledgers and "
        "logs, no generators); only experiments whose evaluation finished",
        **{key: calls[-1][key] for key in ("device", "commit")},
        "date": calls[-1]["finished"][:10],
        "config": window["configfile"],
        "config_changes": [f"snakemake --config {o}" for o in window["overrides"]],
        "calls": calls,
        "experiments": experiments,
    }
    fileio.write_json(set_dir / "provenance.json", provenance)
    try:
        return [set_dir / "provenance.json", *render(set_dir, [window["config_path"]])]
    except ValueError as err:  # no Table 1 row yet: the set still holds its files
        print(f"results set {set_dir}: not rendered: {err}", file=sys.stderr)
        return [set_dir / "provenance.json"]


def publish(config, workdir: Path, exp: str, out: Path) -> str:
    """Release ``exp`` trained in ``workdir`` (``publish.decision.release`` of its folder,
    samples redrawn on the GPU if there is one) and copy all but the samples to ``out``;
    returns what happened, a refusal in its words (a public-seed ledger is refused)."""
    if (out / decision.MANIFEST).is_file():
        return "released"
    with contextlib.chdir(workdir), tempfile.TemporaryDirectory(dir=workdir) as tmp:
        run = results_dir(config)
        rel = cfg.experiment_dir(config, run, exp).relative_to(run).as_posix()
        folders = [f for f in decision.run_folders(config, run) if f.rel == rel]
        try:
            files = decision.release(run, Path(tmp) / "out", folders, device=device())
        except (ValueError, FileNotFoundError) as err:
            return f"not released: {err}"
        for path in files:
            if not fnmatch.fnmatch(path.name, "samples_seed*.npz"):
                fileio.write_bytes(out / path.relative_to(Path(tmp) / "out"), path.read_bytes())
    return "released"


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_and_commit(args: argparse.Namespace) -> tuple[str, str]:
    """The device in words (torch's name of the GPU) and the checkout's commit (git)."""
    import torch

    cuda, git = torch.cuda, ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
    name = cuda.get_device_name(0) if cuda.is_available() else f"cpu, {os.cpu_count()} cores"
    commit = args.commit or subprocess.run(git, capture_output=True, text=True).stdout.strip()
    return args.device_name or f"{name} (torch {torch.__version__})", commit or "unknown"


#: (flag, argparse keywords): the device call's constraints are these parameters.
OPTIONS = [
    ("--window", {"type": Path, "default": REPO / "benchmarks/gpu/window.yaml"}),
    ("--minutes", {"type": float, "required": True, "help": "this call's minutes in all"}),
    ("--reserve-minutes", {"type": float, "default": 0.75, "help": "for stopping, packing"}),
    ("--later-minutes", {"type": float, "default": 0.0, "help": "later calls' work minutes"}),
    ("--archive-in", {"type": Path, "help": "what the last call left (absent: start empty)"}),
    ("--archive-out", {"type": Path, "required": True, "help": "this call's state, packed"}),
    ("--archive-cap-mib", {"type": float, "default": 16.0, "help": "over it: no kernels"}),
    ("--part-mib", {"type": float, "default": 15.0, "help": "largest file of the archive"}),
    ("--results-set", {"type": Path, "help": "results set folder, named by what it holds"}),
    ("--rates", {"help": "measured step rates (default: the config's cluster.step_rates)"}),
    ("--start-long", {"action": "store_true", "help": "start trainings that do not fit"}),
    ("--workdir", {"type": Path, "help": "working folder (default: a temporary one)"}),
    ("--commit", {"help": "the checkout's commit (default: git rev-parse)"}),
    ("--device-name", {"help": "the device in words (default: torch's)"}),
    ("--train-only", {"action": "store_true", "help": "start no evaluation (no FID weights)"}),
    ("--dry-run", {"action": "store_true", "help": "Snakemake -n: what would start"}),
    ("--config", {"nargs": "*", "default": [], "help": "more snakemake --config KEY=VALUE"}),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, keywords in OPTIONS:
        parser.add_argument(flag, **keywords)
    args = parser.parse_args(argv)
    for name in ("minutes", "archive_cap_mib", "part_mib", "reserve_minutes", "later_minutes"):
        value, least = getattr(args, name), 0 if name.endswith("r_minutes") else 1e-9
        if not least <= value < float("inf"):
            parser.error(f"--{name.replace('_', '-')} {value}: give a number of at least {least}")
    return args


def main(argv: list[str] | None = None) -> int:
    start, started = time.monotonic(), dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpsinkhorn-window-"))
    try:
        window = load_window(args.window)
        for folder in (workdir, args.archive_out.parent):
            folder.mkdir(parents=True, exist_ok=True)
        if args.archive_in:
            unpack(args.archive_in, workdir)
        import_runs(window, cfg.load_config([window["config_path"]]), workdir)
        state = fileio.read_json(workdir / STATE) if (workdir / STATE).is_file() else {"calls": []}
        fileio.write_bytes(workdir / CONFIG_COPY, window["config_path"].read_bytes())
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor-cache"))
        device, commit = device_and_commit(args)
        if shutil.which("dpsinkhorn") is None:  # the rules' command, the package not installed
            script = f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dpsinkhorn "$@"\n'
            fileio.write_text(workdir / "bin/dpsinkhorn", script)
            (workdir / "bin/dpsinkhorn").chmod(0o755)
            os.environ["PATH"] = f"{workdir / 'bin'}{os.pathsep}{os.environ['PATH']}"
        os.environ["DPSINKHORN_COMMIT"] = commit  # evaluate_phases.json: who computed what
        store = Path(os.environ.setdefault(STORE_ENV, str(workdir / STORE_FOLDER))).resolve()
        if store.is_relative_to(workdir.resolve()):  # the store travels with the archive
            window["keep"].append(f"{store.relative_to(workdir.resolve()).as_posix()}/*")
        deadline = start + (args.minutes - args.reserve_minutes) * 60
        outcome = work(window, workdir, deadline, args, state)
        ended = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        command = shlex.join(["window.py", *(argv or sys.argv[1:])])
        call = {"call": len(state["calls"]) + 1, "device": device, "commit": commit}
        call |= {"started": started, "finished": ended, "outcome": outcome, "command": command}
        state["calls"].append(call)
        if args.results_set:
            print("\n".join(map(str, export_set(window, workdir, args.results_set, state))))
        fileio.write_json(workdir / STATE, state)
        keep, caps = window["keep"], (args.part_mib, args.archive_cap_mib)
        parts, dropped, size = pack(workdir, args.archive_out, window["exclude"], keep, *caps)
    except (ValueError, FileNotFoundError) as err:
        print(f"window: error: {err}", file=sys.stderr)
        return 2
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    over = " OVER THE CAP" if size > args.archive_cap_mib * 2**20 else ""
    kernels = " (compiled kernels left out)" if dropped else ""
    print(f"call {len(state['calls'])}: {outcome}; archive {size} bytes{over}{kernels}")
    for exp, record in state["experiments"].items():
        print(f"  {exp}: {record.get('outcome', 'not reached')}")
    print("\n".join(map(str, parts)))
    return 1 if outcome.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
