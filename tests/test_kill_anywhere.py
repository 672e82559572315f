"""Kill anywhere (issue 36): Snakemake and its jobs killed at random moments, the same
command run again after each kill until it completes, and nothing lost or counted twice.

A tiny own-data workflow on scikit-learn's digits runs the smoke workflow's chain of
rules (data, fid_reference, train, evaluate, privacy_summary, release_manifest, table1,
reproduction) for a DP experiment and a non-private one, in about a minute. The
non-private training writes its private workspace under the results folder, where
``release_manifest``, whose inputs are the DP files only, may run beside it: the first
race of issue 36. Whether they overlap is Snakemake's choice (it trained the non-private
experiment first in the runs measured); the figure counts the attempts where they did.
Two lives of it:

* ``reproducible``: public noise key; every file must equal an uninterrupted run's, or
  hold the same content where it holds times (train_log.csv, its hash in privacy.json
  and the release manifest);
* ``secret``: a user's own-data run with a secret noise key, whose files cannot equal
  another run's: every file must agree with the record and the ledger instead.

Each moment kills the whole process group (Snakemake and its jobs): SIGKILL, or SIGTERM
as SLURM sends it followed by SIGKILL after a grace time; a Snakemake that got SIGKILL
leaves its lock, so ``--unlock`` runs first, as a user does. Each moment's signal and a
fraction u are drawn from a seed that the test prints (``DPSINKHORN_KILL_SEED`` repeats
one). When it comes is timed from the attempt's log, read as it grows (Snakemake's
job-start and finish lines), against the uninterrupted run's log read the same way (its
start-up, and each job's start and duration after its first job's start):

* the first moment of a life is aimed at the DP training that started first in the
  uninterrupted run: u of half that job's uninterrupted time after this attempt's log
  shows it started, or when its first checkpoint shows if that is sooner (steps are left
  then: a faster attempt than the uninterrupted run is still killed in its training);
* every fourth moment falls in Snakemake's start-up (before a job runs): u of the
  uninterrupted run's start-up, or at this attempt's first job start if that is sooner;
* the others fall in the jobs. A cursor walks through the uninterrupted run's job time
  (never behind the earliest start of a job not yet finished): each such moment moves it
  by u of twice its share of what is left (n such moments left: 2/(n+1) of it), so the
  moments spread over the life. The kill is aimed at the unfinished job that started
  last at or before the cursor, as far into it as the cursor is: that far after this
  attempt's log shows that job started. If that job ends sooner in this attempt, the
  kill comes at once in the jobs running then, or as the next job starts: a kill never
  runs ahead of the life.

A kill timed from its job's own start comes after that job's inputs exist however slowly
the attempt got there, and each attempt runs at least the jobs before its aim: the life
moves on, also when a job that keeps no checkpoint is killed again and again. A moment
whose time has not come when the log shows the run's end (its ``all`` job, or nothing to
be done) kills there, 1 s or more before Snakemake exits: every moment is used. Each kill
records the jobs that were running (started, not finished); the figure counts them per
rule.

Then: each training is counted once in the training record (one id, one generator hash
in all its ``finished`` events: one noise draw) and its generator is the one the record
finished with; every result and data file loads as its kind (npz, pt, json, csv, png);
no temporary file, private workspace or stop note is left; ``dpsinkhorn release`` holds
exactly the manifest's files. The figure (moments, rules hit, republished releases,
temporary files the run's cleanup removed) is printed and shown in pytest's summary.

``DPSINKHORN_KILL_MOMENTS=<n>`` (default 10 per life, 20 in all) is the slow mode.
``DPSINKHORN_KILL_SMOKE=<n>`` kills the smoke workflow itself (config/smoke.yaml: every
Table 1, 3 and 6 row and every study, 88 jobs) at ``n`` moments in one reproducible
life, with the same aims and checks, against an uninterrupted run of it (20 moments: 20 min
on 2 cores in all; skipped unless set).
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

import pytest
import yaml
from helpers import require_shared, shared_path, write_digits_npz

from dpsinkhorn import config as cfg
from dpsinkhorn.fileio import sha256_of
from dpsinkhorn.privacy import trainings

pytestmark = pytest.mark.slow  # whole workflows (docs/TESTING.md)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DIGITS = [str(d) for d in range(10)]
MOMENTS = int(os.environ.get("DPSINKHORN_KILL_MOMENTS", "10"))
SMOKE_MOMENTS = int(os.environ.get("DPSINKHORN_KILL_SMOKE", "0"))
SEED = int(os.environ.get("DPSINKHORN_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
SIGNALS = ("SIGKILL", "SIGTERM")
#: SLURM's KillWait: SIGKILL this long after SIGTERM.
GRACE_S = 20.0
#: How often a running attempt's log is read.
POLL_S = 0.05
#: What holds times (compared by content) or is bookkeeping (not compared).
NOT_COMPARED = ("/logs/", "/benchmarks/", "/trainings/", ".snakemake")
#: The own-data workflow's experiments.
DP, NONPRIVATE = "digits_dp", "digits_nonprivate"
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


def _config(workdir: Path, reproducible: bool, npz: Path | None = None) -> Path:
    """The life's config; ``npz``: the digits of another life (the same prepared folder)."""
    npz = npz or write_digits_npz(workdir / "digits.npz")
    config = {
        "run_name": "ka",
        "data_dir": "data",
        "device": "cpu",
        "seeds": [0],
        "datasets": {"digits": {"path": str(npz), "classes": DIGITS, "image_size": 28,
                                "resize": True}},
        "evaluation": {"num_samples": 20, "fid_reference_size": 20, "fid_sqrtm": "eigh",
                       "classifiers": ["logreg"], "logreg_max_iter": 50, "max_epochs": 1,
                       "patience": 1, "batch_size": 128},
        "training_defaults": {"steps": 20, "checkpoint_every": 5, "log_every": 5,
                              "batch_size": 50, "channels": [8, 4, 2],
                              "reproducible": reproducible},
        # A real-data row is left out: its evaluation (Inception) costs as much as a
        # training's, and no training or ledger of it can be lost.
        "experiments": {DP: {"dataset": "digits", "table1_row": "paper", "sigma": 1.5},
                        NONPRIVATE: {"dataset": "digits", "table1_row": "nonprivate",
                                     "method": "sinkhorn"}},
    }  # fmt: skip
    path = workdir / CONFIG
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _smoke_config(workdir: Path) -> Path:
    """The smoke workflow's config (config/smoke.yaml) with the shared MNIST mirror."""
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "DATA=PATH")
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    path = workdir / CONFIG
    path.write_text(yaml.safe_dump({**config, "data_mirror": str(mirror)}, sort_keys=False))
    return path


