"""The README's commands in the order a new user types them never retrain or refuse.

``make run DATA=../shared/data`` (the Makefile passes the mirror as an absolute path),
then the README's one-file command (``data/mnist/train.npz --config
data_mirror=../shared/data``, a relative path), then ``make run`` again must not prepare
the data again: if it did, the second ``make run`` would rerun the finished DP training,
which is refused. Here the same three commands run in a folder laid out like a clone, with a tiny
config in place of ``config/quick.yaml``: the first one for real up to the DP training (a
secret-key training, so a retrain would be refused), the README's command for real, and
``make run`` as a dry run, which must plan no data or training job. The mirror's other
spellings (symbolic link, another copy of the archives) must not re-prepare either.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_readme import readme_commands

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DP = "mnist_dp"
TINY = {
    "run_name": "tiny",
    "data_dir": "data",
    "data_mirror": None,
    "fid_weights": None,
    "device": "cpu",
    "seeds": [0],
    "evaluation": {"num_samples": 50, "fid_reference_size": 50, "classifiers": ["logreg"]},
    "training_defaults": {"steps": 4, "checkpoint_every": 2, "log_every": 2, "batch_size": 50},
    "experiments": {DP: {"dataset": "mnist", "table1_row": "paper", "sigma": 1.5}},
}


def run(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{shlex.join(argv)}:\n{output[-6000:]}"
    return output


def planned(output: str) -> set[str]:
    """The rules of the jobs a dry run lists."""
    return set(re.findall(r"^(?:local)?rule (\w+):", output, re.M))


def make_run_command(clone: Path, data: str, weights: str) -> list[str]:
    """The Snakemake command ``make run DATA=... FID_WEIGHTS=...`` runs (make -n)."""
    text = run(["make", "-n", "run", f"DATA={data}", f"FID_WEIGHTS={weights}"], clone)
    joined = text.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if "snakemake --profile" in x)
    argv = shlex.split(line)
    argv = argv[argv.index(next(a for a in argv if a.endswith("snakemake"))) :]
    return [str(BIN / "snakemake"), *argv[1:]]


@pytest.fixture(scope="module")
def clone(tmp_path_factory, data_mirror, fid_weights) -> Path:
    """A folder laid out like a fresh clone beside ``shared/`` (the README's ../shared),
    with config/tiny.yaml; its Snakefile, rules and profiles are this checkout's."""
    base = tmp_path_factory.mktemp("docs_sequence")
    clone = base / "clone"
    clone.mkdir()
    for name in (
        "Snakefile",
        "workflow",
        "profiles",
        "Makefile",
        "envs",
        "pyproject.toml",
        "results-paper-scale",
    ):
        (clone / name).symlink_to(REPO / name)
    (clone / ".venv").symlink_to(BIN.parent)
    (clone / "config").mkdir()
    (clone / "config" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (base / "shared").mkdir()
    (base / "shared" / "data").symlink_to(Path(data_mirror).resolve())
    (base / "shared" / "weights").symlink_to(Path(fid_weights).resolve().parent)
    return clone


def test_readme_commands_in_order_retrain_nothing(clone):
    weights = "../shared/weights/pt_inception-2015-12-05-6726825d.pth"
    make_run = make_run_command(clone, "../shared/data", weights)
    assert any(a.startswith(f"data_mirror={clone.parent}/shared/data") for a in make_run)
    make_run = [a.replace("config/quick.yaml", "config/tiny.yaml") for a in make_run]
    dp_files = [f"results/tiny/{DP}/{f}" for f in ("generator.pt", "privacy.json")]

    # 1. make run (for real up to the DP training: the rest is evaluation)
    run([make_run[0], *dp_files, *make_run[1:]], clone)
    generator = clone / dp_files[0]
    stamp = generator.stat().st_mtime_ns
    record = next((clone / "data" / "trainings").glob("*.jsonl")).read_text()

    # 2. the README's one-file command, verbatim but for the config file
    readme = next(c for c in readme_commands() if " data/mnist/train.npz" in c)
    argv = [a.replace("config/quick.yaml", "config/tiny.yaml") for a in shlex.split(readme)]
    assert "data_mirror=../shared/data" in argv
    out = run([str(BIN / "snakemake"), *argv[1:]], clone)
    assert "Nothing to be done" in out, out[-3000:]

    # 3. make run again: no data, no training planned (a dry run), and for real up to the
    # training: nothing to do, the record unchanged
    assert not planned(run([make_run[0], "-n", *make_run[1:]], clone)) & {"data", "train"}
    out = run([make_run[0], *dp_files, *make_run[1:]], clone)
    assert "Nothing to be done" in out, out[-3000:]
    assert generator.stat().st_mtime_ns == stamp
    assert next((clone / "data" / "trainings").glob("*.jsonl")).read_text() == record

    # The same mirror through a symbolic link, and another copy of the archives: the same
    # prepared bytes, so nothing is prepared again
    (clone / "mirror_link").symlink_to(clone.parent / "shared" / "data")
    copy = clone.parent / "mirror_copy" / "MNIST"
    shutil.copytree(clone.parent / "shared" / "data" / "MNIST" / "raw", copy / "raw")
    for mirror in ("mirror_link", str(copy.parent)):
        spelled = [f"data_mirror={mirror}" if a.startswith("data_mirror=") else a for a in make_run]
        assert not planned(run([spelled[0], "-n", *spelled[1:]], clone)) & {"data", "train"}
