"""Killing a workflow anywhere: Snakemake and its jobs killed at moments drawn
from a seed, the same command run again until it completes, then what the run left checked.

Shared by tests/test_kill_anywhere.py (the own-data lives, the killed release and the slow
smoke mode; its docstring says how moments are aimed and what is checked) and
tests/test_workflow.py (the smoke run of CI, killed at a few moments aimed from a saved
timing, :data:`SMOKE_TIMING`). A life runs in a working folder whose config is
:data:`CONFIG`: :func:`killed_life` kills and reruns it, :func:`verdict` checks and
describes it.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from helpers import require_shared, shared_path

from dpsinkhorn import config as cfg
from dpsinkhorn.fileio import sha256_of
from dpsinkhorn.privacy import trainings

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

SIGNALS = ("SIGKILL", "SIGTERM")
#: SLURM's KillWait: SIGKILL this long after SIGTERM.
GRACE_S = 20.0
#: How often a running attempt's log is read.
POLL_S = 0.05
#: What holds times (compared by content) or is bookkeeping (not compared).
NOT_COMPARED = ("/logs/", "/benchmarks/", "/trainings/", ".snakemake")
#: Every life writes its config here, in its working folder.
CONFIG = "ka.yaml"
#: Snakemake's log (9.x): a job's block opens with ``rule X:`` or ``localrule X:`` and its
#: indented lines give its ``jobid`` and ``wildcards``; ``Finished jobid: N (Rule: X)`` says
#: its outputs are stored (8.x: ``Finished job N.``).
RULE_LINE = re.compile(r"(?:local)?rule (\w+):$")
FINISHED_LINE = re.compile(r"Finished job(?:id:)? (\d+)")
#: What the log shows when the run's jobs are done: then Snakemake lives on for 1 s or more.
END_LINE = "Nothing to be done"
#: A moment's time when it has come (:meth:`Attempt.until`).
NOW = -math.inf
#: The smoke workflow's uninterrupted run on the 2-core machine, timed (:meth:`Reference.save`;
#: refresh with ``.venv/bin/python tests/killing.py``).
SMOKE_TIMING = Path(__file__).resolve().parent / "data" / "smoke_timing.json"


def smoke_config(workdir: Path) -> Path:
    """The smoke workflow's config (config/smoke.yaml) with the shared MNIST mirror."""
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "DATA=PATH")
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    path = workdir / CONFIG
    path.write_text(yaml.safe_dump({**config, "data_mirror": str(mirror)}, sort_keys=False))
    return path


@dataclass(frozen=True)
class Workflow:
    """The killed workflow as its config (``ka.yaml`` in the working folder) says: where
    its experiments' files are and the labels (:func:`log_jobs`) of its training jobs."""

    config: dict

    @classmethod
    def of(cls, workdir: Path) -> Workflow:
        return cls(cfg.load_config(workdir / CONFIG))

    @property
    def results(self) -> Path:
        """results/<run>, relative to the working folder."""
        return Path("results", self.config["run_name"])

    def folder(self, exp: str) -> Path:
        """An experiment's folder (results/<run>/[nonprivate/]<exp>), relative."""
        return cfg.experiment_dir(self.config, self.results, exp)

    @property
    def dp_trainings(self) -> list[str]:
        return [f"train {e}" for e in cfg.private_experiments(self.config)]

    @property
    def reproducible(self) -> bool:
        """Whether every DP training's noise key is public (its files repeat exactly)."""
        private = cfg.private_experiments(self.config)
        return all(cfg.experiment(self.config, e)["reproducible"] for e in private)

    @property
    def nonprivate_trainings(self) -> list[str]:
        trained = cfg.trained_experiments(self.config)
        return [f"train {e}" for e in trained if not cfg.is_private(self.config, e)]


