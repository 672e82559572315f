"""Tables 2/4/5, Figures 2/4a/4b/4c/5/7, reproduction.md and captions from hand-made results."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from helpers import read_csv

from dpsinkhorn import fileio
from dpsinkhorn.config import experiment, experiment_names, load_config
from dpsinkhorn.config.studies import study_cells
from dpsinkhorn.config.targets import NAMES
from dpsinkhorn.report import captions
from dpsinkhorn.report import cli as report_cli
from dpsinkhorn.report.studies import table_csv_columns

CONFIG = """
run_name: tiny
seeds: [0, 1]
evaluation:
  num_samples: 40
  classifiers: [logreg, mlp, cnn]
training_defaults:
  steps: 10
experiments:
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper}      # σ 1.5, Δ 0.5, p 0.4, m 1
  fmnist_dpsinkhorn: {dataset: fmnist, table1_row: paper, sigma: 1.9, m: 3.0}
studies:
  table2:
    bases: [mnist_dpsinkhorn]
    cells:
      l2: {cost: l2, p: 0.0}
      semi: {experiment: mnist_dpsinkhorn}
  table4:
    bases: [mnist_dpsinkhorn]
    cells:
      odd: {sigma: 1.2, clip: 0.4}                           # no paper row has these
      paper: {experiment: mnist_dpsinkhorn}
  fig4a:
    bases: [mnist_dpsinkhorn]
    vary: {lr: [1.0e-3, 1.0e-4], optimizer: [adam, sgd]}
  fig4b:
    bases: [mnist_dpsinkhorn]
    vary: {m: [1.0, 3.0], steps: [5, 10]}
  fig4c:
    bases: [mnist_dpsinkhorn]
    vary: {p: [0.0, 1.0]}
    p_values: [0.0, 0.5, 1.0]
    batches: 4
  fig5:
    bases: [mnist_dpsinkhorn, fmnist_dpsinkhorn]
    vary: {p: [0.0, 0.4]}
