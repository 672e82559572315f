"""Fill short GPU allocations with the workflow's work, one call after another.

Each call unpacks the last call's archive, runs the workflow on the window file's ordered
experiments (training, then evaluation) until a deadline, starting only what fits the time
left at measured rates, packs the working folder for the next call and exports the finished
experiments as a results set (benchmarks/README.md, "A short GPU allocation"). The archive
holds private checkpoints, the training record and the record store: never publish it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
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

REPO = Path(__file__).resolve().parents[2]
STATE = "window_state.json"
CONFIG_COPY = "window/config.yaml"  # the config, by a path equal in every call
STORE_FOLDER = "record-store"  # the record store when the environment names none
COMMIT_ENV = "DPSINKHORN_COMMIT"  # the checkout's commit (else git's); evaluate_phases.json
GRACE_S = 20  # SIGTERM -> SIGKILL: a training checkpoints within it (tests/killing.py's)
RESERVE_S = GRACE_S + 25  # of a call's time: stopping Snakemake, then export and packing
#: What every call rebuilds, so the archive leaves it out (never what ``keep`` matches).
EXCLUDE = ["data/*", "*/samples_seed*.npz", "*/fid_ref_*.npz", "bin/*", ".snakemake/locks/*"]
EXCLUDE += [".snakemake/log/*", ".snakemake/auxiliary/*"]
#: The window file's keys and their types (configfile and experiments required).
KEYS = {"configfile": str, "experiments": list, "overrides": list, "start_unmeasured": list}
KEYS["imports"] = dict
IMPORTED = {"generator.pt": "content_sha256", "train_log.csv": "train_log_sha256"}
SET_FILES = ("privacy.json", "train_log.csv", "fid_seed*.json", "acc_*_seed*.json")
#: A phase's wall seconds as the evaluation job logs it (``[12:00:00] fid: 135.6 s``).
PHASE_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (sample|fid|classify_\w+): ([\d.]+) s$", re.M)


def load_window(path: Path) -> dict:
    """The window file, checked (one-line errors naming the key), with its ``config`` and
    what the archive ``keep``s whatever it excludes (the training record)."""
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, dict) or not data.get("configfile") or not data.get("experiments"):
        raise ValueError(f"{path}: not a window file (a mapping with configfile, experiments)")
    for key, value in data.items():
        if key not in KEYS:
            raise ValueError(f"{path}: unknown key {key!r} (known: {sorted(KEYS)})")
        if not isinstance(value, KEYS[key]):
            raise ValueError(f"{path}: {key}: {value!r} is not a {KEYS[key].__name__}")
    config_path = Path(data["configfile"])
    if not config_path.is_absolute():
        near = path.parent / config_path
        config_path = (near if near.is_file() else REPO / config_path).resolve()
    config = cfg.load_config([config_path])
    window = {"configfile": data["configfile"], "config_path": config_path, "config": config}
    window |= {key: [str(v) for v in data.get(key, [])] for key in KEYS if KEYS[key] is list}
    window["imports"] = {str(e): REPO / str(f) for e, f in data.get("imports", {}).items()}
    for option in window["overrides"]:
        if option.split("=")[0] not in cfg.OVERRIDABLE or "=" not in option:
            raise ValueError(f"{path}: overrides: {option!r} is not KEY=VALUE of OVERRIDABLE")
    for key in ("experiments", "imports", "start_unmeasured"):
        for exp in window[key]:
            if exp not in cfg.experiment_names(config):
                raise ValueError(f"{path}: {key}: {exp!r} is not in {data['configfile']}")
    for exp, folder in window["imports"].items():
        if not (folder / "privacy.json").is_file():
            raise ValueError(f"{path}: imports: {exp}: {folder} holds no privacy.json")
    data_dir = Path(config["data_dir"])
    if data_dir.is_absolute() or ".." in data_dir.parts:  # the record must travel in the archive
        raise ValueError(
            f"{path}: {data['configfile']}: data_dir {data_dir} is not inside the "
            "working folder, so its training record would not travel"
        )
    return window | {"keep": [f"{data_dir.as_posix()}/{RECORD_DIR}/*"]}


def import_runs(window: dict, workdir: Path) -> None:
    """Copy each import's generator, log and ledger (last) into its experiment folder once,
    refusing a file whose sha256 is not its ledger's; touch them (no Snakemake metadata)."""
    names = [*IMPORTED, "privacy.json"]
    for exp, source in window["imports"].items():
        dest = home(window["config"], workdir, exp)
        if not (dest / "privacy.json").is_file():
            files = {name: (source / name).read_bytes() for name in names}
            ledger = json.loads(files["privacy.json"])
            for name, key in IMPORTED.items():
                if fileio.sha256_of_bytes(files[name]) != ledger.get(key):
                    raise ValueError(
                        f"{source / name}: sha256 is not its ledger's {key}; not imported"
                    )
            fileio.write_all([(dest / name, data) for name, data in files.items()])
        for name in names:
            os.utime(dest / name)


