"""The numbers README.md and docs/*.md quote, recomputed with the functions that produce them.

Each number is parsed out of the docs next to a stable phrase (nothing is copied into this
file), then checked against the project's own code: the config's generators and jobs
(``config``, and Snakemake's own dry run for the job counts), and σ and ε
(``privacy.accounting``). A quoted number must equal the computed one rounded to the digits
the README prints. The dotted names the docs give must exist.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dpsinkhorn.config import load_config
from dpsinkhorn.config.experiments import experiment, experiment_names, trained_experiments
from dpsinkhorn.config.studies import study_cells, study_experiments
from dpsinkhorn.config.targets import score_name
from dpsinkhorn.config.validate import read_yaml
from dpsinkhorn.plan import TRAIN_SIZES
from dpsinkhorn.privacy.accounting import compute_epsilon, paper_convention_epsilon
from dpsinkhorn.privacy.budget import budget_of
from dpsinkhorn.report.common import accuracy_percent, read_number

ROOT = Path(__file__).resolve().parents[1]
#: README.md and every page of docs/, where the numbers below are looked for
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
TEXT = "\n".join((ROOT / page).read_text() for page in PAGES)
DOCS = (*PAGES, "benchmarks/README.md")
#: endings of file names, which the docs also write in backticks
FILE_SUFFIXES = {
    "py",
    "md",
    "json",
    "jsonl",
    "yaml",
    "csv",
    "tsv",
    "npz",
    "pt",
    "pth",
    "txt",
    "smk",
    "sh",
    "png",
    "pdf",
    "tex",
    "toml",
    "lock",
    "log",
    "html",
}


def quoted(pattern: str, text: str = TEXT) -> tuple[str, ...]:
    """The groups of the one match of ``pattern`` in README.md and docs/ (a clear error if
    none or several)."""
    found = re.findall(pattern, text, re.S | re.M)
    assert len(found) == 1, f"docs: expected one match of {pattern!r}, found {len(found)}"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def number(text: str) -> float:
    """A README number ('160,000', '1e-5', '1.7 million')."""
    text = text.replace(",", "")
    if text.endswith(" million"):
        return float(text.removesuffix(" million")) * 1e6
    return float(text)


def assert_printed_as(text: str, value: float) -> None:
    """``value`` rounds to ``text`` at the number of decimals ``text`` shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    assert round(value, decimals) == pytest.approx(float(text)), f"README {text}, computed {value}"


def assert_solved_sigma_printed_as(text: str, epsilon: Callable[[float], float], target: float):
    """The smallest noise multiplier z with ε(z) ≤ target rounds to ``text``: ε is above the
    target half a printed digit below ``text`` and within it half a digit above."""
    decimals = len(text.split(".")[1])
    half = 0.5 * 10.0**-decimals
    assert epsilon(float(text) - half) > target >= epsilon(float(text) + half), text


@pytest.fixture(scope="module")
def paper() -> dict:
    return load_config(ROOT / "config" / "config.yaml")


def q_of(spec: dict) -> float:
    return spec["batch_size"] / TRAIN_SIZES[spec["dataset"]]


def paper_epsilon(spec: dict) -> float:
    """The paper-convention ε of an experiment (its B compositions per step)."""
    return paper_convention_epsilon(
        q_of(spec), spec["sigma"], spec["steps"], spec["batch_size"], spec["delta"]
    )


def test_generator_count(paper):
    (count,) = quoted(r"The full config trains (\d+) generators")
    assert int(count) == len(trained_experiments(paper))


