"""End to end: the smoke workflow (config/smoke.yaml: every Table 1 row of both datasets, and
Tables 3 and 6 on a synthetic CelebA fixture; tiny).

Isolation: the repo's Snakefile runs with ``--directory`` set to a fresh temporary folder,
so prepared data, results/smoke/ and .snakemake/ all live there and the checkout is never
touched (nor are results of a `make run` in it). Config files are passed by absolute path.

Data and FID weights come from DPSINKHORN_DATA_MIRROR and DPSINKHORN_FID_WEIGHTS
(``make test DATA=... FID_WEIGHTS=...``); unset means download, which needs internet.
Takes minutes: marked ``slow`` (``pytest -m "not slow"`` skips it). The whole workflow runs
once, in the module fixture; every test reads that run (docs/TESTING.md).

Killed on the way: the run is one life of tests/killing.py. Snakemake and its jobs are killed
at :data:`KILL_MOMENTS` moments drawn from a printed seed (the first in a DP training, the
others spread over the jobs by a saved timing of the smoke run, tests/data/smoke_timing.json)
and the same command is run again until it completes, as a user does after an interruption.
The first test checks what that life left (each training counted once with one generator,
every file whole, nothing left half-written, the release exactly the manifest's files); every
other test reads the same run, so each also checks that nothing was lost. Without the shared
data (downloads) the run is not killed. The slow mode that compares every file with an
uninterrupted run is ``DPSINKHORN_KILL_SMOKE`` in tests/test_kill_anywhere.py.

Sizes: what these tests check (every row, cell, file and figure present, every number
finite and in range, reruns and the report) does not depend on how many samples each FID
and classifier sees, so config/smoke.yaml gives them 30 (its comment says why each step
still runs as it does at full size).
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import killing
import pytest
from helpers import SHARED_PATHS, read_csv_columns, shared_config_overrides, shared_path

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "config" / "smoke.yaml"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
#: Moments at which the smoke run is killed (module docstring); 0: not killed.
KILL_MOMENTS = int(os.environ.get("DPSINKHORN_SMOKE_KILLS", "3"))
KILL_SEED = int(os.environ.get("DPSINKHORN_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
OUR_ROWS = [
    "Real data",
    "Non-private Sinkhorn",
    "DP-Sinkhorn (paper setting)",
    "DP-Sinkhorn (paper setting, per-row clipping)",
    "DP-Sinkhorn (sound ε=10)",
]
BASELINES = ["G-PATE", "DP-CGAN", "DataLens", "DP-MERF", "GS-WGAN"]


def smoke_command(workdir: Path, *args: str) -> list[str]:
    """The command that runs the repo's workflow on the smoke config in ``workdir``."""
    overrides = shared_config_overrides()
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    # One thread per job, so two jobs share the 2 cores: a job's start (Python and torch
    # imports, one core) overlaps the other's work (measured in docs/TESTING.md).
    cmd += ["--max-threads", "1"]
    return cmd + ["--configfile", str(SMOKE)] + (["--config", *overrides] if overrides else [])