def home(config, workdir: Path, exp: str) -> Path:
    return cfg.experiment_dir(config, workdir / results_dir(config), exp)


def trained(config, workdir: Path, exp: str) -> bool:
    names = ("privacy.json", "generator.pt")
    folder = home(config, workdir, exp)
    return not cfg.needs_training(config, exp) or all((folder / n).is_file() for n in names)


def finished(config, workdir: Path, exp: str) -> bool:
    """Every evaluation file (FID, each classifier, every seed) of ``exp`` exists."""
    files = evaluation_files(config, workdir / results_dir(config), [exp])
    return all(Path(f).is_file() for f in files)


def training_refusal(config, rates, workdir: Path, exp: str, left_s: float, unmeasured=False):
    """Why ``exp``'s training does not start now (None: start it): its steps at the measured
    rate of its step shape exceed ``left_s``, or no rate is measured and not ``unmeasured``.
    A training whose private workspace is here resumes."""
    if (home(config, workdir, exp) / "private_workspace").is_dir():
        return None
    (job,) = plan_from_rates(config, rates, [exp])["jobs"]
    if job["hours"] is None:
        return None if unmeasured else f"{exp}: no measured step rate for its step shape"
    if job["hours"] * 3600 > left_s:
        return f"{exp}: {job['hours'] * 60:.1f} min of training, {left_s / 60:.1f} min left"
    return None


def evaluation_refusal(config, workdir: Path, exp: str, left_s: float, measured: dict):
    """Why ``exp``'s evaluation does not start now (None: start it): sampling and its next
    unsaved phase take longer than ``left_s`` at the ``measured`` seconds (updated with the
    longest the jobs' logs show); an unmeasured phase starts."""
    for log in (workdir / results_dir(config) / cfg.LOGS_DIR).rglob("evaluate_*.log"):
        for phase, seconds in PHASE_LINE.findall(log.read_text(errors="replace")):
            measured[phase] = max(measured.get(phase, 0.0), float(seconds))
    progress = cfg.evaluation_dir(config, workdir / results_dir(config), exp)
    progress /= "evaluate_progress.json"
    done = fileio.read_json(progress).get("done", {}) if progress.is_file() else {}
    phases = ["fid", *(f"classify_{m}" for m in cfg.experiment_classifiers(config, exp))]
    left = [p for p in phases if p.removeprefix("classify_") not in done]
    if not left or left[0] not in measured or "sample" not in measured:
        return None
    need = measured["sample"] + measured[left[0]]
    return None if need <= left_s else f"{exp}: {left[0]} takes {need:.0f} s, {left_s:.0f} s left"


def run_until(cmd: list[str], deadline: float, grace_s: float, log: Path, cwd: Path) -> str:
    """Run ``cmd`` in its own process group until it ends or ``deadline`` (monotonic); then
    SIGTERM the group and, ``grace_s`` later, SIGKILL it. Returns done, failed or deadline."""
    with open(log, "a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        options = {"stdin": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
        proc = subprocess.Popen(cmd, stdout=out, cwd=cwd, start_new_session=True, **options)
    try:
        return "done" if proc.wait(max(0.0, deadline - time.monotonic())) == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):  # the group, and what outlived Snakemake
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return "deadline"