"""
# mnist_dpsinkhorn per seed: (fid, logreg, mlp, cnn), accuracies as fractions
MAIN = [(50.0, 0.80, 0.81, 0.82), (54.0, 0.82, 0.83, 0.84)]


def _values(index: int, seed: int) -> tuple[float, ...]:
    return (100.0 + 10 * index + seed, 0.5 + 0.01 * index, 0.6 + 0.01 * seed, 0.7)


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path]:
    """A config file and a results folder holding every file the reports read."""
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(CONFIG)
    config = load_config([config_file])
    out = tmp_path / "results" / "tiny"
    for index, name in enumerate(experiment_names(config)):
        spec = experiment(config, name)
        for seed in config["seeds"]:
            fid, *accs = MAIN[seed] if name == "mnist_dpsinkhorn" else _values(index, seed)
            fileio.write_json(out / name / f"fid_seed{seed}.json", {"fid": fid})
            for model, acc in zip(["logreg", "mlp", "cnn"], accs, strict=True):
                fileio.write_json(out / name / f"acc_{model}_seed{seed}.json", {"accuracy": acc})
        privacy = {
            "epsilon": 0.1 * spec["steps"],
            "epsilon_paper_convention": 10.02,
            "steps": spec["steps"],
            "sigma": spec["sigma"],
        }
        fileio.write_json(out / name / "privacy.json", privacy)
        ps = [0.0, 0.5, 1.0]
        fileio.write_json(
            out / "nonprivate" / name / "gradstudy.json",
            {
                "experiment": name,
                "trained_p": spec["p"],
                "p": ps,
                "bias": [1.0 - p for p in ps],
                "bias_relative": [0.5 * (1.0 - p) for p in ps],
                "variance": [1.0 + p for p in ps],
                "variance_normalised": [1.0 + p for p in ps],
                "bias_noise_floor": [0.1, 0.1, 0.0],
                "batches": 4,
            },
        )
    rng = np.random.default_rng(0)
    for name in ["mnist_dpsinkhorn", "fmnist_dpsinkhorn"]:
        images = rng.integers(0, 256, size=(40, 28, 28), dtype=np.uint8)
        fileio.save_samples(out / name / "samples_seed0.npz", images, np.arange(40) % 10)
    return config_file, out


def test_table4_numbers_land_in_the_right_cells(run):
    config, out = run
    written = report_cli.render("table4", [config], out)
    assert {p.name for p in written} == {"table4.md", "table4.csv", "table4.tex"}
    rows = {r["cell"]: r for r in read_csv(out / "tables" / "table4.csv")}
    assert list(rows) == ["odd", "paper"]  # study order
    assert tuple(read_csv(out / "tables" / "table4.csv")[0]) == table_csv_columns("table4")

    paper = rows["paper"]
    assert paper["experiment"] == "mnist_dpsinkhorn"
    assert float(paper["fid"]) == pytest.approx(52.0)
    assert float(paper["fid_std"]) == pytest.approx(np.std([50.0, 54.0], ddof=1), abs=1e-4)
    assert float(paper["acc_logreg"]) == pytest.approx(81.0)  # fractions -> %
    assert float(paper["acc_cnn"]) == pytest.approx(83.0)
    assert float(paper["paper_fid"]) == 48.4  # matched by (σ, Δ, p, m) = (1.5, 0.5, 0.4, 1)
    assert float(paper["paper_acc_logreg"]) == 82.8
    assert float(paper["paper_acc_cnn"]) == 83.2
    assert float(paper["sigma"]) == 1.5 and float(paper["clip"]) == 0.5
    assert float(paper["epsilon"]) == pytest.approx(1.0)
    assert float(paper["epsilon_paper_convention"]) == pytest.approx(10.02)

    odd = rows["odd"]
    assert odd["experiment"] == "table4_odd"
    assert float(odd["sigma"]) == 1.2 and float(odd["clip"]) == 0.4
    assert odd["paper_fid"] == "" and odd["paper_acc_cnn"] == ""

    md = (out / "tables" / "table4.md").read_text()
    assert "52.0 ± 2.8 (paper 48.4)" in md
    assert "81.0 ± 1.4 (paper 82.8)" in md
    assert "10.02 (paper 10)" in md
    odd_line = next(line for line in md.splitlines() if line.startswith("| odd |"))
    assert "(paper" not in odd_line
    assert "2 seed(s)" in md and "40 samples" in md and "paper conv." in md
    assert str(config) in md  # the caption names the config file
    tex = (out / "tables" / "table4.tex").read_text()
    assert "\\toprule" in tex and "52.0 $\\pm$ 2.8" in tex


def test_table2_is_matched_by_settings_not_labels(run):
    config, out = run
    report_cli.render("table2", [config], out)
    rows = {r["cell"]: r for r in read_csv(out / "tables" / "table2.csv")}
    assert rows["l2"]["loss"] == "L2" and rows["l2"]["debiasing"] == "No"
    assert float(rows["l2"]["paper_fid"]) == 124.3  # image gradient, L2, no debiasing
    assert float(rows["semi"]["paper_acc_mlp"]) == 82.7  # image, L1+L2, semi
    assert "acc_logreg" not in rows["semi"]  # Table 2 has no Log Reg column
    md = (out / "tables" / "table2.md").read_text()
    assert "| l2 | Yes | L2 | No |" in md
    assert "| semi | Yes | L1+L2 | Semi (p = 0.4) |" in md


@pytest.mark.parametrize("name", ["fig2", "fig4a", "fig4b", "fig4c", "fig5", "fig7"])
def test_figures_are_readable_images(run, name):
    from matplotlib.image import imread

    config, out = run
    written = report_cli.render(name, [config], out)
    assert {p.name for p in written} == {f"{name}.png", f"{name}.pdf", f"{name}.csv"}
    image = imread(out / "figures" / f"{name}.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    pdf = (out / "figures" / f"{name}.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and pdf.rstrip().endswith(b"%%EOF")
    assert b"/CreationDate" not in pdf  # a rerun writes the same bytes (kill-anywhere test)
    assert read_csv(out / "figures" / f"{name}.csv")


def test_figure_csvs_hold_the_plotted_numbers(run):
    config, out = run
    report_cli.render("fig4a", [config], out)
    rows = read_csv(out / "figures" / "fig4a.csv")
    assert len(rows) == 4
    assert {(float(r["lr"]), r["optimizer"]) for r in rows} == {
        (1e-3, "adam"),
        (1e-3, "sgd"),
        (1e-4, "adam"),
        (1e-4, "sgd"),
    }
    adam = next(r for r in rows if r["optimizer"] == "adam" and float(r["lr"]) == 1e-4)
    assert adam["experiment"] == "mnist_dpsinkhorn"  # reused: same settings
    assert float(adam["acc_cnn"]) == pytest.approx(83.0)

    report_cli.render("fig4b", [config], out)
    rows = read_csv(out / "figures" / "fig4b.csv")
    assert sorted(float(r["epsilon"]) for r in rows) == pytest.approx([0.5, 0.5, 1.0, 1.0])
    assert all(float(r["error_cnn"]) == pytest.approx(100 - float(r["acc_cnn"])) for r in rows)

    report_cli.render("fig4c", [config], out)
    rows = read_csv(out / "figures" / "fig4c.csv")
    assert len(rows) == 2 * 3  # 2 trained generators x 3 evaluated p
    assert {float(r["trained_p"]) for r in rows} == {0.0, 1.0}

    report_cli.render("fig5", [config], out)
    rows = read_csv(out / "figures" / "fig5.csv")
    assert {r["dataset"] for r in rows} == {"mnist", "fmnist"} and len(rows) == 4

    report_cli.render("fig7", [config], out)
    rows = read_csv(out / "figures" / "fig7.csv")
    assert {int(r["shown"]) for r in rows} == {4}  # 4 samples per class available


def test_reproduction_lists_paper_ours_and_difference(run):
    config, out = run
    (path,) = report_cli.render("reproduction", [config], out)
    assert path == out / "reproduction.md"
    md = path.read_text()
    assert "## Table 1" in md and "## Table 2" in md and "## Table 4" in md
    assert "not at paper scale" in md
    line = next(
        row
        for row in md.splitlines()
        if row.startswith("| 4 | paper (σ 1.5, Δ 0.5, p 0.4, m 1) | FID |")
    )
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["48.4", "52.0 ± 2.8", "+3.6"]
    line = next(row for row in md.splitlines() if "| 4 | paper" in row and "| CNN |" in row)
    assert line.rstrip(" |").endswith("-0.2")  # 83.0 - 83.2
    assert "| 4 | odd" not in md  # no paper row: not a reproduced cell
    assert (
        "| 1 | MNIST: DP-Sinkhorn (paper setting) | ε (paper conv.) | 10.0 | 10.02 | +0.02 |" in md
    )


def test_caption_with_and_without_results(run, tmp_path):
    config, out = run
    not_in_config = ("table3", "table5", "table6", "eps10")
    for name in [n for n in NAMES if n not in not_in_config]:
        text = captions.caption([config], tmp_path / "nothing", name)
        assert text == text.strip() and "\n" not in text
        assert "`" not in text and "*" not in text and "|" not in text
        assert str(config) in text
    for name in ["table3", "table5"]:  # not produced by this config: a clear error
        with pytest.raises(ValueError, match=name):
            captions.caption([config], out, name)
    before = captions.caption([config], tmp_path / "nothing", "table4")
    assert "table4_odd (mnist, 10 steps, σ 1.2" in before
    assert "seeds 0, 1" in before
    after = captions.caption([config], out, "table4")
    assert "ε 1.00 sound and 10.02 under the paper's convention" in after
    # The workflow passes Snakemake's validated config mapping.
    mapping = captions.caption(load_config([config]), str(out), "fig4c", [config])
    assert "fig4c_p0" in mapping and "4 batches" in mapping and str(config) in mapping


def test_missing_study_and_missing_file_are_named(run, tmp_path):
    config, out = run
    small = tmp_path / "small.yaml"
    small.write_text(CONFIG.split("studies:")[0])
    with pytest.raises(ValueError, match="no study 'fig4b'"):
        report_cli.render("fig4b", [small], out)
    with pytest.raises(ValueError, match="no study 'table5'"):
        report_cli.render("table5", [config], out)
    (out / "table4_odd" / "acc_mlp_seed1.json").unlink()
    with pytest.raises(FileNotFoundError, match="table4_odd/acc_mlp_seed1.json"):
        report_cli.render("table4", [config], out)
    assert not (out / "tables" / "table4.csv").exists()


def test_cli_subcommands(run, capsys):
    config, out = run
    parser = argparse.ArgumentParser()
    report_cli.register_cli(parser.add_subparsers(dest="command"))
    for name in [n for n in report_cli.REPORTS if n not in ("table5", "eps10")]:  # not in CONFIG
        args = parser.parse_args(["report", name, "--config", str(config), "--out-dir", str(out)])
        assert args.handler(args) == 0
    printed = capsys.readouterr().out.split()
    assert str(out / "tables" / "table4.md") in printed
    assert str(out / "figures" / "fig4a.pdf") in printed
    assert str(out / "reproduction.md") in printed


def test_cli_names_a_missing_study(run, capsys):
    from dpsinkhorn.cli import main

    config, out = run
    assert main(["report", "table5", "--config", str(config), "--out-dir", str(out)]) == 2
    assert "no study 'table5'" in capsys.readouterr().err


def test_reproduction_says_what_the_paper_epsilon_means(run, monkeypatch):
    """reproduction.md carries the finding of the committed paper-scale results set."""
    config, out = run
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the repository root
    (path,) = report_cli.render("reproduction", [config], out)
    md = path.read_text()
    assert "## What the paper's ε = 10 means (results set `mnist-paper-setting-h100`)" in md
    assert "`mnist_perrow`" in md and "sound ε 983.70 (RDP) / 845.28 (PLD)" in md
    assert "sound ε 1.01 (RDP) / 0.93 (PLD)" in md
    assert "Reproduce: `snakemake" in md


EPS10 = """
  eps10:
    bases: [mnist_dpsinkhorn]
    settings: {sigma: null, target_epsilon: 10.0}
    cells:
      b50: {steps: 10}
      b250: {batch_size: 250, steps: 10}
      b50_perrow: {clipping: per_sample, steps: 10}
