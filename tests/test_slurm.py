"""Live SLURM test: the workflow through profiles/slurm on a real (single-node) cluster.

Run by ``make test-slurm`` (tests/slurm/run_live_cluster.sh), which installs SLURM,
starts a cluster on this machine (tests/slurm/cluster.sh), sets SLURM_CONF and
DPSINKHORN_SLURM=1, and stops the cluster afterwards. Without it only the profile check runs.

One Snakemake run (config/slurm_test.yaml: the MNIST rows of Table 1 at smoke sizes,
one classifier, plus ``mnist_long``) with ``--profile profiles/slurm --profile
tests/slurm/profile``. The overlay only changes what a cluster without accounting and
a test in minutes need: status from squeue, and training jobs limited to 2 minutes with
SLURM's SIGTERM 60 s before the limit (production: 5 min). ``mnist_long`` is preempted
once (``scontrol requeue``, as PreemptMode=REQUEUE does) and needs more than one 2-minute
job: each time it checkpoints, and the requeued job or the retry resumes it. The result
must equal, bit for bit, an uninterrupted local training.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import shared_config_overrides

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config" / "slurm_test.yaml"
PROFILES = [REPO / "profiles" / "slurm", REPO / "tests" / "slurm" / "profile"]
BIN = Path(sys.executable).parent
RUN = "results/slurm_test"
LONG = "mnist_long"
TARGETS = [f"{RUN}/tables/table1.csv", f"{RUN}/{LONG}/generator.pt"]
# One GPU each. "eval": the group job of one experiment's sample, fid and classify steps
# (workflow/rules/evaluate.smk), named eval_<exp>_<its rules> in the job's comment.
SLURM_RULES = {"train", "fid_reference", "eval"}
LOCAL_RULES = {"data", "sample_real", "table1"}


def snakemake_command(workdir: Path, *args: str) -> tuple[list[str], dict]:
    """The repo's workflow with the slurm profiles, run in ``workdir``, inside this venv."""
    overrides = shared_config_overrides()
    cmd = [str(BIN / "snakemake"), *args, "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    for profile in PROFILES:
        cmd += ["--profile", str(profile)]
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


class Preemption:
    """Requeues the first job of mnist_long once it has trained 100 steps, as a preemption
    with PreemptMode=REQUEUE would, and reads the step its checkpoint was taken at."""

    def __init__(self, workdir: Path):
        self.log = workdir / RUN / "logs" / f"train_{LONG}.log"
        self.job: str | None = None
        self.step: int | None = None

    def poll(self) -> None:
        if self.job is None:
            running = [
                j
                for j in slurm_jobs()
                if j["Comment"] == f"rule_train_wildcards_{LONG}" and j["JobState"] == "RUNNING"
            ]
            text = self.log.read_text() if running and self.log.exists() else ""
            steps = re.findall(r"(\d+)/\d+ \[", text)
            if steps and int(steps[-1]) >= 100:
                self.job = running[0]["JobId"]
                subprocess.run(["scontrol", "requeue", self.job], check=True)
        elif self.step is None:  # the log is rewritten when the job starts again
            stop = re.search(r"signal 15: checkpoint at step (\d+)", self.log.read_text())
            self.step = int(stop.group(1)) if stop else None


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> SimpleNamespace:
    if os.environ.get("DPSINKHORN_SLURM") != "1":
        pytest.skip("needs the live test cluster: make test-slurm (sets DPSINKHORN_SLURM=1)")
    workdir = tmp_path_factory.mktemp("slurm")
    cmd, env = snakemake_command(workdir, *TARGETS)
    start, preemption = time.monotonic(), Preemption(workdir)
    with open(workdir / "snakemake.out", "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            while proc.poll() is None:
                assert time.monotonic() - start < 1500, "the workflow took over 25 min"
                preemption.poll()
                time.sleep(2)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # Snakemake cancels its jobs
                proc.wait(timeout=120)
    output = (workdir / "snakemake.out").read_text()
    assert proc.returncode == 0, output[-10000:]
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    jobs = [j for j in slurm_jobs() if j["JobName"] == run_id]
    for job in jobs:
        rule = re.match(r"rule_([a-z_0-9]+?)(_wildcards_|$)", job["Comment"]).group(1)
        job["Rule"] = "eval" if rule.startswith("eval_") else rule
    print(f"\nworkflow through SLURM: {time.monotonic() - start:.0f} s, {len(jobs)} jobs")
    return SimpleNamespace(
        workdir=workdir, results=workdir / RUN, output=output, jobs=jobs, preemption=preemption
    )


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
    assert rules == SLURM_RULES  # data, sample_real and table1 are local rules
    assert not rules & LOCAL_RULES
    # one evaluation job per Table 1 experiment (its FID needs the GPU; Log-Reg runs beside)
    experiments = yaml.safe_load(CONFIG.read_text())["experiments"].values()
    rows = [e for e in experiments if "table1_row" in e]
    assert sum(job["Rule"] == "eval" for job in run.jobs) == len(rows)
    for job in run.jobs:
        assert job["TresPerJob"] == "gres:gpu:1", job
        assert job["JOB_GRES"] == "gpu:1", job  # allocated, not only asked for
    done = [j for j in run.jobs if j["JobState"] == "COMPLETED"]
    assert len(done) == len(run.jobs) - len(failed_long_jobs(run))


def long_jobs(run) -> list[dict]:
    return [j for j in run.jobs if j["Comment"] == f"rule_train_wildcards_{LONG}"]


def failed_long_jobs(run) -> list[dict]:
    return [j for j in long_jobs(run) if j["JobState"] != "COMPLETED"]


def test_preempted_and_time_limited_training_checkpoints_and_resumes(run):
    """mnist_long: requeued once (preemption), then every job but the last got SIGTERM
    before its time limit; each time it checkpointed, and the next run resumed."""
    jobs = long_jobs(run)
    spec = yaml.safe_load(CONFIG.read_text())["experiments"][LONG]
    requeued, at = run.preemption.job, run.preemption.step
    # Checkpoints written on the signal (not at a multiple of checkpoint_every).
    stops = [int(s) for s in re.findall(r"signal 15: checkpoint at step (\d+)", run.output)]
    report = f"job {requeued} requeued at step {at}; " + ", ".join(
        f"job {j['JobId']} {j['JobState']} after {j['RunTime']}"
        + (f" at step {stops[i]}" if i < len(stops) else "")
        for i, j in enumerate(jobs)
    )
    print(f"\n{LONG} ({spec['steps']} steps, limit {jobs[0]['TimeLimit']}): {report}")
    assert requeued == jobs[0]["JobId"] and jobs[0]["Restarts"] == "1", report
    assert all(j["Restarts"] == "0" for j in jobs[1:]), report
    assert len(jobs) >= 2, report
    assert [j["JobState"] for j in jobs] == ["FAILED"] * (len(jobs) - 1) + ["COMPLETED"]
    stops = [at, *stops]
    # Progress is never lost: every resume starts where the last job stopped. One job may
    # finish training just as its signal arrives and fail without a checkpoint message;
    # the next one then finds the final checkpoint and only writes the outputs.
    finished_then_signalled = len(jobs) - len(stops)
    assert finished_then_signalled in (0, 1) and stops == sorted(set(stops)), stops
    assert all(0 < s < spec["steps"] and s % spec["checkpoint_every"] for s in stops), stops
    for job in jobs[:-1]:
        # before the limit: not killed by it
        assert seconds(job["RunTime"]) < seconds(job["TimeLimit"]), job
    assert sum(j["ExitCode"] == "1:0" for j in jobs[:-1]) >= len(jobs) - 1 - finished_then_signalled
    exits_75 = run.output.count("returned non-zero exit status 75")
    assert exits_75 == len(jobs) - 1 - finished_then_signalled
    privacy = json.loads((run.results / LONG / "privacy.json").read_text())
    assert privacy["steps"] == spec["steps"]
    ckpt = run.results / LONG / "private_workspace" / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == spec["steps"]  # kept: keep_private_workspace in slurm_test.yaml
    # train_log.csv: elapsed_s restarts with every process that trained.
    with open(run.results / LONG / "train_log.csv", newline="") as fh:
        log = list(csv.DictReader(fh))
    elapsed = [float(row["elapsed_s"]) for row in log]
    restarts = sum(b < a for a, b in itertools.pairwise(elapsed))
    assert restarts == len(stops)
    assert int(log[-1]["step"]) == spec["steps"]


def test_resumed_generator_equals_an_uninterrupted_run(run, tmp_path):
    import torch

    out = tmp_path / LONG
    # The jobs ran with OMP_NUM_THREADS = the rule's threads (Snakemake sets it; the overlay
    # caps threads): the same here, as float sums depend on the number of threads.
    threads = yaml.safe_load((PROFILES[1] / "config.v8+.yaml").read_text())["max-threads"]
    subprocess.run(
        [str(BIN / "dpsinkhorn"), "train", "--config", str(CONFIG), "--experiment", LONG]
        + ["--out", str(out), "--data-dir", str(run.workdir / "data"), "--no-progress"],
        check=True,
        capture_output=True,
        cwd=run.workdir,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        timeout=900,
    )
    resumed = torch.load(run.results / LONG / "generator.pt", weights_only=False)
    straight = torch.load(out / "generator.pt", weights_only=False)
    assert resumed["state_dict"].keys() == straight["state_dict"].keys()
    for name, tensor in straight["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    for name in ("privacy.json",):
        assert (run.results / LONG / name).read_text() == (out / name).read_text()


def test_profiles_agree_on_everything_but_the_time_limit():
    """The overlay changes the training's runtime and signal lead, nothing else of a rule."""
    slurm, overlay = (yaml.safe_load((p / "config.v8+.yaml").read_text()) for p in PROFILES)
    assert set(overlay["set-resources"]) == set(slurm["set-resources"]) == {"train"}
    assert overlay["set-resources"]["train"]["runtime"] == 2
    lead = r"'--signal=TERM@(\d+)'"
    assert re.fullmatch(lead, slurm["set-resources"]["train"]["slurm_extra"])
    assert re.fullmatch(lead, overlay["set-resources"]["train"]["slurm_extra"])


def test_finished_workflow_has_nothing_to_do(run):
    cmd, env = snakemake_command(run.workdir, "-n", *TARGETS)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Nothing to be done" in result.stdout + result.stderr