@dataclass(frozen=True)
class Workflow:
    """The killed workflow as its config (``ka.yaml`` in the working folder) says: where
    its experiments' files are and the labels (:func:`_jobs`) of its training jobs."""

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


def _command(workdir: Path) -> list[str]:
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "FID_WEIGHTS=PATH")
    return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            "-c", "2", "--max-threads", "1", "--configfile", str(workdir / CONFIG),
            "--config", f"fid_weights={weights}"]  # fmt: skip


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def _jobs(text: str) -> tuple[dict[str, str], set[str], bool]:
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


def _start(workdir: Path, log) -> subprocess.Popen:
    return subprocess.Popen(_command(workdir), cwd=workdir, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


class Attempt:
    """One run of the command, its log read as it grows: when each job's start and finish
    line first showed (monotonic seconds)."""

    def __init__(self, workdir: Path, path: Path):
        self.workdir, self.path = workdir, path
        self._log = open(path, "w")
        self.t0 = time.monotonic()
        self.proc = _start(workdir, self._log)
        self.started: dict[str, float] = {}  # job label -> when its start line showed
        self.finished: dict[str, float] = {}
        self.running: list[str] = []  # started, not finished
        self.ended = False  # the log shows the run's jobs done

    def poll(self) -> None:
        now = time.monotonic()
        started, finished, self.ended = _jobs(self.path.read_text())
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
    """The uninterrupted run of the reproducible life, timed from its log."""

    workdir: Path
    workflow: Workflow
    life_s: float  # its wall time
    startup_s: float  # from its start to its first job's start line
    starts: dict[str, float]  # job label -> its start line, after the first job's, in order
    jobs: dict[str, float]  # job label -> from its start line to its finish line

    @property
    def jobs_s(self) -> float:
        """From its first job's start line to its last finish line."""
        return max(self.starts[label] + s for label, s in self.jobs.items())


def _kill(proc: subprocess.Popen, how: str) -> bool:
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


def _aim(k: int, u: float, moments: int, ref: Reference, done: set[str], cursor: float):
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


def _hit(attempt: Attempt) -> list[str]:
    """The rules a kill landed in: those running, else where Snakemake was."""
    if attempt.running:
        return sorted({label.split()[0] for label in attempt.running})
    return ["(start-up)" if attempt.first_job_at is None else "(between jobs)"]


def _race(attempt: Attempt, workflow: Workflow) -> bool:
    """Whether ``release_manifest`` started while a non-private training ran (issue 36)."""
    return any(attempt.started_beside("release_manifest", t) for t in workflow.nonprivate_trainings)


def _killed_life(workdir: Path, moments: int, ref: Reference, rng: random.Random) -> dict:
    """Run the same command, killing it at ``moments`` moments, until it completes."""
    figure = {"moments": [], "hit": Counter(), "attempts": 0, "unlocks": 0,
              "completed_before_kill": 0, "race": 0}  # fmt: skip
    done: set[str] = set()
    cursor = 0.0
    while True:
        figure["attempts"] += 1
        k = len(figure["moments"])
        attempt = Attempt(workdir, workdir / f"attempt{figure['attempts']}.log")
        if k < moments:
            how, u = rng.choice(SIGNALS), rng.random()  # two draws a moment: the seed fixes all
            aim, when, after = _aim(k, u, moments, ref, done, cursor)
            if attempt.until(when):
                running, hit = attempt.running, _hit(attempt)
                killed = _kill(attempt.proc, how)
                attempt.close()
                done |= set(attempt.finished)
                figure["race"] += _race(attempt, ref.workflow)
                cursor = after
                figure["moments"].append(f"{how[3:]} {aim}: {', '.join(running) or hit[0]}")
                figure["hit"].update(hit)
                if killed:  # Snakemake's lock is left: what a user does (docs/CLUSTER.md)
                    figure["unlocks"] += 1
                    subprocess.run([*_command(workdir), "--unlock"], cwd=workdir, env=_env(),
                                   capture_output=True, check=True)  # fmt: skip
                continue
        code = attempt.close()
        figure["race"] += _race(attempt, ref.workflow)
        text = attempt.path.read_text()
        assert code == 0, f"attempt {figure['attempts']} failed:\n{text[-6000:]}"
        figure["completed_before_kill"] += k < moments
        removed = re.search(r"removed (\d+) temporary files of killed writers", text)
        figure["temps_removed"] = int(removed.group(1)) if removed else 0
        return figure


def _files(root: Path) -> dict[str, Path]:
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


def _same_content(rel: str, ours: Path, theirs: Path) -> bool:
    """Equal bytes, or equal content less times (and less the hashes of files with times)."""
    if ours.read_bytes() == theirs.read_bytes():
        return True
    if rel.endswith("train_log.csv"):  # steps/s and elapsed seconds
        return _log_without_times(ours) == _log_without_times(theirs)
    if rel.endswith(".sha256"):  # the hash of a file compared by content on its own
        return _same_content(rel[: -len(".sha256")], ours.with_suffix(""), theirs.with_suffix(""))
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
                        assert _same_content(path, base[0] / path, base[1] / path), path
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


def _load(path: Path) -> None:
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


def _unreadable(workdir: Path) -> list[str]:
    """Every file of the results and data folders that does not load as its kind."""
    bad = []
    for path in sorted(p for d in ("results", "data") for p in (workdir / d).rglob("*")):
        if path.is_file():
            try:
                _load(path)
            except Exception as err:  # any failure to load is what is reported
                bad.append(f"{path.relative_to(workdir)}: {type(err).__name__}: {err}")
    return bad


def _check_consistent(workdir: Path, wf: Workflow, figure: dict) -> list[str]:
    """What every finished run must hold, killed or not; returns the problems. Counts the
    releases the record says were published again into ``figure``."""
    problems = []
    left = [
        p.relative_to(workdir).as_posix()
        for p in workdir.rglob("*")
        if ".snakemake" not in p.parts
        and (re.search(r"\.tmp(\.|$|-)", p.name) or p.name in ("private_workspace",
                                                              ".dpsinkhorn.stopped"))
    ]  # fmt: skip
    if left:
        problems.append(f"left behind: {left}")
    problems += [f"unreadable: {bad}" for bad in _unreadable(workdir)]
    events = [e for record in (workdir / "data" / "trainings").glob("*.jsonl")
              for e in trainings.read(record)]  # fmt: skip
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
        [str(BIN / "dpsinkhorn"), "release", "--config", CONFIG, "--out", str(published),
         "--accept-no-guarantee"],
        cwd=workdir, env=_env(), capture_output=True, text=True,
    )  # fmt: skip
    if run.returncode != 0:
        return [*problems, f"release refused: {run.stderr.strip()}"]
    manifest = json.loads((workdir / wf.results / "release_manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    got = {p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file()}
    if got - {"release_manifest.json"} != listed:
        problems.append(f"release holds {sorted(got)}, manifest lists {sorted(listed)}")
    return problems


def _uninterrupted(workdir: Path) -> Reference:
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


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    """An uninterrupted run of the own-data workflow's reproducible life."""
    workdir = tmp_path_factory.mktemp("reference")
    _config(workdir, reproducible=True)
    return _uninterrupted(workdir)


def _life(name: str, workdir: Path, moments: int, seed: int, ref: Reference, record_property):
    """Kills the workflow of ``workdir``'s config at ``moments`` moments until a rerun
    completes, checks what it left (against ``ref``'s files if its noise key is public),
    prints and records the figure; fails on any problem."""
    start = time.monotonic()
    figure = _killed_life(workdir, moments, ref, random.Random(seed))
    wf = Workflow.of(workdir)
    problems = _check_consistent(workdir, wf, figure)
    if wf.reproducible:
        ours, theirs = _files(workdir / "results"), _files(ref.workdir / "results")
        if set(ours) != set(theirs):
            problems.append(f"files differ: {sorted(set(ours) ^ set(theirs))}")
        differ = [r for r in set(ours) & set(theirs) if not _same_content(r, ours[r], theirs[r])]
        if differ:
            problems.append(f"content differs from the uninterrupted run: {sorted(differ)}")
    tried, hit = len(figure["moments"]), figure["hit"]
    rules = sorted(set(hit) - {"(start-up)", "(between jobs)"})
    text = (
        f"kill-anywhere {name} (seed {seed}; DPSINKHORN_KILL_SEED={SEED}): {tried} of "
        f"{moments} moments tried in {figure['attempts']} runs ({figure['unlocks']} unlocks, "
        f"{figure['completed_before_kill']} completed before its kill), "
        f"{tried if not problems else 0} faults survived; kills landed in "
        f"{', '.join(f'{r} {n}' for r, n in sorted(hit.items()))}; "
        f"release_manifest started beside a non-private training {figure['race']} times; "
        f"republished releases {figure['republished']}, temporary files of killed writers "
        f"removed {figure['temps_removed']}; lost: {problems or 'nothing'}; "
        f"{time.monotonic() - start:.0f} s (uninterrupted: {ref.life_s:.0f} s); "
        f"moments: {'; '.join(figure['moments'])}"
    )
    print(f"\n{text}")
    record_property("kill_anywhere", text)
    assert not problems, text
    assert tried == moments, text  # every moment within the life (module docstring)
    # the first moment aims at the DP training; the others spread over the jobs
    assert "train" in rules and len(rules) >= min(3, moments // 3), text


@pytest.mark.parametrize("life", ["reproducible", "secret"])
def test_killed_anywhere_the_rerun_completes_with_nothing_lost(
    life, reference, tmp_path, record_property
):
    _config(tmp_path, reproducible=life == "reproducible", npz=reference.workdir / "digits.npz")
    _life(life, tmp_path, MOMENTS, SEED + (life == "secret"), reference, record_property)


def test_a_killed_release_leaves_no_folder_or_the_whole_one(reference, record_property):
    """``dpsinkhorn release`` killed at random moments (SIGKILL or SIGTERM) leaves the old
    state (no release folder) or the whole new one, never a mix; then it completes."""
    ref = reference.workdir
    seed = SEED + 2
    rng = random.Random(seed)
    manifest = json.loads((ref / reference.workflow.results / "release_manifest.json").read_text())
    whole = {f["path"] for f in manifest["files"]} | {"release_manifest.json"}
    command = [str(BIN / "dpsinkhorn"), "release", "--config", CONFIG, "--accept-no-guarantee"]
    start = time.monotonic()
    with open(ref / "release.log", "w") as log:
        done = subprocess.run([*command, "--out", "timed"], cwd=ref, env=_env(), stdout=log)
    assert done.returncode == 0
    release_s = time.monotonic() - start
    outcomes, stale = [], []
    for i in range(max(MOMENTS // 2, 6)):
        out = ref / f"published{i}"
        delay, how = rng.uniform(0, release_s * 1.2), rng.choice(SIGNALS)
        proc = subprocess.Popen([*command, "--out", out.name], cwd=ref, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            _kill(proc, how)
        got = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        state = "new" if got == whole else "old" if not got else f"mix {sorted(got)}"
        outcomes.append((round(delay, 2), how, state))
        stale += [p.name for p in ref.glob(f".{out.name}.tmp-*")]
        assert not state.startswith("mix"), (f"seed {seed}", outcomes)
        if state == "old":  # run again: it completes
            again = subprocess.run([*command, "--out", out.name], cwd=ref, env=_env(),
                                   capture_output=True, text=True)  # fmt: skip
            assert again.returncode == 0, (f"seed {seed}", outcomes, again.stderr)
            assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == whole
    text = f"killed release (seed {seed}): {outcomes}; stale temporary folders: {stale}"
    print(f"\n{text}")
    record_property("kill_anywhere", text)


@pytest.mark.timeout(6 * 3600)
@pytest.mark.skipif(not SMOKE_MOMENTS, reason="slow mode: DPSINKHORN_KILL_SMOKE=<moments>")
def test_the_smoke_workflow_killed_anywhere(tmp_path_factory, record_property):
    """The smoke workflow (config/smoke.yaml) killed at ``DPSINKHORN_KILL_SMOKE`` moments in
    one reproducible life, checked as the own-data lives are, against its uninterrupted run."""
    ref_dir, workdir = tmp_path_factory.mktemp("smoke-reference"), tmp_path_factory.mktemp("smoke")
    _smoke_config(ref_dir)
    _smoke_config(workdir)
    _life("smoke", workdir, SMOKE_MOMENTS, SEED + 3, _uninterrupted(ref_dir), record_property)
