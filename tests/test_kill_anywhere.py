"""Kill anywhere (issue 36): Snakemake and its jobs killed at random moments, the same
command run again after each kill until it completes, and nothing lost or counted twice.

A tiny own-data workflow on scikit-learn's digits runs the smoke workflow's chain of
rules (data, train, fid_reference, evaluate, privacy_summary, release_manifest, table1,
reproduction) in about the time of a few Inception passes. Two lives of it:

* ``reproducible``: public noise key; every file must equal an uninterrupted run's, or
  hold the same content where it holds times (train_log.csv, its hash in privacy.json
  and the release manifest);
* ``secret``: a user's own-data run with a secret noise key, whose files cannot equal
  another run's: every file must agree with the record and the ledger instead.

Each moment kills the whole process group (Snakemake and its jobs): SIGKILL, or SIGTERM
as SLURM sends it followed by SIGKILL after a grace time. The moments are drawn from a
seed that the test prints (``DPSINKHORN_KILL_SEED`` repeats one), spread over the life by
the share of the uninterrupted run's job time still to do. Then: each DP training is
counted once in the training record (one id, one noise draw) and its generator is the one
the record finished with; no temporary file, private workspace or stop note is left;
``dpsinkhorn release`` holds exactly the manifest's files. The figure (moments tried,
faults survived) is printed.

``DPSINKHORN_KILL_MOMENTS=<n>`` (default 12 per life, 24 in all) is the slow mode.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import require_shared, shared_path, write_digits_npz

from dpsinkhorn.fileio import sha256_of
from dpsinkhorn.privacy import trainings

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DIGITS = [str(d) for d in range(10)]
MOMENTS = int(os.environ.get("DPSINKHORN_KILL_MOMENTS", "12"))
SEED = int(os.environ.get("DPSINKHORN_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
#: SLURM's KillWait: SIGKILL this long after SIGTERM.
GRACE_S = 20.0
#: What holds times (compared by content) or is bookkeeping (not compared).
NOT_COMPARED = ("/logs/", "/benchmarks/", "/trainings/", ".snakemake")


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
        "experiments": {"digits_dp": {"dataset": "digits", "table1_row": "paper",
                                      "sigma": 1.5}},
    }  # fmt: skip
    path = workdir / "ka.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _command(workdir: Path) -> list[str]:
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "FID_WEIGHTS=PATH")
    return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            "-c", "2", "--max-threads", "1", "--configfile", str(workdir / "ka.yaml"),
            "--config", f"fid_weights={weights}"]  # fmt: skip


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def _start(workdir: Path, log) -> subprocess.Popen:
    return subprocess.Popen(_command(workdir), cwd=workdir, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def _kill(proc: subprocess.Popen, how: str) -> None:
    """Kill the process group: SIGKILL, or SIGTERM then SIGKILL after GRACE_S."""
    try:
        os.killpg(proc.pid, signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
        if how == "SIGTERM":
            try:
                proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + GRACE_S  # jobs of the group may outlive Snakemake briefly
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def _run_to_completion(workdir: Path) -> float:
    start = time.monotonic()
    with open(workdir / "uninterrupted.log", "w") as log:
        assert _start(workdir, log).wait(1800) == 0, (workdir / "uninterrupted.log").read_text()
    return time.monotonic() - start


def _killed_life(workdir: Path, moments: int, life_s: float, rng: random.Random) -> dict:
    """Run the same command, killing it at ``moments`` random moments, until it completes.
    ``life_s``: the wall time of the uninterrupted run."""
    figure = {"moments": [], "completed_before_kill": 0, "unlocks": 0, "attempts": 0}
    # The killed attempts together run at most 0.8 of one uninterrupted life, so every moment
    # is used before the work can be done (each attempt also pays Snakemake's start, and a
    # kill loses work), and the moments walk through the life: each kill draws up to twice
    # its share of what is left of that time (the mean share). A fixed start-up delay
    # before each kill let a short life (28 s on an idle machine; the CI of d0fdb65: 7 of
    # 12 moments) finish with moments unused.
    left_s = 0.8 * life_s
    while True:
        figure["attempts"] += 1
        path = workdir / f"attempt{figure['attempts']}.log"
        kill = len(figure["moments"]) < moments
        share = left_s / max(moments - len(figure["moments"]), 1)
        delay = min(rng.uniform(0, 2 * share), left_s)
        how = rng.choice(["SIGKILL", "SIGTERM"])
        with open(path, "w") as log:
            proc = _start(workdir, log)
            try:
                code = proc.wait(delay if kill else 1800)
            except subprocess.TimeoutExpired:
                _kill(proc, how)
                figure["moments"].append((round(delay, 1), how))
                left_s -= delay
                continue
        text = path.read_text()
        if code != 0 and "cannot be locked" in text.lower():
            # SIGKILL leaves Snakemake's lock: what a user does (docs/CLUSTER.md).
            figure["unlocks"] += 1
            subprocess.run([*_command(workdir), "--unlock"], cwd=workdir, env=_env(),
                           capture_output=True, check=True)  # fmt: skip
            continue
        assert code == 0, f"attempt {figure['attempts']} failed:\n{text[-6000:]}"
        if kill:
            figure["completed_before_kill"] += 1
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


def _check_consistent(workdir: Path) -> list[str]:
    """What every finished run must hold, killed or not; returns the problems."""
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
    results = workdir / "results" / "ka"
    out = str((results / "digits_dp").resolve())
    (record,) = (workdir / "data" / "trainings").glob("*.jsonl")
    ours = [t for t in trainings.trainings(trainings.read(record)) if t["out"] == out]
    if len(ours) != 1 or not ours[0]["finished"]:
        problems.append(f"digits_dp counted {len(ours)} times: {ours}")
    elif ours[0]["content_sha256"] != sha256_of(results / "digits_dp" / "generator.pt"):
        problems.append("generator.pt is not the one the record finished with")
    ledger = json.loads((results / "digits_dp" / "privacy.json").read_text())
    if ledger["content_sha256"] != sha256_of(results / "digits_dp" / "generator.pt"):
        problems.append("generator.pt is not the one its ledger names")
    published = workdir / "published"
    run = subprocess.run(
        [str(BIN / "dpsinkhorn"), "release", "--config", "ka.yaml", "--out", str(published),
         "--accept-no-guarantee"],
        cwd=workdir, env=_env(), capture_output=True, text=True,
    )  # fmt: skip
    if run.returncode != 0:
        return [*problems, f"release refused: {run.stderr.strip()}"]
    manifest = json.loads((results / "release_manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    got = {p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file()}
    if got - {"release_manifest.json"} != listed:
        problems.append(f"release holds {sorted(got)}, manifest lists {sorted(listed)}")
    return problems


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, float]:
    """An uninterrupted run of the reproducible life, and its wall time."""
    workdir = tmp_path_factory.mktemp("reference")
    _config(workdir, reproducible=True)
    return workdir, _run_to_completion(workdir)


@pytest.mark.parametrize("life", ["reproducible", "secret"])
def test_killed_anywhere_the_rerun_completes_with_nothing_lost(life, reference, tmp_path):
    ref, life_s = reference
    seed = SEED + (life == "secret")
    print(f"\nkill-anywhere {life}: seed {seed} (DPSINKHORN_KILL_SEED={SEED}), {MOMENTS} moments")
    _config(tmp_path, reproducible=life == "reproducible", npz=ref / "digits.npz")
    start = time.monotonic()
    figure = _killed_life(tmp_path, MOMENTS, life_s, random.Random(seed))
    problems = _check_consistent(tmp_path)
    if life == "reproducible":
        ours, theirs = _files(tmp_path / "results"), _files(ref / "results")
        if set(ours) != set(theirs):
            problems.append(f"files differ: {sorted(set(ours) ^ set(theirs))}")
        differ = [r for r in set(ours) & set(theirs) if not _same_content(r, ours[r], theirs[r])]
        if differ:
            problems.append(f"content differs from the uninterrupted run: {sorted(differ)}")
    tried = len(figure["moments"])
    print(
        f"kill-anywhere {life}: {tried} moments tried {figure['moments']}, "
        f"{tried if not problems else 0} faults survived, {figure['attempts']} runs, "
        f"{figure['unlocks']} unlocks, completed before its kill: "
        f"{figure['completed_before_kill']}; lost: {problems or 'nothing'}; "
        f"{time.monotonic() - start:.0f} s (uninterrupted: {life_s:.0f} s)"
    )
    assert not problems, (seed, figure, problems)
    assert tried >= MOMENTS * 3 // 4, figure  # spread over the life, not after its end


def test_a_killed_release_leaves_no_folder_or_the_whole_one(reference):
    """``dpsinkhorn release`` killed at random moments (SIGKILL or SIGTERM) leaves the old
    state (no release folder) or the whole new one, never a mix; then it completes."""
    ref, _ = reference
    rng = random.Random(SEED + 2)
    manifest = json.loads((ref / "results" / "ka" / "release_manifest.json").read_text())
    whole = {f["path"] for f in manifest["files"]} | {"release_manifest.json"}
    command = [str(BIN / "dpsinkhorn"), "release", "--config", "ka.yaml", "--accept-no-guarantee"]
    start = time.monotonic()
    with open(ref / "release.log", "w") as log:
        done = subprocess.run([*command, "--out", "timed"], cwd=ref, env=_env(), stdout=log)
    assert done.returncode == 0
    release_s = time.monotonic() - start
    outcomes, stale = [], []
    for i in range(max(MOMENTS // 2, 6)):
        out = ref / f"published{i}"
        delay, how = rng.uniform(0, release_s * 1.2), rng.choice(["SIGKILL", "SIGTERM"])
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
        assert not state.startswith("mix"), outcomes
        if state == "old":  # run again: it completes
            again = subprocess.run([*command, "--out", out.name], cwd=ref, env=_env(),
                                   capture_output=True, text=True)  # fmt: skip
            assert again.returncode == 0, again.stderr
            assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == whole
    print(f"\nkilled release (seed {SEED + 2}): {outcomes}; stale temporary folders: {stale}")
