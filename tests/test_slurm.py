"""Live SLURM test: the workflow through profiles/slurm on a real (single-node) cluster.

Run by ``make test-slurm`` (tests/slurm/run_live_cluster.sh), which installs SLURM,
starts a cluster on this machine (tests/slurm/cluster.sh), sets SLURM_CONF and
DPSINKHORN_SLURM=1, and stops the cluster afterwards. Without it only the profile check runs.

The cluster enforces its partitions' limits at submission (EnforcePartLimits=ALL). One
Snakemake run (config/slurm_test.yaml: the MNIST rows of Table 1 at smoke sizes, one
classifier, plus ``mnist_long``) with ``--profile profiles/slurm --profile
tests/slurm/profile`` on the default partition ``short`` (MaxTime 6 min). The overlay only
reads status from squeue and caps threads; every job asks for what production code
computes: config/slurm_test.yaml's ``cluster:`` section caps requests at 6 min, and the
SIGTERM comes 5 min before the limit (profiles/slurm). ``mnist_long`` asks for the cap
(its measured CPU rate says it needs longer), is preempted once (``scontrol requeue``, as
PreemptMode=REQUEUE does) and runs as a chain of jobs: each time it checkpoints, and the
requeued job or the retry resumes it. The result must equal, bit for bit, an
uninterrupted local training. Each experiment's evaluation must run as one job.

Apart from that, every SLURM job of config/config.yaml, as the plugin submits it with
profiles/slurm, must be accepted by the partition ``long48`` (MaxTime 48 h, DOWN: nothing
starts): the paper's workflow runs twice against it with stand-in files, once with only the
data present (every training, FID reference and gradient study is submitted) and once with
everything but the evaluation present (every evaluation group), and its jobs are cancelled.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import (
    listed_outputs,
    require_shared,
    shared_config_overrides,
    shared_path,
    without_log_hash,
)

from dpsinkhorn.config import (
    cluster,
    experiment,
    experiment_home,
    load_config,
    trained_experiments,
)
from dpsinkhorn.privacy.trainings import read as read_record
from dpsinkhorn.privacy.trainings import trainings as trainings_of

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config" / "slurm_test.yaml"
PROFILES = [REPO / "profiles" / "slurm", REPO / "tests" / "slurm" / "profile"]
BIN = Path(sys.executable).parent
RUN = "results/slurm_test"
LONG = "mnist_long"
TARGETS = [f"{RUN}/tables/table1.csv", f"{RUN}/{LONG}/generator.pt"]
# One GPU each. "eval": an experiment's evaluation job, rule evaluate_<exp>
# (workflow/rules/evaluate.smk: samples, FID and classifiers of every seed in one process).
SLURM_RULES = {"train", "fid_reference", "eval"}
LOCAL_RULES = {"data", "table1"}
#: The fixture fails the workflow after this long (s). Beside `make test` (.ci/run) it takes
#: 10-20 min: its jobs wait for the 2-CPU node's two slots; .ci/run runs `make test` at
#: nice 10, so that a job gets the CPUs first (at equal priority, it ran out of this time).
WORKFLOW_LIMIT_S = 2400
#: SLURM comment of mnist_long's training jobs: the plugin writes rule_<rule>_wildcards_ and
#: the wildcards joined by "_" ("/" as "_"): home "" (a DP release), then exp.
LONG_COMMENT = f"rule_train_wildcards__{LONG}"


def trained_experiment(comment: str) -> str:
    """The experiment of a train job's comment (home "" or "nonprivate/", then exp)."""
    return comment.removeprefix("rule_train_wildcards_").removeprefix("nonprivate_")[1:]