def command(workdir: Path) -> list[str]:
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "FID_WEIGHTS=PATH")
    return [
        str(BIN / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "-c",
        "2",
        "--max-threads",
        "1",
        "--configfile",
        str(workdir / CONFIG),
        "--config",
        f"fid_weights={weights}",
    ]


def env(workdir: Path) -> dict:
    """The commands' environment; each working folder has a record store of its own beside
    it (the same digits trained in another folder of this session would count as the same
    person's records and change its privacy summary)."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "DPSINKHORN_RECORD_STORE": str(workdir.parent / f"{workdir.name}.record-store"),
    }


def log_jobs(text: str) -> tuple[dict[str, str], set[str], bool]:
    """What a Snakemake log shows: the jobs started ({jobid: label}; label: the rule and its
    wildcards' values but ``home``, e.g. ``train digits_dp``), the jobids finished, and whether
    the run's jobs are done (its ``all`` job started, or nothing to be done). A block cut
    off before its jobid counts as started under the id ``?``."""
    started, finished, block = {}, set(), None
    for line in [*text.splitlines(), ""]:
        if block is not None and line.startswith(" "):
            key, _, value = line.strip().partition(": ")
            block[key] = value
            continue
        if block is not None:
            values = re.findall(r"\b(\w+)=([^,\s]*)", block.get("wildcards", ""))
            label = [block["rule"], *(v for k, v in values if k != "home")]
            started[block.get("jobid", "?")] = " ".join(label)
            block = None
        if match := RULE_LINE.match(line):
            block = {"rule": match.group(1)}
        elif match := FINISHED_LINE.match(line):
            finished.add(match.group(1))
    return started, finished, "all" in started.values() or END_LINE in text


class Attempt:
    """One run of the command (``cmd``, default :func:`command`), in a process group of its
    own, its log read as it grows: when each job's start and finish line first showed
    (monotonic seconds)."""

    def __init__(self, workdir: Path, path: Path, cmd: list[str] | None = None):
        self.workdir, self.path = workdir, path
        self._log = open(path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd or command(workdir),
            cwd=workdir,
            env=env(workdir),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.started: dict[str, float] = {}  # job label -> when its start line showed
        self.finished: dict[str, float] = {}
        self.running: list[str] = []  # started, not finished
        self.ended = False  # the log shows the run's jobs done

    def poll(self) -> None:
        now = time.monotonic()
        started, finished, self.ended = log_jobs(self.path.read_text())
        for jobid, label in started.items():
            self.started.setdefault(label, now)
            if jobid in finished:
                self.finished.setdefault(label, now)
        self.running = sorted(label for i, label in started.items() if i not in finished)

    @property
    def first_job_at(self) -> float | None:
        return min(self.started.values(), default=None)

    def started_beside(self, job: str, other: str) -> bool:
        """Whether ``job`` started while ``other`` ran."""
        if job not in self.started or other not in self.started:
            return False
        return self.started[other] <= self.started[job] < self.finished.get(other, math.inf)

    def until(self, when: Callable[[Attempt], float | None]) -> bool:
        """Read the log until the time ``when`` gives (None: not known yet) has come, or
        until the log shows the run's end: True (kill now); False if the run exited first."""
        while self.proc.poll() is None:
            self.poll()
            at = when(self)
            if self.ended or (at is not None and time.monotonic() >= at):
                return True
            time.sleep(POLL_S)
        return False

    def close(self) -> int:
        code = self.proc.wait(1800)
        self._log.close()
        self.poll()
        return code


@dataclass
class Reference:
    """The uninterrupted run of a workflow, timed from its log: where a life's moments are
    aimed (:func:`aim_moment`) and, when ``workdir`` is its folder, the files a
    reproducible life must equal. Saved without its files (:meth:`save`), it still aims."""

    workdir: Path | None  # None: timing only (:meth:`load`)
    workflow: Workflow
    life_s: float  # its wall time
    startup_s: float  # from its start to its first job's start line
    starts: dict[str, float]  # job label -> its start line, after the first job's, in order
    jobs: dict[str, float]  # job label -> from its start line to its finish line

    @property
    def jobs_s(self) -> float:
        """From its first job's start line to its last finish line."""
        return max(self.starts[label] + s for label, s in self.jobs.items())

    def save(self, path: Path) -> None:
        """The timing (seconds) as JSON: life, start-up, each job's start and duration."""
        timing = {"life_s": self.life_s, "startup_s": self.startup_s}
        path.write_text(json.dumps({**timing, "starts": self.starts, "jobs": self.jobs}, indent=1))

    @classmethod
    def load(cls, path: Path, workflow: Workflow) -> Reference:
        """A saved timing, for ``workflow`` (no files: a life is not compared with it). A
        job it does not list is never aimed at; one the workflow no longer has never comes,
        so its moment falls at the life's end."""
        timing = json.loads(path.read_text())
        return cls(None, workflow, **timing)


def kill(proc: subprocess.Popen, how: str) -> bool:
    """Kill the process group: SIGKILL, or SIGTERM then SIGKILL after GRACE_S. Returns
    whether Snakemake itself got SIGKILL (then its lock is left)."""
    sigkill = how == "SIGKILL"
    try:
        os.killpg(proc.pid, signal.SIGKILL if sigkill else signal.SIGTERM)
        if not sigkill:
            try:
                proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                sigkill = True
            os.killpg(proc.pid, signal.SIGKILL)  # its jobs
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + GRACE_S  # jobs of the group may outlive Snakemake briefly
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    return sigkill


def aim_moment(k: int, u: float, moments: int, ref: Reference, done: set[str], cursor: float):
    """Moment ``k``: its aim (for the figure), when it comes (a function of the attempt: a
    monotonic time, or None while not known yet) and the life's cursor after it. ``u`` in
    [0, 1) is drawn from the seed; ``done``: the jobs finished in earlier attempts; the
    cursor: how far the kills have come, in the uninterrupted run's time after its first
    job's start (module docstring)."""
    left = [label for label in ref.starts if label not in done and label != "all"]
    checkpoint = None
    if k == 0:
        target = min(ref.workflow.dp_trainings, key=ref.starts.get)  # the first DP training
        point = ref.starts[target] + u * 0.5 * ref.jobs[target]
        exp = target.split()[1]
        checkpoint = ref.workflow.folder(exp) / "private_workspace" / "checkpoint.pt"
    elif k % 4 == 3 or not left:
        delay = u * ref.startup_s

        def in_startup(a: Attempt) -> float:
            return min(a.t0 + delay, a.first_job_at or math.inf)

        return f"start-up+{delay:.1f}s", in_startup, cursor
    else:
        cursor = max(cursor, min(ref.starts[label] for label in left))
        n = sum(i % 4 != 3 for i in range(k, moments))  # the job moments left, this one too
        point = cursor + u * 2 * (ref.jobs_s - cursor) / (n + 1)
        target = max((label for label in left if ref.starts[label] <= point), key=ref.starts.get)
    offset = point - ref.starts[target]

    def in_target(a: Attempt) -> float | None:
        if checkpoint and (a.workdir / checkpoint).exists():  # its first: steps are left
            return NOW
        if target in a.finished:  # sooner than in the uninterrupted run: in what runs next
            return NOW if a.running else None
        return a.started[target] + offset if target in a.started else None

    return f"{target}+{offset:.1f}s", in_target, point


def hit_rules(attempt: Attempt) -> list[str]:
    """The rules a kill landed in: those running, else where Snakemake was."""
    if attempt.running:
        return sorted({label.split()[0] for label in attempt.running})
    return ["(start-up)" if attempt.first_job_at is None else "(between jobs)"]


def raced(attempt: Attempt, workflow: Workflow) -> bool:
    """Whether ``release_manifest`` started while a non-private training ran."""
    return any(attempt.started_beside("release_manifest", t) for t in workflow.nonprivate_trainings)


def killed_life(
    workdir: Path, moments: int, ref: Reference, rng: random.Random, cmd: list[str] | None = None
) -> dict:
    """Run the same command (``cmd``, default :func:`command`), killing it at ``moments``
    moments, until it completes; the figure: moments, rules hit, runs, unlocks, races,
    temporary files removed, seconds."""
    began = time.monotonic()
    cmd = cmd or command(workdir)
    figure = {
        "moments": [],
        "hit": Counter(),
        "attempts": 0,
        "unlocks": 0,
        "completed_before_kill": 0,
        "race": 0,
    }
    done: set[str] = set()
    cursor = 0.0
    while True:
        figure["attempts"] += 1
        k = len(figure["moments"])
        attempt = Attempt(workdir, workdir / f"attempt{figure['attempts']}.log", cmd)
        if k < moments:
            how, u = rng.choice(SIGNALS), rng.random()  # two draws a moment: the seed fixes all
            aim, when, after = aim_moment(k, u, moments, ref, done, cursor)
            if attempt.until(when):
                running, hit = attempt.running, hit_rules(attempt)
                killed = kill(attempt.proc, how)
                attempt.close()
                done |= set(attempt.finished)
                figure["race"] += raced(attempt, ref.workflow)
                cursor = after
                figure["moments"].append(f"{how[3:]} {aim}: {', '.join(running) or hit[0]}")
                figure["hit"].update(hit)
                if killed:  # Snakemake's lock is left: what a user does (docs/CLUSTER.md)
                    figure["unlocks"] += 1
                    subprocess.run(
                        [*cmd, "--unlock"],
                        cwd=workdir,
                        env=env(workdir),
                        capture_output=True,
                        check=True,
                    )
                continue
        code = attempt.close()
        figure["race"] += raced(attempt, ref.workflow)
        text = attempt.path.read_text()
        assert code == 0, f"attempt {figure['attempts']} failed:\n{text[-6000:]}"
        figure["completed_before_kill"] += k < moments
        removed = re.search(r"removed (\d+) temporary files of killed writers", text)
        figure["temps_removed"] = int(removed.group(1)) if removed else 0
        figure["seconds"] = time.monotonic() - began
        return figure


def result_files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not any(x in f"/{p.relative_to(root).as_posix()}" for x in NOT_COMPARED)
    }


def _log_without_times(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="") as fh:
        return [(row["step"], row["epsilon"]) for row in csv.DictReader(fh)]


#: Keys of a JSON file that hold times (the seconds a classifier took).
TIME_KEYS = ("seconds", "elapsed_s", "steps_per_s")


def _without_times(obj):
    if isinstance(obj, dict):
        return {k: _without_times(v) for k, v in obj.items() if k not in TIME_KEYS}
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


def same_content(rel: str, ours: Path, theirs: Path) -> bool:
    """Equal bytes, or equal content less times (and less the hashes of files with times)."""
    if ours.read_bytes() == theirs.read_bytes():
        return True
    if rel.endswith("train_log.csv"):  # steps/s and elapsed seconds
        return _log_without_times(ours) == _log_without_times(theirs)
    if rel.endswith(".sha256"):  # the hash of a file compared by content on its own
        return same_content(rel[: -len(".sha256")], ours.with_suffix(""), theirs.with_suffix(""))
    if rel.endswith(".json"):
        a, b = (json.loads(p.read_text()) for p in (ours, theirs))
        if rel.endswith("privacy.json"):
            a, b = ({k: v for k, v in x.items() if k != "train_log_sha256"} for x in (a, b))
        if rel.endswith("release_manifest.json"):
            base = ours.parent, theirs.parent
            for x in (a, b):
                for entry in x["files"]:
                    path = entry["path"]
                    if not (base[0] / path).read_bytes() == (base[1] / path).read_bytes():
                        assert same_content(path, base[0] / path, base[1] / path), path
                        entry.pop("sha256")  # a file with times: compared above
        return _without_times(a) == _without_times(b)
    return False


#: The first and last bytes of a whole file of these kinds (a PNG ends with its IEND chunk;
#: a PDF's %%EOF may be followed by a line end).
FRAMED = {
    ".png": (b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"),
    ".jpg": (b"\xff\xd8", b"\xff\xd9"),  # the smoke workflow's CelebA fixture
    ".pdf": (b"%PDF-", b"%%EOF"),
}


def load_whole(path: Path) -> None:
    """Read ``path`` whole as its kind; raises if it is cut off or not of its kind."""
    import numpy as np
    import torch

    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:  # each member's CRC is checked
            _ = [npz[k] for k in npz.files]
    elif path.suffix == ".pt":
        torch.load(path, map_location="cpu", weights_only=True)
    elif path.suffix == ".json" or path.name == ".dpsinkhorn.stopped":
        json.loads(path.read_text())
    elif path.suffix == ".jsonl":
        trainings.read(path)
    elif path.suffix in (".csv", ".tsv"):
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh, delimiter="\t" if path.suffix == ".tsv" else ","))
        if not rows or any(len(row) != len(rows[0]) for row in rows):
            raise ValueError(f"not a whole table: {[len(row) for row in rows]} fields")
    elif path.suffix in FRAMED:
        data, (head, end) = path.read_bytes(), FRAMED[path.suffix]
        if not (data.startswith(head) and data.rstrip().endswith(end)):
            raise ValueError(f"not a whole {path.suffix} file")
    elif path.suffix == ".gz":
        with gzip.open(path) as fh:
            fh.read()
    elif path.name.endswith("-ubyte"):  # MNIST's IDX files: a header, then prod(dims) bytes
        data = path.read_bytes()
        dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3])]
        if data[:3] != b"\x00\x00\x08" or len(data) != 4 + 4 * len(dims) + math.prod(dims):
            raise ValueError(f"not a whole IDX file of {dims}")
    else:  # logs, tables, reports, the lock file (empty)
        path.read_text(encoding="utf-8")