def snakemake(workdir: Path, *args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    """The repo's workflow on the smoke config, run in ``workdir``, inside this venv."""
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        smoke_command(workdir, *args),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def check(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    return output


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, dict | None, killing.Reference | None]:
    """(a working folder in which the whole smoke workflow has run, killed at KILL_MOMENTS
    moments and run again until it completed; that life's figure and the timing that aimed
    its kills, None if not killed)."""
    workdir = tmp_path_factory.mktemp("smoke")
    shared = all(shared_path(var).exists() for var in SHARED_PATHS)
    if not (KILL_MOMENTS and shared):
        check(snakemake(workdir))
        return workdir, None, None
    killing.smoke_config(workdir)  # the config as one file, for the checks and the release
    timing = killing.Reference.load(killing.SMOKE_TIMING, killing.Workflow.of(workdir))
    rng = random.Random(KILL_SEED)
    figure = killing.killed_life(workdir, KILL_MOMENTS, timing, rng, smoke_command(workdir))
    return workdir, figure, timing


@pytest.fixture(scope="module")
def workdir(killed) -> Path:
    return killed[0]


@pytest.fixture(scope="module")
def results(workdir) -> Path:
    return workdir / "results" / "smoke"


def test_the_killed_run_lost_nothing(killed, record_property):
    """The smoke run's life (module docstring): nothing lost, every moment used. First, before
    any test reruns a job of it."""
    workdir, figure, timing = killed
    if figure is None:
        pytest.skip("the smoke run was not killed (DPSINKHORN_SMOKE_KILLS=0 or no shared data)")
    seed = f"{KILL_SEED}; DPSINKHORN_KILL_SEED={KILL_SEED}"
    problems, text = killing.verdict("smoke", workdir, figure, timing, seed, KILL_MOMENTS)
    print(f"\n{text}")
    record_property("kill_anywhere", text)
    killing.check_life(figure, KILL_MOMENTS, problems, text)


def test_table1_has_every_row_and_column(results):
    columns, rows = read_csv_columns(results / "tables" / "table1.csv")
    assert columns == [
        "method",
        "dataset",
        "epsilon",
        "epsilon_paper_convention",
        "fid",
        "fid_std",
        "acc_logreg",
        "acc_logreg_std",
        "acc_mlp",
        "acc_mlp_std",
        "acc_cnn",
        "acc_cnn_std",
        "source",
    ]
    keys = [(r["method"], r["dataset"]) for r in rows]
    assert keys == [(m, d) for d in ["mnist", "fmnist"] for m in OUR_ROWS + BASELINES]
    for row in rows:
        if row["source"] != "this run":
            continue
        assert 0 < float(row["fid"]) < math.inf
        for model in ["logreg", "mlp", "cnn"]:
            assert 0 <= float(row[f"acc_{model}"]) <= 100
            assert float(row[f"acc_{model}_std"]) == 0  # one seed
        eps = float(row["epsilon"])
        if row["method"] in OUR_ROWS[:2]:
            assert math.isinf(eps) and math.isinf(float(row["epsilon_paper_convention"]))
        elif row["method"] == "DP-Sinkhorn (sound ε=10)":
            assert 0 < eps <= 10 * 1.001  # the sound target is met, not exceeded
        else:
            assert 0 < eps < math.inf and 0 < float(row["epsilon_paper_convention"])


def test_markdown_and_latex_written(results):
    md = (results / "tables" / "table1.md").read_text()
    assert "(paper 48.4)" in md and "(paper 128.3)" in md
    assert "../figures/samples_mnist.png" in md
    tex = (results / "tables" / "table1.tex").read_text()
    assert tex.count("\\multicolumn{7}") == 2


@pytest.mark.parametrize("dataset", ["mnist", "fmnist"])
def test_sample_figures_are_readable_pngs(results, dataset):
    from matplotlib.image import imread

    path = results / "figures" / f"samples_{dataset}.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200


@pytest.mark.parametrize(
    "table,methods",
    [
        ("table3", ["Real data", "Sinkhorn (non-private)", "DP-Sinkhorn", "DP-MERF", "DataLens"]),
        ("table6", ["Real data", "DCGAN+DP-Sinkhorn", "BigGAN+DP-Sinkhorn"]),
    ],
)
def test_celeba_tables_on_the_fixture(results, table, methods):
    """Tables 3 and 6 from the synthetic CelebA: every row, MLP/CNN only, fixture named."""
    columns, rows = read_csv_columns(results / "tables" / f"{table}.csv")
    assert "acc_logreg" not in columns and "acc_cnn" in columns
    assert [(r["method"], r["dataset"]) for r in rows] == [(m, "celeba") for m in methods]
    for row in (r for r in rows if r["source"] == "this run"):
        assert 0 < float(row["fid"]) < math.inf
        assert 0 <= float(row["acc_mlp"]) <= 100 and 0 <= float(row["acc_cnn"]) <= 100
        private = "DP-Sinkhorn" in row["method"]
        assert math.isinf(float(row["epsilon"])) != private
    md = (results / "tables" / f"{table}.md").read_text()
    assert "SYNTHETIC CelebA FIXTURE" in md


@pytest.mark.parametrize("figure", ["fig3", "fig6"])
def test_celeba_figures_are_readable_pngs(results, figure):
    from matplotlib.image import imread

    path = results / "figures" / f"{figure}.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.ndim == 3 and image.shape[1] > 200


def test_privacy_reports_and_logs(results):
    import json

    paper = json.loads((results / "mnist_dpsinkhorn" / "privacy.json").read_text())
    assert paper["sigma"] == 1.5 and paper["steps"] == 20
    assert (results / "logs" / "train_mnist_dpsinkhorn.log").is_file()
    assert (results / "benchmarks" / "train_mnist_dpsinkhorn.tsv").is_file()


def test_finished_workflow_has_nothing_to_do(workdir):
    output = check(snakemake(workdir, "-n"))
    assert "Nothing to be done" in output


def test_single_cell_reruns_alone(workdir, results):
    """Forcing one cell reruns exactly its experiment's evaluation job, nothing upstream."""
    target = results / "mnist_dpsinkhorn" / "acc_cnn_seed0.json"
    before = target.stat().st_mtime_ns
    rule = "evaluate_mnist_dpsinkhorn"
    output = check(snakemake(workdir, str(target.relative_to(workdir)), "--forcerun", rule))
    assert target.stat().st_mtime_ns > before
    assert "1 of 1 steps (100%) done" in output


# -------------------------------------------------------- Tables 2/4/5, Figures, report


@pytest.mark.parametrize("table", ["table2", "table4", "table5"])
def test_study_tables_have_a_row_per_cell(results, table):
    """One CSV row per configured cell, in config order, with finite measured numbers."""
    from dpsinkhorn import config as config_lib
    from dpsinkhorn.config import studies

    config = config_lib.load_config([SMOKE])
    cells = studies.study_cells(config, table)
    columns, rows = read_csv_columns(results / "tables" / f"{table}.csv")
    assert {"fid", "fid_std", "acc_mlp", "acc_cnn", "paper_fid"} <= set(columns)
    assert [r["experiment"] for r in rows] == [c.experiment for c in cells]
    for row in rows:
        assert 0 < float(row["fid"]) < math.inf
        assert 0 <= float(row["acc_cnn"]) <= 100
    md = (results / "tables" / f"{table}.md").read_text()
    assert "(paper " in md  # at least one cell matches a row the paper reports
    assert (results / "tables" / f"{table}.tex").read_text().count("\\\\") >= len(cells)


@pytest.mark.parametrize("figure", ["fig2", "fig4a", "fig4b", "fig4c", "fig5", "fig7", "eps10"])
def test_study_figures_are_readable_images(results, figure):
    from matplotlib.image import imread

    png = results / "figures" / f"{figure}.png"
    image = imread(png)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert (results / "figures" / f"{figure}.pdf").read_bytes()[:5] == b"%PDF-"
    assert (results / "figures" / f"{figure}.csv").stat().st_size > 0


def test_reproduction_lists_reproduced_cells(results):
    text = (results / "reproduction.md").read_text()
    for table in ("Table 1", "Table 2", "Table 4", "Table 5"):
        assert table in text
    assert "48.4" in text  # the paper's MNIST FID, beside ours
    assert "## Sound ε = 10 study (MNIST)" in text  # the study's smoke cells, against 83.2
    assert "## What the paper's ε = 10 means (this run)" in text


def test_html_report(workdir, results):
    report = results / "report.html"
    check(snakemake(workdir, "--report", str(report.relative_to(workdir))))
    html = report.read_text(errors="replace")
    assert report.stat().st_size > 100_000  # self-contained: images and scripts inlined
    for name in ("table2.md", "fig4a.png", "reproduction.md"):
        assert name in html