def snakemake_command(workdir: Path, *args: str) -> tuple[list[str], dict]:
    """The repo's workflow with the slurm profiles, run in ``workdir``, inside this venv."""
    overrides = shared_config_overrides()
    cmd = [str(BIN / "snakemake"), *args, "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    for profile in PROFILES:
        cmd += ["--profile", str(profile)]
    # one CPU per job (threads: max-threads in the overlay; an evaluation group's steps one
    # after another, not side by side): two jobs share the 2-CPU node. (On the command
    # line: profiles/default, the workflow profile, would replace a profile's cores.)
    cmd += ["--cores", "1"]
    cmd += ["--configfile", str(CONFIG), *(["--config", *overrides] if overrides else [])]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return cmd, env


def slurm_jobs() -> list[dict]:
    """Every job that slurmctld knows (finished ones for MinJobAge=600 s), by id."""
    out = subprocess.run(
        ["scontrol", "-o", "-d", "show", "job"], capture_output=True, text=True, check=True
    ).stdout
    jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines()]
    return sorted((j for j in jobs if "JobId" in j), key=lambda j: int(j["JobId"]))


def seconds(duration: str) -> int:
    """SLURM's [D-]HH:MM:SS as seconds."""
    days, _, hms = duration.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def started(job: dict) -> float:
    """A job's (last) StartTime, in seconds since the epoch (scontrol prints local time)."""
    return time.mktime(time.strptime(job["StartTime"], "%Y-%m-%dT%H:%M:%S"))


class Preemption:
    """Requeues mnist_long's job once it is training past step 100, as a preemption with
    PreemptMode=REQUEUE would, and reads the step its checkpoint was taken at.

    Under load the first jobs may get their signal before step 100 (or before training
    starts), so it is the first job seen training past it: its log was written since the job
    started (not the previous job's log, which stays until the new job rewrites it), shows
    steps taken (the signal handler is in place) and no checkpoint yet."""

    def __init__(self, workdir: Path):
        self.log = workdir / RUN / "logs" / f"train_{LONG}.log"
        self.job: str | None = None
        self.step: int | None = None

    def poll(self) -> None:
        if self.job is None:
            try:
                jobs = slurm_jobs()
            except subprocess.CalledProcessError:  # slurmctld did not answer: next poll
                return
            running = [
                j for j in jobs if j["Comment"] == LONG_COMMENT and j["JobState"] == "RUNNING"
            ]
            if not running or not self.log.exists():
                return
            written, text = self.log.stat().st_mtime, self.log.read_text()
            steps = [int(s) for s in re.findall(r"(\d+)/\d+ \[", text)]
            fresh = written > started(running[0]) + 1 and "checkpoint at step" not in text
            if fresh and len(steps) > 1 and steps[-1] > steps[0] and steps[-1] >= 100:
                self.job = running[0]["JobId"]
                subprocess.run(["scontrol", "requeue", self.job], check=True)
        elif self.step is None:  # the log is rewritten when the job starts again
            stop = re.search(r"signal 15: checkpoint at step (\d+)", self.log.read_text())
            self.step = int(stop.group(1)) if stop else None


def progress(workdir: Path, preemption: Preemption) -> str:
    """What a workflow that ran too long had done: SLURM jobs per rule, each training's
    signal stops, the preemption, and the end of Snakemake's output."""
    text = (workdir / "snakemake.out").read_text()
    submitted = re.findall(r"rule_(\w+?)/\S*\.log\)", text)
    jobs = ", ".join(f"{rule} {submitted.count(rule)}" for rule in sorted(set(submitted)))
    stops: dict[str, list[str]] = {}
    for step, exp in re.findall(rf"checkpoint at step (\d+) in {RUN}/(\S+)/private", text):
        stops.setdefault(exp, []).append(step)
    chains = "; ".join(f"{exp} stopped at {', '.join(at)}" for exp, at in stops.items())
    return (
        f"SLURM jobs submitted: {jobs or 'none'}; {chains or 'no training stopped'}; "
        f"{LONG} requeued at step {preemption.step} (job {preemption.job}); "
        f"last output:\n{text[-3000:]}"
    )