def work(window: dict, workdir: Path, deadline: float, args, state: dict) -> str:
    """Train and evaluate the experiments in order (those that failed in an earlier call
    last) until done or the deadline; returns ``done``, ``waiting`` (work left that did not
    fit), ``deadline`` or ``failed:<names>``."""
    config, root = window["config"], results_dir(window["config"])
    rates = load_rates(args.rates or rates_file(config, [REPO]))
    records = state.setdefault("experiments", {})
    order = sorted(window["experiments"], key=lambda e: records.get(e, {}).get("failures", 0) > 0)
    # Snakemake with the repository's Snakefile, greedy (no ILP solver needed), going on past
    # a failed job; mtime is no rerun trigger (data rebuilt in a fresh call must not retrain)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--keep-going"]
    cmd += ["--scheduler", "greedy", "--configfile", CONFIG_COPY] + ["-n"] * args.dry_run
    cmd += ["--rerun-triggers", "params", "input", "software-env", "code"]
    options = [*window["overrides"], *args.config]
    cmd += ["--config", *options] if options else []

    def run(targets: list[str]) -> str:
        return run_until([*cmd, "--", *targets], deadline, GRACE_S, args.log, workdir)

    folders = {cfg.prepared_folder_of(config, cfg.dataset_of(config, e)) for e in order}
    data = [f"{config['data_dir']}/{f}/{split}.npz" for f in folders for split in ("train", "test")]
    missing = not args.dry_run and not all((workdir / f).is_file() for f in data)
    if missing and time.monotonic() < deadline and run(sorted(data)) == "deadline":
        return "deadline"  # alone: rebuilt in a training's call, the data would rerun it
    import_runs(window, workdir)
    failed, held, measured = [], [], {}  # measured: each phase's seconds in the jobs' logs
    for exp in order:
        record = records.setdefault(exp, {"failures": 0, "seconds": 0.0})
        if finished(config, workdir, exp):
            record["outcome"] = "done"
            continue
        if (left_s := deadline - time.monotonic()) <= 0:
            return "deadline"
        if training := not trained(config, workdir, exp):
            unmeasured = exp in window["start_unmeasured"]
            why = training_refusal(config, rates, workdir, exp, left_s, unmeasured)
            targets = [f"{cfg.experiment_dir(config, root, exp)}/privacy.json"]
        else:
            why = evaluation_refusal(config, workdir, exp, left_s, measured)
            why = why or (args.train_only and f"{exp}: evaluation (--train-only)")
            targets = evaluation_files(config, root, [exp])
        if why:
            record["outcome"] = f"not started: {why}"
            held.append(exp)
            continue
        begin, outcome = time.monotonic(), run(targets)
        record["seconds"] += time.monotonic() - begin
        record["outcome"] = "would start" if args.dry_run and outcome == "done" else outcome
        if outcome == "deadline":
            return "deadline"
        if outcome == "failed":
            record["failures"] += 1
            failed.append(exp)
        elif args.dry_run:
            held.append(exp)
        elif training:
            order.append(exp)  # trained now: its evaluation next, if it fits
    return f"failed:{','.join(failed)}" if failed else "waiting" if held else "done"