def unreadable(workdir: Path) -> list[str]:
    """Every file of the results and data folders that does not load as its kind."""
    bad = []
    for path in sorted(p for d in ("results", "data") for p in (workdir / d).rglob("*")):
        if path.is_file():
            try:
                load_whole(path)
            except Exception as err:  # any failure to load is what is reported
                bad.append(f"{path.relative_to(workdir)}: {type(err).__name__}: {err}")
    return bad


def check_consistent(workdir: Path, wf: Workflow, figure: dict) -> list[str]:
    """What every finished run must hold, killed or not; returns the problems. Counts the
    releases the record says were published again into ``figure``."""
    problems = []
    left = [
        p.relative_to(workdir).as_posix()
        for p in workdir.rglob("*")
        if ".snakemake" not in p.parts
        and (
            re.search(r"\.tmp(\.|$|-)", p.name)
            or p.name in ("private_workspace", ".dpsinkhorn.stopped")
        )
    ]
    if left:
        problems.append(f"left behind: {left}")
    problems += [f"unreadable: {bad}" for bad in unreadable(workdir)]
    events = [
        e
        for record in (workdir / "data" / "trainings").glob("*.jsonl")
        for e in trainings.read(record)
    ]
    figure["republished"] = 0
    for name in cfg.trained_experiments(wf.config):
        folder = workdir / wf.folder(name)
        ours = [t for t in trainings.trainings(events) if t["out"] == str(folder.resolve())]
        if len(ours) != 1 or not ours[0]["finished"]:
            problems.append(f"{name} counted {len(ours)} times: {ours}")
            continue
        mine = [e for e in events if e["training"] == ours[0]["training"]]
        hashes = {e["content_sha256"] for e in mine if e["event"] == "finished"}
        generator = sha256_of(folder / "generator.pt")
        if hashes != {generator}:
            problems.append(f"{name}: generator.pt is not the one of every finished event")
        figure["republished"] += sum(e["event"] == "republished" for e in mine)
        if cfg.is_private(wf.config, name):
            ledger = json.loads((folder / "privacy.json").read_text())
            if ledger["content_sha256"] != generator:
                problems.append(f"{name}: generator.pt is not the one its ledger names")
    published = workdir / "published"
    run = subprocess.run(
        [
            str(BIN / "dpsinkhorn"),
            "release",
            "--config",
            CONFIG,
            "--out",
            str(published),
            "--accept-no-guarantee",
        ],
        cwd=workdir,
        env=env(workdir),
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        return [*problems, f"release refused: {run.stderr.strip()}"]
    manifest = json.loads((workdir / wf.results / "release_manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    got = {p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file()}
    if got - {"release_manifest.json"} != listed:
        problems.append(f"release holds {sorted(got)}, manifest lists {sorted(listed)}")
    return problems


def uninterrupted(workdir: Path) -> Reference:
    """Runs the workflow of ``workdir``'s config once, uninterrupted, timed from its log."""
    run = Attempt(workdir, workdir / "uninterrupted.log")
    run.until(lambda a: None)
    assert run.close() == 0, run.path.read_text()[-8000:]
    first = run.first_job_at
    return Reference(
        workdir,
        Workflow.of(workdir),
        life_s=time.monotonic() - run.t0,
        startup_s=first - run.t0,
        starts={label: at - first for label, at in run.started.items()},
        jobs={label: run.finished[label] - at for label, at in run.started.items()},
    )


def verdict(
    name: str, workdir: Path, figure: dict, ref: Reference, seed: str, moments: int
) -> tuple[list[str], str]:
    """What a killed life left (:func:`check_consistent`; against ``ref``'s files where the
    life's noise key is public and ``ref`` has files), and its figure as one line:
    (problems, text)."""
    wf = Workflow.of(workdir)
    problems = check_consistent(workdir, wf, figure)
    if wf.reproducible and ref.workdir is not None:
        ours, theirs = result_files(workdir / "results"), result_files(ref.workdir / "results")
        if set(ours) != set(theirs):
            problems.append(f"files differ: {sorted(set(ours) ^ set(theirs))}")
        differ = [r for r in set(ours) & set(theirs) if not same_content(r, ours[r], theirs[r])]
        if differ:
            problems.append(f"content differs from the uninterrupted run: {sorted(differ)}")
    tried, hit = len(figure["moments"]), figure["hit"]
    text = (
        f"kill-anywhere {name} (seed {seed}): {tried} of "
        f"{moments} moments tried in {figure['attempts']} runs ({figure['unlocks']} unlocks, "
        f"{figure['completed_before_kill']} completed before its kill), "
        f"{tried if not problems else 0} faults survived; kills landed in "
        f"{', '.join(f'{r} {n}' for r, n in sorted(hit.items()))}; "
        f"release_manifest started beside a non-private training {figure['race']} times; "
        f"republished releases {figure['republished']}, temporary files of killed writers "
        f"removed {figure['temps_removed']}; lost: {problems or 'nothing'}; "
        f"{figure['seconds']:.0f} s (uninterrupted: {ref.life_s:.0f} s"
        f"{'' if ref.workdir else ', saved timing'}); moments: {'; '.join(figure['moments'])}"
    )
    return problems, text


def check_life(figure: dict, moments: int, problems: list[str], text: str) -> None:
    """Fails unless nothing was lost, every moment came within the life, the first in a
    training and the others spread over the jobs (tests/test_kill_anywhere.py)."""
    assert not problems, text
    assert len(figure["moments"]) == moments, text
    rules = sorted(set(figure["hit"]) - {"(start-up)", "(between jobs)"})
    assert "train" in rules and len(rules) >= min(3, moments // 3), text


if __name__ == "__main__":  # refresh SMOKE_TIMING: the smoke workflow run once, uninterrupted
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        smoke_config(Path(tmp))
        reference = uninterrupted(Path(tmp))
        SMOKE_TIMING.parent.mkdir(exist_ok=True)
        reference.save(SMOKE_TIMING)
        print(f"{SMOKE_TIMING}: {len(reference.jobs)} jobs, {reference.life_s:.0f} s")
