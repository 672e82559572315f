"""Committed results sets: rendered from their files, missing cells missing, provenance kept."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from dpsinkhorn import cli, fileio
from dpsinkhorn.privacy import accounting, mechanism
from dpsinkhorn.report import resultset

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "results-paper-scale" / "mnist-paper-setting-h100"

CONFIG = """
run_name: fake
seeds: [0, 1, 2]
experiments:
  real_mnist: {dataset: mnist, table1_row: real, method: real_data}
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper, steps: 200}
  mnist_perrow: {dataset: mnist, table1_row: perrow, clipping: per_sample, steps: 200}
"""


def ledger(clipping: str, steps: int = 200, sigma: float = 1.5) -> dict:
    """The keys train writes that a results set reads, computed by the accountant."""
    z = mechanism.noise_multiplier(sigma, 50, clipping)
    q = 50 / 60000
    return {
        "clipping": clipping,
        "clip": 0.5,
        "sigma": sigma,
        "batch_size": 50,
        "q": q,
        "steps": steps,
        "delta": 1e-5,
        "noise_multiplier": z,
        "sensitivity": sigma / z,
        "epsilon": accounting.compute_epsilon(z, q, steps, 1e-5),
        "epsilon_paper_convention": accounting.paper_convention_epsilon(q, sigma, steps, 50, 1e-5),
        "accountant": "rdp (dp-accounting)",
        "guarantee": "(epsilon, delta)-DP with epsilon = ..., a secret noise key",
    }


@pytest.fixture
def small_set(tmp_path: Path) -> Path:
    """<root>/config/config.yaml and <root>/results-paper-scale/gpu1 with a partial DP row."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(CONFIG)
    set_dir = tmp_path / "results-paper-scale" / "gpu1"
    fileio.write_json(
        set_dir / "provenance.json",
        {
            "name": "gpu1",
            "device": "GPU X",
            "commit": "abc1234",
            "config": "config/config.yaml",
            "experiments": {"mnist_dpsinkhorn": {"command": "snakemake ... mnist_dpsinkhorn"}},
        },
    )
    fileio.write_json(set_dir / "mnist_dpsinkhorn" / "privacy.json", ledger("batch"))
    for seed, acc in [(0, 0.40), (2, 0.44)]:  # seed 1 missing, no FID at all
        fileio.write_json(
            set_dir / "mnist_dpsinkhorn" / f"acc_cnn_seed{seed}.json", {"accuracy": acc}
        )
    return set_dir


def row_cells(md: str, experiment: str) -> list[str]:
    line = next(x for x in md.splitlines() if f"| `{experiment}` |" in x)
    return [c.strip() for c in line.strip("|").split("|")]


def test_missing_cells_are_shown_missing_and_new_files_update_the_table(small_set):
    resultset.render(small_set)
    md = (small_set / "table1.md").read_text()
    cells = row_cells(md, "mnist_dpsinkhorn")
    assert cells[6].startswith("missing (0/3 seeds)")  # FID: none measured, none invented
    assert cells[7].startswith("missing (0/3 seeds)")  # Log-Reg
    assert cells[9].startswith("42.0 ± 2.8 (2/3 seeds)")  # CNN: seeds 0 and 2
    assert "GPU X" in md and "abc1234" in md and "snakemake ... mnist_dpsinkhorn" in md
    assert "`real_mnist`, `mnist_perrow`" in md  # rows the set does not cover, named
    csv_line = (small_set / "table1.csv").read_text().splitlines()[1]
    assert ",,," in csv_line  # empty CSV cells for FID and Log-Reg
    # a later run adds files: rerunning the command is all it takes
    fileio.write_json(small_set / "mnist_dpsinkhorn" / "acc_cnn_seed1.json", {"accuracy": 0.42})
    fileio.write_json(small_set / "mnist_perrow" / "privacy.json", ledger("per_sample"))
    fileio.write_json(small_set / "mnist_perrow" / "acc_cnn_seed0.json", {"accuracy": 0.86})
    assert cli.main(["report", "results-set", "--dir", str(small_set)]) == 0
    md = (small_set / "table1.md").read_text()
    assert row_cells(md, "mnist_dpsinkhorn")[9].startswith("42.0 ± 2.0 (3/3 seeds)")
    perrow = row_cells(md, "mnist_perrow")
    assert perrow[9].startswith("86.0 (1/3 seeds)")
    assert float(perrow[3]) > float(row_cells(md, "mnist_dpsinkhorn")[3])  # sound ε, RDP
    assert "## What the paper's ε = 10 means" in md
    assert "the row closest to the paper's CNN accuracy (83.2%) is `mnist_perrow`" in md


def test_a_ledger_that_does_not_match_the_config_row_is_refused(small_set):
    fileio.write_json(small_set / "mnist_dpsinkhorn" / "privacy.json", ledger("per_sample"))
    with pytest.raises(ValueError, match="clipping 'per_sample' differs from the config's 'batch'"):
        resultset.render(small_set)