def stop_workflow(proc: subprocess.Popen) -> None:
    """Stops a Snakemake still running: SIGINT (it cancels its SLURM jobs), then, after
    two minutes, SIGKILL and every job of the test cluster cancelled."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        subprocess.run(["scancel", "--user", str(os.getuid())], check=False)


def start_straight_run(out: Path) -> subprocess.Popen:
    """mnist_long trained in one process, outside SLURM, into ``out/mnist_long``, on data
    prepared into ``out/data`` from the same mirror (the same bytes as the workflow's; its
    own training record). It runs beside the workflow, whose jobs leave the 2 CPUs idle
    while they wait on the scheduler; test_resumed_generator_equals_an_uninterrupted_run
    compares its generator with the workflow's chain of jobs."""
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    # The jobs ran with OMP_NUM_THREADS = the rule's threads (Snakemake sets it; the overlay
    # caps threads): the same here, as float sums depend on the number of threads.
    threads = yaml.safe_load((PROFILES[1] / "config.v8+.yaml").read_text())["max-threads"]
    dpsinkhorn = str(BIN / "dpsinkhorn")
    prepare = [dpsinkhorn, "data", "--dataset", "mnist", "--root", str(out / "data")]
    train = [dpsinkhorn, "train", "--config", str(CONFIG), "--experiment", LONG]
    train += ["--out", str(out / LONG), "--data-dir", str(out / "data"), "--no-progress"]
    script = f"{shlex.join([*prepare, '--mirror', str(mirror)])} && {shlex.join(train)}"
    return subprocess.Popen(
        ["bash", "-c", script],
        stdout=open(out / "straight.out", "w"),  # noqa: SIM115 (the process owns it)
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=out,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[SimpleNamespace]:
    if os.environ.get("DPSINKHORN_SLURM") != "1":
        pytest.skip("needs the live test cluster: make test-slurm (sets DPSINKHORN_SLURM=1)")
    workdir = tmp_path_factory.mktemp("slurm")
    straight_dir = tmp_path_factory.mktemp("straight")
    straight = start_straight_run(straight_dir)
    try:
        cmd, env = snakemake_command(workdir, *TARGETS)
        start, preemption = time.monotonic(), Preemption(workdir)
        with open(workdir / "snakemake.out", "w") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            try:
                while proc.poll() is None:
                    if time.monotonic() - start > WORKFLOW_LIMIT_S:
                        pytest.fail(
                            f"the workflow ran over {WORKFLOW_LIMIT_S} s: "
                            + progress(workdir, preemption)
                        )
                    preemption.poll()
                    time.sleep(2)
            finally:
                stop_workflow(proc)
        output = (workdir / "snakemake.out").read_text()
        assert proc.returncode == 0, output[-10000:]
        run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
        jobs = [j for j in slurm_jobs() if j["JobName"] == run_id]
        for job in jobs:
            rule = re.match(r"rule_([a-z_0-9]+?)(_wildcards_|$)", job["Comment"]).group(1)
            job["Rule"] = "eval" if rule.startswith("evaluate_") else rule
        print(f"\nworkflow through SLURM: {time.monotonic() - start:.0f} s, {len(jobs)} jobs")
        yield SimpleNamespace(
            workdir=workdir,
            results=workdir / RUN,
            output=output,
            jobs=jobs,
            preemption=preemption,
            straight=SimpleNamespace(proc=straight, out=straight_dir),
        )
    finally:
        straight.kill()  # finished, unless the workflow or a test failed first


def test_table1_is_complete(run):
    with open(run.results / "tables" / "table1.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["dataset"] == "mnist"]
    ours = [r for r in rows if r["source"] == "this run"]
    assert [r["method"] for r in ours] == [
        "Real data",
        "Non-private Sinkhorn",
        "DP-Sinkhorn (paper setting)",
        "DP-Sinkhorn (sound ε=10)",
    ]
    assert len(rows) > len(ours)  # the published baselines
    for row in ours:
        assert 0 < float(row["fid"]) < math.inf
        assert 0 <= float(row["acc_logreg"]) <= 100


def test_network_steps_ran_as_slurm_jobs_with_one_gpu_each(run):
    rules = {job["Rule"] for job in run.jobs}
    assert rules == SLURM_RULES  # data and table1 are local rules
    assert not rules & LOCAL_RULES
    # one evaluation job per Table 1 experiment
    experiments = yaml.safe_load(CONFIG.read_text())["experiments"].values()
    rows = [e for e in experiments if "table1_row" in e]
    assert sum(job["Rule"] == "eval" for job in run.jobs) == len(rows)
    for job in run.jobs:
        assert job["TresPerJob"] == "gres:gpu:1", job
        assert job["JOB_GRES"] == "gpu:1", job  # allocated, not only asked for
    # Only trainings fail: each failed job got SIGTERM before it finished (it comes 5 min
    # before the 6-minute limit: under load even a 20-step training may get it), and each
    # training's last job completed (training_chain says how each failed job ended).
    trainings: dict[str, list[dict]] = {}
    for job in run.jobs:
        if job["Rule"] == "train":
            trainings.setdefault(job["Comment"], []).append(job)
        else:
            assert job["JobState"] == "COMPLETED", job
    config = load_config([CONFIG])
    assert {trained_experiment(c) for c in trainings} == set(trained_experiments(config)), sorted(
        trainings
    )
    for comment, jobs in trainings.items():
        exp = trained_experiment(comment)
        if exp != LONG:  # (mnist_long, requeued too: test_preempted_and_time_limited_...)
            assert_chain(run, exp, jobs, experiment(config, exp)["steps"])


def test_every_training_drew_its_noise_once(run):
    """The training record (privacy.trainings, beside the prepared data): one training per
    experiment however many jobs it took, each finished with one generator. A retry after a
    signal resumes the same training; one that finds the final checkpoint rewrites the same
    generator (the same content hash), it never trains again."""
    (record,) = (run.workdir / "data" / "trainings").glob("*.jsonl")
    events = read_record(record)
    per_experiment = Counter(t["experiment"] for t in trainings_of(events))
    assert per_experiment == Counter(trained_experiments(load_config([CONFIG]))), per_experiment
    for training in {e["training"] for e in events}:
        finished = [e for e in events if e["training"] == training and e["event"] == "finished"]
        hashes = {e["content_sha256"] for e in finished}
        assert len(hashes) == 1, (training, hashes)


def long_jobs(run) -> list[dict]:
    return [j for j in run.jobs if j["Comment"] == LONG_COMMENT]


@dataclass(frozen=True)
class Outcome:
    """How a failed training job ended, from what Snakemake printed when it failed."""

    checkpoint: int | None  # the step of the checkpoint written on the signal
    exit_75: bool  # `dpsinkhorn train` exited 75: checkpointed, rerun to resume
    steps_shown: tuple[int, ...]  # its progress bar's steps: the step it started at, then on

    def kind(self, total: int, resumed_from: int) -> str:
        """``checkpointed`` on the signal (exit 75); ``finished``: trained to the end as the
        signal came (SLURM cancels the job step while Snakemake stores the outputs; the
        retry finds the final checkpoint); ``no step taken``: the signal came while the job
        started, before the training's handler was in place (SLURM may send it up to a
        minute early), so it died of it having trained nothing (an empty log, or only the
        step it would have resumed from); else ``unexplained``."""
        if self.checkpoint is not None and self.exit_75:
            return "checkpointed"
        if self.checkpoint is None and not self.exit_75:
            if self.steps_shown and self.steps_shown[-1] == total:
                return "finished"
            if set(self.steps_shown) <= {resumed_from}:
                return "no step taken"
        return "unexplained"


def failed_training_jobs(run, exp: str, total: int) -> dict[str, Outcome]:
    """Each failed SLURM job of ``exp``'s training (``total`` steps), by job id, read from
    Snakemake's error block for it: from "SLURM-job 'N' failed" to the next failure or
    restart; it holds the job's shell command, its training log and its job log."""
    text = run.output
    ends = [m.start() for m in re.finditer(r"SLURM-job '\d+' failed|Trying to restart job", text)]
    outcomes = {}
    for failure in re.finditer(r"SLURM-job '(\d+)' failed", text):
        end = next((e for e in ends if e > failure.start()), len(text))
        block = text[failure.start() : end]
        command = re.search(r"--experiment (\S+)", block)
        if command is None or command.group(1) != exp:
            continue
        stop = re.search(r"signal 15: checkpoint at step (\d+) in ", block)
        outcomes[failure.group(1)] = Outcome(
            checkpoint=int(stop.group(1)) if stop else None,
            exit_75="returned non-zero exit status 75" in block,
            steps_shown=tuple(int(s) for s in re.findall(rf"(\d+)/{total} \[", block)),
        )
    return outcomes


def training_chain(
    run, exp: str, jobs: list[dict], total: int, requeue: tuple[str, int] | None = None
) -> tuple[list[int], dict[str, str]]:
    """``exp``'s training jobs in order: the steps its stops checkpointed at, and how each
    failed job ended (``Outcome.kind``, by job id). ``requeue``: the (job id, step) of a
    job requeued while it trained, which checkpointed at that step and ran again."""
    outcomes = failed_training_jobs(run, exp, total)
    stops: list[int] = []
    kinds: dict[str, str] = {}
    resumed_from = 0
    for job in jobs:
        if requeue is not None and job["JobId"] == requeue[0]:
            stops.append(requeue[1])
            resumed_from = requeue[1]
        if job["JobState"] != "FAILED":
            continue
        outcome = outcomes.get(job["JobId"])
        kinds[job["JobId"]] = outcome.kind(total, resumed_from) if outcome else "not printed"
        if kinds[job["JobId"]] == "checkpointed":
            stops.append(outcome.checkpoint)
            resumed_from = outcome.checkpoint
    return stops, kinds


def assert_chain(
    run, exp: str, jobs: list[dict], total: int, requeue: tuple[str, int] | None = None
) -> tuple[list[int], dict[str, str]]:
    """``exp``'s jobs (a ``total``-step training): every job but the last failed, and the
    last completed. Each failed job checkpointed on its signal, or died of it before it
    took a step, or (at most one: the last that failed) finished as it came. No progress
    was lost: the stops only go forward. Returns ``training_chain``'s stops and kinds."""
    stops, kinds = training_chain(run, exp, jobs, total, requeue)
    states = [j["JobState"] for j in jobs]
    report = (exp, states, kinds, stops)
    assert states == ["FAILED"] * (len(jobs) - 1) + ["COMPLETED"], report
    assert set(kinds.values()) <= {"checkpointed", "no step taken", "finished"}, report
    finished = [job for job, kind in kinds.items() if kind == "finished"]
    assert not finished or finished == [jobs[-2]["JobId"]], report
    assert stops == sorted(set(stops)) and all(0 < stop < total for stop in stops), report
    return stops, kinds


def test_preempted_and_time_limited_training_checkpoints_and_resumes(run):
    """mnist_long: one job requeued while it trained (preemption), and every job but the
    last got SIGTERM before its time limit; each time it checkpointed (or had not yet
    taken a step), and the next run resumed where the last one stopped."""
    jobs = long_jobs(run)
    spec = experiment(load_config([CONFIG]), LONG)
    total = spec["steps"]
    requeue = run.preemption.job, run.preemption.step
    stops, kinds = training_chain(run, LONG, jobs, total, requeue)
    report = f"job {requeue[0]} requeued at step {requeue[1]}; stops at {stops}; " + ", ".join(
        f"job {j['JobId']} {j['JobState']} after {j['RunTime']} {kinds.get(j['JobId'], '')}"
        for j in jobs
    )
    print(f"\n{LONG} ({total} steps, limit {jobs[0]['TimeLimit']}): {report}")
    # the request production code computes (the cap: its measured rate says it needs
    # longer), on the partition that enforces its MaxTime
    request = cluster.Requests(load_config([CONFIG]), [REPO])(LONG)
    assert all(seconds(j["TimeLimit"]) == 60 * request.minutes for j in jobs), report
    assert {j["Partition"] for j in run.jobs} == {"short"}
    assert all(seconds(j["TimeLimit"]) <= 60 * request.minutes for j in run.jobs)
    # Requeued once (the job ran again, under the same id), after its checkpoint.
    assert requeue[0] in {j["JobId"] for j in jobs} and requeue[1] is not None, report
    restarts = [j["Restarts"] for j in jobs]
    assert restarts == ["1" if j["JobId"] == requeue[0] else "0" for j in jobs], report
    assert len(jobs) >= 2, report
    assert_chain(run, LONG, jobs, total, requeue)
    for job in jobs[:-1]:
        # before the limit: not killed by it
        assert seconds(job["RunTime"]) < seconds(job["TimeLimit"]), job
        if kinds[job["JobId"]] == "checkpointed":  # its job step's Snakemake exited 1
            assert job["ExitCode"] == "1:0", job
    privacy = json.loads((run.results / LONG / "privacy.json").read_text())
    assert privacy["steps"] == total
    ckpt = run.results / LONG / "private_workspace" / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == total  # kept: keep_private_workspace in slurm_test.yaml
    # train_log.csv: one row every log_every steps, each once, across all the processes
    # (elapsed_s restarts in each; a drop shows only where the row before came later in
    # its process, so there are at most as many drops as stops, and at least one).
    with open(run.results / LONG / "train_log.csv", newline="") as fh:
        log = list(csv.DictReader(fh))
    every = spec["log_every"]
    assert [int(row["step"]) for row in log] == list(range(every, total + 1, every))
    elapsed = [float(row["elapsed_s"]) for row in log]
    assert 1 <= sum(b < a for a, b in itertools.pairwise(elapsed)) <= len(stops), stops


def test_resumed_generator_equals_an_uninterrupted_run(run):
    import torch

    run.straight.proc.wait(timeout=900)  # started beside the workflow (start_straight_run)
    assert run.straight.proc.returncode == 0, (run.straight.out / "straight.out").read_text()
    out = run.straight.out / LONG
    resumed = torch.load(run.results / LONG / "generator.pt", weights_only=False)
    straight = torch.load(out / "generator.pt", weights_only=False)
    assert resumed["state_dict"].keys() == straight["state_dict"].keys()
    for name, tensor in straight["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    # The ledger is the same, less the train log's hash: the log holds wall-clock columns
    # (elapsed_s restarts in every resumed job), so its steps and ε are compared.
    ledgers = [json.loads((d / "privacy.json").read_text()) for d in (run.results / LONG, out)]
    assert without_log_hash(ledgers[0]) == without_log_hash(ledgers[1])
    logs = []
    for d in (run.results / LONG, out):
        with open(d / "train_log.csv", newline="") as fh:
            logs.append([(row["step"], row["epsilon"]) for row in csv.DictReader(fh)])
    assert logs[0] == logs[1]


def test_overlay_changes_no_request_and_requests_fit_the_short_partition():
    """The overlay sets no resources of a rule; the test config caps every request at the
    partition ``short``'s MaxTime, and mnist_long's request is the cap, a chain of jobs."""
    overlay = yaml.safe_load((PROFILES[1] / "config.v8+.yaml").read_text())
    assert not {"set-resources", "default-resources", "resources"} & set(overlay)
    script = (REPO / "tests" / "slurm" / "cluster.sh").read_text()
    short = int(re.search(r"^SHORT_MINUTES=(\d+)$", script, re.M).group(1))
    assert "PartitionName=short Nodes=$node Default=YES MaxTime=$SHORT_MINUTES" in script
    config = load_config([CONFIG])
    assert config["cluster"]["max_job_minutes"] == short
    request = cluster.Requests(config, [REPO])(LONG)
    assert request.estimate_minutes > short and request.minutes == short, request
    assert request.chain_jobs > 1, request


def test_each_experiments_evaluation_ran_as_one_job(run):
    """Samples, FID and classifiers of one experiment: one SLURM job (evaluate_<exp>), whose
    Snakemake ran exactly that rule and whose evaluation log shows every seed's FID and
    classifier result; no other job evaluated anything."""
    config = yaml.safe_load(CONFIG.read_text())
    rows = [n for n, e in config["experiments"].items() if "table1_row" in e]
    evals = [j for j in run.jobs if j["Rule"] == "eval"]
    report = []
    for exp in rows:
        jobs = [j for j in evals if j["Comment"] == f"rule_evaluate_{exp}"]
        assert len(jobs) == 1, (exp, [j["Comment"] for j in evals])
        text = Path(jobs[0]["StdOut"]).read_text()
        assert set(re.findall(r"rule (\w+):", text)) == {f"evaluate_{exp}"}, text[-3000:]
        assert "Finished job" in text, text[-3000:]
        home = experiment_home(load_config([CONFIG]), exp)  # "" or "nonprivate/"
        log_text = (run.results / "logs" / f"{home}evaluate_{exp}.log").read_text()
        assert "FID " in log_text and "logreg accuracy" in log_text, log_text[-2000:]
        report.append(f"{exp}: job {jobs[0]['JobId']}")
    assert len(evals) == len(rows)
    print("\nevaluation, one job per experiment: " + "; ".join(report))


def test_finished_workflow_has_nothing_to_do(run):
    cmd, env = snakemake_command(run.workdir, "-n", *TARGETS)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Nothing to be done" in result.stdout + result.stderr


# ---------------------------------------------- every paper job, accepted by a 48 h partition

PAPER = REPO / "config" / "config.yaml"
LONG48 = "long48"  # tests/slurm/cluster.sh: MaxTime 2-00:00:00, State=DOWN
#: Rules whose outputs exist before the first submission (stand-in files).
UPSTREAM_LOCAL = {"data", "celeba_fixture"}
#: Local rules that read only the trainings' outputs: present in the second round too (on
#: stand-in ledgers privacy_summary would run, and fail, on the login node).
LEDGER_LOCAL = {"privacy_summary"}


def paper_dry_run(workdir: Path) -> list[tuple[str, list[str], str | None]]:
    """(rule, outputs, group) of every job of config/config.yaml through profiles/slurm."""
    cmd = [str(BIN / "snakemake"), "-n", "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    cmd += ["--profile", str(PROFILES[0]), "--configfile", str(PAPER), "--cores", "64"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=True)
    jobs, group = [], None
    for block in re.split(r"\n(?=\[[^\]]+\] Group job | *rule [\w-]+:)", out.stdout):
        header = re.match(r"\[[^\]]+\] Group job (\S+)", block)
        if header:
            group = header.group(1)
            continue
        rule = re.match(r"( *)rule ([\w-]+):", block)
        if rule:
            output = re.search(r"output: (.*)", block)
            files = listed_outputs(output.group(1)) if output else []
            jobs.append((rule.group(2), files, group if rule.group(1) else None))
    return jobs


def submit_paper_jobs(workdir: Path, dag: list, present: set[str]) -> tuple[list, int, str]:
    """Runs the paper's workflow through profiles/slurm on partition long48 in ``workdir``,
    the outputs of the rules ``present`` there already (stand-ins, all with one mtime),
    until all jobs of its first round ("Execute N jobs") are in the queue (or Snakemake
    stops); then cancels them and stops Snakemake. Returns the jobs (scontrol), N and
    Snakemake's output. ``dag``: :func:`paper_dry_run`'s jobs."""
    stamp = time.time() - 3600
    for rule, files, _ in dag:
        for name in files if rule in present else ():
            path = workdir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("stand-in\n")
            os.utime(path, (stamp, stamp))
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    cmd += ["--profile", str(PROFILES[0]), "--configfile", str(PAPER)]
    # the status command only (no accounting database); --cores: a login node's, not this
    # machine's 2 (Snakemake caps a job's CPUs at --cores; docs/CLUSTER.md)
    cmd += ["--slurm-status-command", "squeue", "--cores", "64"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["SBATCH_PARTITION"] = LONG48  # profiles/slurm: slurm_partition
    log = workdir / "snakemake.out"
    start, jobs, run_id, expected = time.monotonic(), [], None, 0
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            while proc.poll() is None and time.monotonic() - start < 240:
                text = log.read_text()
                found = re.search(r"SLURM run ID: (\S+)", text)
                run_id = found.group(1) if found else None
                found = re.search(r"Execute (\d+) jobs", text)
                expected = int(found.group(1)) if found else 0
                jobs = [j for j in slurm_jobs() if run_id and j["JobName"] == run_id]
                if expected and len(jobs) >= expected:
                    time.sleep(3)  # anything more would come now
                    jobs = [j for j in slurm_jobs() if j["JobName"] == run_id]
                    break
                time.sleep(1)
        finally:
            # Snakemake interrupted waits for its jobs (the plugin does not cancel them):
            # cancel them (its run ID is their name), then stop it.
            if run_id:
                subprocess.run(["scancel", "--name", run_id], check=False)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return jobs, expected, log.read_text()


def test_every_paper_job_is_accepted_by_a_48h_partition(tmp_path):
    if os.environ.get("DPSINKHORN_SLURM") != "1":
        pytest.skip("needs the live test cluster: make test-slurm (sets DPSINKHORN_SLURM=1)")
    start = time.monotonic()
    dag = paper_dry_run(tmp_path / "dag")
    local = set(
        re.findall(
            r"(\w+),", (REPO / "Snakefile").read_text().split("localrules:")[1].split("\n\n")[0]
        )
    )
    groups = {g for rule, _, g in dag if g}
    singles = [rule for rule, _, g in dag if not g and rule not in local]
    assert not groups  # each experiment's evaluation is one rule, evaluate_<exp>
    assert sum(r.startswith("evaluate_") for r in singles) == len(
        load_config([PAPER])["experiments"]
    )
    # 1: the data present: every training and FID reference is submitted
    first, n1, out1 = submit_paper_jobs(tmp_path / "first", dag, UPSTREAM_LOCAL)
    # 2: all but the evaluation, what follows it and what 1 did not submit (the gradient
    # studies, which read a generator) present: the rest, every evaluation group included
    done = {re.match(r"rule_(\w+?)_wildcards_", j["Comment"]).group(1) for j in first}
    present = UPSTREAM_LOCAL | LEDGER_LOCAL | done
    second, n2, out2 = submit_paper_jobs(tmp_path / "second", dag, present)
    submitted = first + second
    rejected = [
        line
        for line in (out1 + out2).splitlines()
        if re.search(r"submission failed|sbatch: error|Error submitting", line, re.I)
    ]
    limits = sorted({j["TimeLimit"] for j in submitted}, key=seconds)
    print(
        f"\nconfig/config.yaml on partition {LONG48}: {len(submitted)} of "
        f"{len(singles) + len(groups)} SLURM jobs submitted and accepted "
        f"({len(first)} with the data present, {len(second)} with the trainings'), {len(rejected)} "
        f"refused, time limits {limits[0]} - {limits[-1]}, "
        f"{time.monotonic() - start:.0f} s"
    )
    assert not rejected, rejected[:10]
    assert (len(first), len(second)) == (n1, n2), (out1 + out2)[-5000:]
    assert len(submitted) == len(singles) + len(groups), (out1 + out2)[-5000:]
    kinds = [re.match(r"rule_([\w-]+?)(_wildcards_|$)", j["Comment"]).group(1) for j in submitted]
    assert sorted(kinds) == sorted(singles)
    for job in submitted:
        assert job["Partition"] == LONG48 and job["JobState"] in ("PENDING", "CANCELLED"), job
        assert 0 < seconds(job["TimeLimit"]) <= 48 * 3600, job