"""


def test_eps10_study_figure_and_reproduction_section(run):
    """The sound ε = 10 study: one point per cell, the paper's claimed row as reference."""
    from dpsinkhorn.config.studies import study_cells

    config_file, out = run
    config_file.write_text(config_file.read_text() + EPS10)
    config = load_config([config_file])
    cells = study_cells(config, "eps10")
    assert [c.label for c in cells] == ["b50", "b250", "b50_perrow"]
    for k, cell in enumerate(cells):  # CNN 70%, 75%, 80%
        for seed in config["seeds"]:
            fileio.write_json(out / cell.experiment / f"fid_seed{seed}.json", {"fid": 90.0 - k})
            for model in ["logreg", "mlp", "cnn"]:
                acc = {"accuracy": 0.70 + 0.05 * k}
                fileio.write_json(out / cell.experiment / f"acc_{model}_seed{seed}.json", acc)
        ledger = {"epsilon": 10.0, "epsilon_paper_convention": 99.0, "steps": 10, "sigma": 2.0}
        fileio.write_json(out / cell.experiment / "privacy.json", ledger)
    written = report_cli.render("eps10", [config_file], out)
    assert {p.name for p in written} == {"eps10.png", "eps10.pdf", "eps10.csv"}
    rows = read_csv(out / "figures" / "eps10.csv")
    assert [r["batch_size"] for r in rows] == ["50", "250", "50"]
    assert [r["clipping"] for r in rows] == ["batch", "batch", "per_sample"]
    assert [float(r["acc_cnn"]) for r in rows] == pytest.approx([70.0, 75.0, 80.0])
    caption = captions.caption([config_file], out, "eps10")
    assert "3 cells from mnist_dpsinkhorn" in caption and "ε 10.00 sound" in caption
    (path,) = report_cli.render("reproduction", [config_file], out)
    md = path.read_text()
    assert "## Sound ε = 10 study (MNIST)" in md
    line = next(x for x in md.splitlines() if x.startswith("| b50_perrow |"))
    cells_md = [c.strip() for c in line.strip("|").split("|")]
    assert cells_md[3] == "per_sample" and cells_md[7] == "10.00"
    assert cells_md[-1] == "-3.2"  # 80.0 - the paper's claimed 83.2


def test_public_noise_seed_is_said_in_study_tables_and_captions(run):
    config, out = run
    name = next(c.experiment for c in study_cells(load_config([config]), "table4"))
    ledger = fileio.read_json(out / name / "privacy.json")
    public = ledger | {"guarantee": "none: the noise seed is public"}
    fileio.write_json(out / name / "privacy.json", public)
    report_cli.render("table4", [config], out)
    md = (out / "tables" / "table4.md").read_text()
    assert f"No privacy guarantee for `{name}`: the noise seed was public" in md
    caption = captions.caption([config], out, "table4")
    assert f"No privacy guarantee for {name}: the noise seed was public" in caption
    assert "No privacy guarantee" not in captions.caption([config], out, "fig4a")