def test_a_set_without_provenance_is_refused(small_set):
    (small_set / "provenance.json").unlink()
    assert cli.main(["report", "results-set", "--dir", str(small_set)]) == 2


def test_committed_h100_set_holds_no_loss_no_generator_and_its_table_is_current(tmp_path):
    """The committed table is what the command renders from the committed files, and it
    says that the set's ε carry no privacy guarantee (public noise seed)."""
    files = [p for p in H100.rglob("*") if p.is_file()]
    assert not any(p.name == "generator.pt" for p in files)
    assert all(p.stat().st_size < 2_000_000 for p in files)
    for log in H100.glob("*/train_log.csv"):
        assert "loss" not in log.read_text().splitlines()[0].split(",")
    copy = tmp_path / "mnist-paper-setting-h100"
    shutil.copytree(H100, copy)
    resultset.render(copy, [ROOT / "config" / "config.yaml"])
    for name in ("table1.md", "table1.csv"):
        assert (copy / name).read_text() == (H100 / name).read_text(), name
    md = (copy / "table1.md").read_text()
    perrow = row_cells(md, "mnist_perrow")
    assert perrow[3] == "983.70 †"  # sound ε (RDP) of the per-row ledger, without guarantee
    assert perrow[6].startswith("missing (0/5 seeds)")  # no FID at paper scale
    # the small-sample CPU FID is shown apart, with its sizes, never in the FID column
    small = md.split("## Small-sample FID on CPU (not the paper's protocol)")[1]
    assert "| `mnist_perrow` | 51.8 | 2000 | 2000 | pytorch_fid |" in small
    _says_no_guarantee(copy)


#: The guarantee written by hand into the ledgers of mnist-paper-setting-h100 (provenance.json,
#: ``added``): the code that trained them seeded the noise from the config.
PUBLIC_SEED = "none: the noise seed was public (commit 83ae335)"


def _says_no_guarantee(set_dir: Path) -> None:
    """Ledgers whose noise seed was public say so, and every sound ε of the rendered set is
    marked, with the ledger's reason beside it."""
    for name in ("mnist_dpsinkhorn", "mnist_perrow"):
        assert fileio.read_json(set_dir / name / "privacy.json")["guarantee"] == PUBLIC_SEED
    md = (set_dir / "table1.md").read_text()
    for name in ("mnist_dpsinkhorn", "mnist_perrow"):
        cells = row_cells(md, name)
        assert cells[3].endswith(" †") and cells[4].endswith(" †"), cells  # RDP and PLD
        assert not cells[5].endswith("†")  # the paper convention is no guarantee anyway
    note = next(line for line in md.splitlines() if line.startswith("**† "))
    assert "`mnist_dpsinkhorn`, `mnist_perrow`" in note and PUBLIC_SEED in note
    assert f'(no guarantee; ledger: "{PUBLIC_SEED}")' in md.split("ε = 10 means")[1]
    csv_rows = list(csv.DictReader((set_dir / "table1.csv").read_text().splitlines()))
    assert [r["guarantee"] for r in csv_rows] == [PUBLIC_SEED] * 2


def test_guarantee_marks_follow_each_ledger(small_set):
    """A sound guarantee: no mark; no guarantee field: "unknown guarantee" (‡); a public
    seed: † and the ledger's reason."""
    path = small_set / "mnist_dpsinkhorn" / "privacy.json"
    variants = {
        "unknown": (
            {k: v for k, v in ledger("batch").items() if k != "guarantee"},
            " ‡",
            "Unknown guarantee for `mnist_dpsinkhorn`",
        ),
        "sound": (ledger("batch"), "", None),
        "none": (
            {**ledger("batch"), "guarantee": "none: the noise seed is public"},
            " †",
            '"guarantee": "none: the noise seed is public"',
        ),
    }
    for kind, (privacy, mark, note) in variants.items():
        fileio.write_json(path, privacy)
        resultset.render(small_set)
        md = (small_set / "table1.md").read_text()
        cells = row_cells(md, "mnist_dpsinkhorn")
        eps = accounting.compute_epsilon(privacy["noise_multiplier"], privacy["q"], 200, 1e-5)
        assert cells[3] == f"{eps:.2f}{mark}", (kind, cells)
        assert cells[4].endswith(mark) and (mark or cells[4][-1].isdigit()), (kind, cells)
        notes = [line for line in md.splitlines() if line.startswith(("**† ", "**‡ "))]
        if note is None:
            assert notes == [], kind
            assert "guarantee" not in md.replace("without guarantee", ""), kind
        else:
            assert len(notes) == 1 and note in notes[0], (kind, notes)
        (row,) = csv.DictReader((small_set / "table1.csv").read_text().splitlines())
        assert row["guarantee"] == privacy.get("guarantee", "unknown"), kind
