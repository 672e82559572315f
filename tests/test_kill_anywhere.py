"""Kill anywhere: Snakemake and its jobs killed at random moments, the same
command run again after each kill until it completes, and nothing lost or counted twice.

A tiny own-data workflow on scikit-learn's digits runs the smoke workflow's chain of
rules (data, fid_reference, train, evaluate, privacy_summary, release_manifest, table1,
reproduction) for a DP experiment and a non-private one, in about a minute. The
non-private training writes its private workspace under the results folder, where
``release_manifest``, whose inputs are the DP files only, may run beside it: a race
this test looks for. Whether they overlap is Snakemake's choice (it trained the non-private
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
Table 1, 3 and 6 row and every study, 76 jobs) at ``n`` moments in one reproducible
life, with the same aims and checks, against an uninterrupted run of it (20 moments: 20 min
on 2 cores in all; skipped unless set).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import killing
import pytest
import yaml
from helpers import write_digits_npz
from killing import BIN, CONFIG, SIGNALS, Reference

pytestmark = pytest.mark.slow  # whole workflows (docs/TESTING.md)

DIGITS = [str(d) for d in range(10)]
#: The own-data workflow's experiments.
DP, NONPRIVATE = "digits_dp", "digits_nonprivate"
MOMENTS = int(os.environ.get("DPSINKHORN_KILL_MOMENTS", "10"))
SMOKE_MOMENTS = int(os.environ.get("DPSINKHORN_KILL_SMOKE", "0"))
SEED = int(os.environ.get("DPSINKHORN_KILL_SEED", str(random.SystemRandom().randrange(10**6))))


def _config(workdir: Path, reproducible: bool, npz: Path | None = None) -> Path:
    """The life's config; ``npz``: the digits of another life (the same prepared folder)."""
    npz = npz or write_digits_npz(workdir / "digits.npz")
    config = {
        "run_name": "ka",
        "data_dir": "data",
        "device": "cpu",
        "seeds": [0],
        "datasets": {
            "digits": {"path": str(npz), "classes": DIGITS, "image_size": 28, "resize": True}
        },
        "evaluation": {
            "num_samples": 20,
            "fid_reference_size": 20,
            "fid_sqrtm": "eigh",
            "classifiers": ["logreg"],
            "logreg_max_iter": 50,
            "max_epochs": 1,
            "patience": 1,
            "batch_size": 128,
        },
        "training_defaults": {
            "steps": 20,
            "checkpoint_every": 5,
            "log_every": 5,
            "batch_size": 50,
            "channels": [8, 4, 2],
            "reproducible": reproducible,
        },
        # A real-data row is left out: its evaluation (Inception) costs as much as a
        # training's, and no training or ledger of it can be lost.
        "experiments": {
            DP: {"dataset": "digits", "table1_row": "paper", "sigma": 1.5},
            NONPRIVATE: {"dataset": "digits", "table1_row": "nonprivate", "method": "sinkhorn"},
        },
    }
    path = workdir / CONFIG
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    """An uninterrupted run of the own-data workflow's reproducible life."""
    workdir = tmp_path_factory.mktemp("reference")
    _config(workdir, reproducible=True)
    return killing.uninterrupted(workdir)


def _life(name: str, workdir: Path, moments: int, seed: int, ref: Reference, record_property):
    """Kills the workflow of ``workdir``'s config at ``moments`` moments until a rerun
    completes, checks what it left (against ``ref``'s files if its noise key is public),
    prints and records the figure; fails on any problem."""
    figure = killing.killed_life(workdir, moments, ref, random.Random(seed))
    note = f"{seed}; DPSINKHORN_KILL_SEED={SEED}"
    problems, text = killing.verdict(name, workdir, figure, ref, note, moments)
    print(f"\n{text}")
    record_property("kill_anywhere", text)
    killing.check_life(figure, moments, problems, text)


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
        done = subprocess.run(
            [*command, "--out", "timed"], cwd=ref, env=killing.env(ref), stdout=log
        )
    assert done.returncode == 0
    release_s = time.monotonic() - start
    outcomes, stale = [], []
    for i in range(max(MOMENTS // 2, 6)):
        out = ref / f"published{i}"
        delay, how = rng.uniform(0, release_s * 1.2), rng.choice(SIGNALS)
        proc = subprocess.Popen(
            [*command, "--out", out.name],
            cwd=ref,
            env=killing.env(ref),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            killing.kill(proc, how)
        got = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        state = "new" if got == whole else "old" if not got else f"mix {sorted(got)}"
        outcomes.append((round(delay, 2), how, state))
        stale += [p.name for p in ref.glob(f".{out.name}.tmp-*")]
        assert not state.startswith("mix"), (f"seed {seed}", outcomes)
        if state == "old":  # run again: it completes
            again = subprocess.run(
                [*command, "--out", out.name],
                cwd=ref,
                env=killing.env(ref),
                capture_output=True,
                text=True,
            )
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
    killing.smoke_config(ref_dir)
    killing.smoke_config(workdir)
    _life(
        "smoke", workdir, SMOKE_MOMENTS, SEED + 3, killing.uninterrupted(ref_dir), record_property
    )