def pack(workdir: Path, archive: Path, keep: list[str]) -> int:
    """Tar and gzip ``workdir`` less :data:`EXCLUDE` (never what ``keep`` matches) into
    ``archive`` (atomic); returns its bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(p for p in workdir.rglob("*") if p.is_file() and not p.is_symlink()):
            rel = path.relative_to(workdir).as_posix()
            kept = any(fnmatch.fnmatch(rel, pattern) for pattern in keep)
            if kept or not any(fnmatch.fnmatch(rel, pattern) for pattern in EXCLUDE):
                tar.add(path, arcname=rel, recursive=False)
    fileio.write_bytes(archive, buffer.getvalue())
    return buffer.tell()


def unpack(archive: Path, workdir: Path) -> None:
    """Extract ``archive`` into ``workdir``."""
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: no archive")
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            tar.extractall(workdir, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ValueError(f"{archive}: not a readable tar.gz archive ({err})") from None


def export_set(window: dict, workdir: Path, set_dir: Path, state: dict) -> None:
    """Copy the finished experiments' ledgers, logs and scores into ``set_dir`` with
    ``provenance.json`` (device, commit, date, calls), each DP experiment trained here with
    its release (:func:`publish`); ``dpsinkhorn report results-set`` renders its Table 1."""
    config, calls, stamps = window["config"], state["calls"], state.setdefault("finished", {})
    experiments = {}
    for exp in [e for e in window["experiments"] if finished(config, workdir, e)]:
        stamps.setdefault(exp, {k: calls[-1][k] for k in ("call", "device", "commit")})
        scores = cfg.evaluation_dir(config, workdir / results_dir(config), exp)
        for pattern in SET_FILES:
            for path in [*home(config, workdir, exp).glob(pattern), *scores.glob(pattern)]:
                fileio.write_bytes(set_dir / exp / path.name, path.read_bytes())
        experiments[exp] = {"evaluated_in": stamps[exp]}
        if (scores / "evaluate_phases.json").is_file():  # which commit computed each phase
            experiments[exp]["phases"] = fileio.read_json(scores / "evaluate_phases.json")
        if cfg.is_private(config, exp) and exp not in window["imports"]:
            experiments[exp]["release"] = publish(config, workdir, exp, set_dir / exp / "release")
    provenance = {
        "name": set_dir.name,
        "what": "benchmarks/gpu/window.py calls: each finished experiment's scores, ledger "
        "and log, and the release of each DP experiment trained there",
        **{key: calls[-1][key] for key in ("device", "commit")},
        "date": calls[-1]["finished"][:10],
        "config": window["configfile"],
        "config_changes": [f"snakemake --config {o}" for o in window["overrides"]],
        "calls": calls,
        "experiments": experiments,
    }
    fileio.write_json(set_dir / "provenance.json", provenance)


def publish(config, workdir: Path, exp: str, out: Path) -> str:
    """Release ``exp`` into ``out`` (``dpsinkhorn release``'s code on its folder alone) less
    the samples, which the manifest names by hash; returns "released" or the refusal."""
    import torch

    if (out / decision.MANIFEST).is_file():
        return "released"
    out, device = out.resolve(), "cuda" if torch.cuda.is_available() else "cpu"
    with contextlib.chdir(workdir):
        run = results_dir(config)
        rel = cfg.experiment_dir(config, run, exp).relative_to(run).as_posix()
        folders = [f for f in decision.run_folders(config, run) if f.rel == rel]
        try:
            decision.release(run, out, folders, device=device)
        except (ValueError, FileNotFoundError) as err:
            return f"not released: {err}"
    for path in out.rglob("samples_seed*.npz"):
        path.unlink()
    return "released"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--window", type=Path, default=REPO / "benchmarks/gpu/window.yaml")
    add("--minutes", type=float, required=True, help="this call's minutes in all")
    add("--archive-in", type=Path, help="what the last call left (absent: start empty)")
    add("--archive-out", type=Path, required=True, help="this call's state, packed")
    add("--results-set", type=Path, help="results set folder, named by what it holds")
    add("--rates", help="measured step rates (default: the config's cluster.step_rates)")
    add("--workdir", type=Path, help="working folder (default: a temporary one)")
    add("--train-only", action="store_true", help="start no evaluation (no FID weights)")
    add("--dry-run", action="store_true", help="Snakemake -n: what would start")
    add("--config", nargs="*", default=[], help="more snakemake --config KEY=VALUE")
    args = parser.parse_args(argv)
    if not 0 < args.minutes < float("inf"):
        parser.error(f"--minutes {args.minutes}: give a positive number")
    args.log = args.archive_out.parent / "window.log"  # Snakemake's output, beside the archive
    return args


def start_call(window: dict, workdir: Path, number: int) -> dict:
    """The call's record (number, device in words, commit, start time); writes the config's
    copy and sets the environment of the workflow's jobs: this Python's commands first, the
    commit and the record store (in the working folder unless the environment names one)."""
    import torch

    cuda, git = torch.cuda, ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
    name = cuda.get_device_name(0) if cuda.is_available() else f"cpu, {os.cpu_count()} cores"
    commit = (
        os.environ.get(COMMIT_ENV) or subprocess.run(git, capture_output=True, text=True).stdout
    )
    os.environ[COMMIT_ENV] = commit = commit.strip() or "unknown"
    fileio.write_bytes(workdir / CONFIG_COPY, window["config_path"].read_bytes())
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    store = Path(os.environ.setdefault(STORE_ENV, str(workdir / STORE_FOLDER))).resolve()
    if store.is_relative_to(workdir.resolve()):  # then the archive keeps it
        window["keep"].append(f"{store.relative_to(workdir.resolve()).as_posix()}/*")
    device = f"{name} (torch {torch.__version__})"
    return {"call": number, "device": device, "commit": commit, "started": now()}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    start, args = time.monotonic(), parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpsinkhorn-window-"))
    try:
        window = load_window(args.window)
        for folder in (workdir, args.archive_out.parent):
            folder.mkdir(parents=True, exist_ok=True)
        if args.archive_in:
            unpack(args.archive_in, workdir)
        state = fileio.read_json(workdir / STATE) if (workdir / STATE).is_file() else {"calls": []}
        call = start_call(window, workdir, len(state["calls"]) + 1)
        outcome = work(window, workdir, start + args.minutes * 60 - RESERVE_S, args, state)
        command = shlex.join(["window.py", *(argv or sys.argv[1:])])
        state["calls"].append(call | {"outcome": outcome, "finished": now(), "command": command})
        if args.results_set:
            export_set(window, workdir, args.results_set, state)
        fileio.write_json(workdir / STATE, state)
        size = pack(workdir, args.archive_out, window["keep"])
    except (ValueError, FileNotFoundError) as err:
        print(f"window: error: {err}", file=sys.stderr)
        return 2
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"call {call['call']}: {outcome}; {args.archive_out}: {size} bytes")
    for exp, record in state["experiments"].items():
        print(f"  {exp}: {record.get('outcome', 'not reached')}")
    return 1 if outcome.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
