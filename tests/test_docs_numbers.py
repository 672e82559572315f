"""The numbers the docs still quote in sentences, recomputed with the functions that produce
them or read from the file that holds them: the config's generators, σ and ε
(``privacy.accounting``, ``privacy.budget``), the quick set's cells, FID's error per Inception
precision. Every other number of the docs is a generated block (``report.docblocks``,
tests/test_docs.py). A quoted number must equal the computed one rounded to the digits the
page prints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from dpsinkhorn.config import load_config
from dpsinkhorn.config.experiments import experiment, trained_experiments
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


def test_fid_precision_errors_are_the_measured_ones():
    """docs/PERFORMANCE.md's FID error of each Inception precision against IEEE fp32 is the
    one its results set's file holds, rounded as printed."""
    text = " ".join((ROOT / "docs" / "PERFORMANCE.md").read_text().split())
    found = re.search(
        r"`tf32` differs from IEEE fp32's by ([\d.e-]+) relative, in `fp16` by ([\d.e-]+) "
        r"and in `bf16` by ([\d.e-]+) \(.*?`(results-paper-scale/[\w-]+/[\w-]+\.json)`",
        text,
    )
    assert found, "docs/PERFORMANCE.md: no sentence on FID's precision"
    fid = json.loads((ROOT / found.group(4)).read_text())["fid"]
    for printed, precision in zip(found.groups()[:3], ("tf32", "fp16", "bf16"), strict=True):
        measured = fid[f"fast_{precision}_fid_relative_difference"]
        assert float(f"{measured:.1e}") == float(printed), (precision, printed, measured)