def dry_run_jobs(workdir: Path, config_file: Path, *options: str) -> dict[str, int]:
    """Jobs per rule of a build from nothing, as Snakemake's dry run counts them (its
    'Job stats' table; ``total`` included)."""
    snakemake = Path(sys.executable).with_name("snakemake")
    cmd = [str(snakemake), "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "-n"]
    cmd += ["--configfile", str(config_file), *options]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout.split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^([\w-]+)\s+(\d+)$", table, re.M)}


def test_smoke_job_count(tmp_path):
    (jobs,) = quoted(r"`config/smoke.yaml` \| CI[^|]*\|[^|]*?(\d+) jobs")
    assert int(jobs) == dry_run_jobs(tmp_path, ROOT / "config" / "smoke.yaml")["total"]


def test_slurm_job_counts_of_the_paper_config(paper, tmp_path):
    """docs/CLUSTER.md's SLURM job counts of config/config.yaml (profiles/slurm: every job
    but the Snakefile's local rules), from Snakemake's dry run."""
    cluster_doc = (ROOT / "docs" / "CLUSTER.md").read_text()
    total, swept = quoted(
        r"SLURM jobs of a full build \|[^|]*\| ([\d,]+) \(([\d,]+) with", cluster_doc
    )
    trainings, references, studies, groups, again = quoted(
        r"(\d+) trainings \+ (\d+) FID references \+ (\d+) gradient studies \+ (\d+) "
        r"evaluation jobs = ([\d,]+)",
        cluster_doc,
    )
    config = ROOT / "config" / "config.yaml"
    block = (ROOT / "Snakefile").read_text().split("localrules:")[1].split("\n\n")[0]
    local = set(re.findall(r"(\w+),", block)) | {"total"}

    def remote(jobs: dict[str, int]) -> int:
        return sum(n for rule, n in jobs.items() if rule not in local)

    jobs = dry_run_jobs(tmp_path / "one", config)
    assert (int(trainings), int(references), int(studies)) == (
        jobs["train"],
        jobs["fid_reference"],
        jobs["grad_study"],
    )
    assert int(groups) == len(experiment_names(paper))
    assert number(total) == number(again) == remote(jobs)
    swept_jobs = dry_run_jobs(tmp_path / "swept", config, "--config", "sweep_runs=8")
    assert number(swept) == remote(swept_jobs)


@pytest.mark.parametrize(
    ("title", "name"), [("MNIST", "mnist_dpsinkhorn"), ("Fashion-MNIST", "fmnist_dpsinkhorn")]
)
def test_sound_and_paper_epsilon_table(paper, title, name):
    """The privacy section's table: the config's σ and steps, their sound and paper ε."""
    sigma, steps, rdp, pld, conv = quoted(
        rf"^\| {title}, σ = ([\d.]+), ([\d,]+) steps \| ([\d.]+) \| ([\d.]+|—) \| ([\d.]+) \|$"
    )
    spec = experiment(paper, name)
    assert (float(sigma), number(steps)) == (spec["sigma"], spec["steps"])
    args = (spec["sigma"], q_of(spec), spec["steps"], spec["delta"])
    assert_printed_as(rdp, compute_epsilon(*args))
    if pld != "—":
        assert_printed_as(pld, compute_epsilon(*args, accountant="pld"))
    assert_printed_as(conv, paper_epsilon(spec))


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_solved_sigma_of_the_privacy_commands(accountant):
    """`dpsinkhorn privacy ... --epsilon 10 [--accountant pld]  # σ = X`: X is what it solves."""
    suffix = " --accountant pld" if accountant == "pld" else ""
    q, delta, batch, steps, target, sigma = quoted(
        r"^dpsinkhorn privacy --q ([\d.]+) --delta ([\de.-]+) --batch-size (\d+) --steps (\d+) "
        rf"--epsilon ([\d.]+){suffix}\s+# (?:solves )?σ = ([\d.]+)$"
    )
    assert int(batch) == 50

    def epsilon(z: float) -> float:
        return compute_epsilon(z, float(q), int(steps), float(delta), accountant)

    assert_solved_sigma_printed_as(sigma, epsilon, float(target))


def test_fashion_mnist_sigma_at_sound_epsilon_10(paper):
    steps, sigma = quoted(r"\(Fashion-MNIST, ([\d,]+) steps: σ = ([\d.]+)\)")
    spec = experiment(paper, "fmnist_dpsinkhorn_eps10")
    assert spec["target_epsilon"] == 10 and budget_of(spec, TRAIN_SIZES["fmnist"])[1] == number(
        steps
    )
    assert_printed_as(sigma, budget_of(spec, TRAIN_SIZES["fmnist"])[0])


def test_celeba_epsilon(paper):
    batch, sigma, delta, steps, sound, conv = quoted(
        r"use B = (\d+), σ = ([\d.]+),.*?δ = ([\de.-]+) and ([\d.]+ million) steps\.\s+"
        r"That is sound ε = ([\d.]+) \(paper convention ([\d.]+)\)"
    )
    spec = experiment(paper, "celeba_dpsinkhorn")
    assert (int(batch), float(sigma), float(delta), number(steps)) == (
        spec["batch_size"],
        spec["sigma"],
        spec["delta"],
        spec["steps"],
    )
    args = (spec["sigma"], q_of(spec), spec["steps"], spec["delta"])
    assert_printed_as(sound, compute_epsilon(*args))
    assert_printed_as(conv, paper_epsilon(spec))


def test_eps10_study_cells_and_sigmas(paper):
    cells, new = quoted(r"(\d+) cells, (\d+) new generators")
    assert int(cells) == len(study_cells(paper, "eps10"))
    declared = read_yaml(ROOT / "config" / "config.yaml")["experiments"]
    assert int(new) == len(set(study_experiments(paper, "eps10")) - set(declared))
    b50, b50_row, b1000_steps, b1000, b1000_row = quoted(
        r"B 50: ([\d.]+) with batch clipping, ([\d.]+) per-row; B 1000 at ([\d,]+)\s+steps:\s+"
        r"([\d.]+) and ([\d.]+);"
    )
    for text, name in [
        (b50, "mnist_dpsinkhorn_eps10"),
        (b50_row, "eps10_b50_perrow"),
        (b1000, "eps10_b1000"),
        (b1000_row, "eps10_b1000_perrow"),
    ]:
        sigma, steps = budget_of(experiment(paper, name), TRAIN_SIZES["mnist"])
        assert steps == (number(b1000_steps) if "b1000" in name else 160000), name
        assert_printed_as(text, sigma)


@pytest.mark.parametrize("name", ["mnist_dpsinkhorn", "mnist_perrow"])
def test_results_set_epsilons_are_the_committed_ledgers(name):
    """Each paper-scale table's RDP and paper-convention ε are those of its set's ledger."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(
        r"<!-- table1: (results-paper-scale/[\w-]+) -->\n(.*?)<!-- end table1 -->", readme, re.S
    )
    row = rf"^\| [^|]*\(`{name}`\) \| ([\d.]+)[ †‡]* / [\d.]+[ †‡]* \| ([\d.]+) \|"
    checked = 0
    for set_dir, block in blocks:
        ledger_file = ROOT / set_dir / name / "privacy.json"
        found = re.findall(row, block, re.M)
        assert len(found) == ledger_file.is_file(), f"{set_dir}: {name} rows {found}"
        for rdp, conv in found:
            ledger = json.loads(ledger_file.read_text())
            assert_printed_as(rdp, ledger["epsilon"])
            assert_printed_as(conv, ledger["epsilon_paper_convention"])
            checked += 1
    assert checked >= 1


def _resolves(name: str) -> bool | None:
    """Whether a dotted name in the docs exists: inside dpsinkhorn when its first part is a
    dpsinkhorn module, else in the importable module it names; None when it names neither
    (a JSON key, a file)."""
    parts = name.removeprefix("dpsinkhorn.").split(".")
    package = Path(importlib.import_module("dpsinkhorn").__file__).parent
    ours = (package / parts[0]).is_dir() or (package / f"{parts[0]}.py").is_file()
    prefix = "dpsinkhorn." if ours else ""
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(prefix + ".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False if ours else None


@pytest.mark.parametrize("doc", DOCS)
def test_dotted_names_in_the_docs_exist(doc):
    text = (ROOT / doc).read_text()
    names = set(re.findall(r"`((?:[a-z_]+\.)+[A-Za-z_][A-Za-z0-9_]*)[`(\[]", text))
    code = {n for n in names if n.rsplit(".", 1)[1] not in FILE_SUFFIXES}
    missing = sorted(n for n in code if _resolves(n) is False)
    assert not missing, f"{doc} names what does not exist: {', '.join(missing)}"


def test_paper_md_quick_run_cells_are_the_committed_set():
    """docs/PAPER.md's quick-run sentence (DP-MERF's cells beside DP-Sinkhorn's) holds the
    committed quick set's scores, each rounded as printed."""
    text = " ".join((ROOT / "docs" / "PAPER.md").read_text().split())
    found = re.search(
        r"DP-MERF gave FID ([\d.]+), Log-Reg ([\d.]+), MLP ([\d.]+), CNN ([\d.]+) beside "
        r"DP-Sinkhorn's ([\d.]+) / ([\d.]+) / ([\d.]+) / ([\d.]+) at the same sound ε = 10 "
        r"\(`(results-paper-scale/[\w-]+)/`",
        text,
    )
    assert found, "docs/PAPER.md: no quick-run sentence"
    set_dir = ROOT / found.group(9)
    printed = iter(found.groups()[:8])
    for exp in ("mnist_dpmerf", "mnist_dpsinkhorn"):
        folder = set_dir / exp
        assert_printed_as(next(printed), read_number(folder / score_name("fid", 0), "fid"))
        for model in ("logreg", "mlp", "cnn"):
            assert_printed_as(
                next(printed), accuracy_percent(folder / score_name(f"acc_{model}", 0))
            )
        ledger = json.loads((folder / "privacy.json").read_text())
        assert ledger["target_epsilon"] == 10 and ledger["epsilon"] <= 10, exp
