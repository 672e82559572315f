"""Table 1 from hand-made result files: numbers in the right cells, units, files."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from dpsinkhorn import fileio
from dpsinkhorn.report import cli as report_cli
from dpsinkhorn.report.common import ROW_LABELS
from dpsinkhorn.report.grids import sample_grid
from dpsinkhorn.report.tables import table1

CONFIG = """
run_name: fake
seeds: [0, 1]
evaluation:
  num_samples: 40
  classifiers: [logreg, mlp, cnn]
experiments:
  real_mnist: {dataset: mnist, table1_row: real, method: real_data}
  mnist_nonprivate: {dataset: mnist, table1_row: nonprivate, method: sinkhorn, steps: 10}
  mnist_dpsinkhorn: {dataset: mnist, table1_row: paper}
  mnist_dpsinkhorn_eps10:
    {dataset: mnist, table1_row: sound10, sigma: null, target_epsilon: 10.0, steps: 10}
  fmnist_dpsinkhorn: {dataset: fmnist, table1_row: paper, sigma: 1.9, m: 3.0}
"""
# (fid, logreg, mlp, cnn) per seed; accuracies as fractions, as the json files store them
RESULTS = {
    "real_mnist": [(1.0, 0.90, 0.97, 0.99), (2.0, 0.92, 0.98, 0.99)],
    "mnist_nonprivate": [(50.0, 0.88, 0.89, 0.90), (60.0, 0.90, 0.89, 0.92)],
    "mnist_dpsinkhorn": [(40.0, 0.80, 0.81, 0.82), (44.0, 0.82, 0.83, 0.84)],
    "mnist_dpsinkhorn_eps10": [(30.0, 0.85, 0.86, 0.87), (30.0, 0.85, 0.86, 0.87)],
    "fmnist_dpsinkhorn": [(120.0, 0.70, 0.71, 0.72), (130.0, 0.74, 0.75, 0.76)],
}
PRIVACY = {
    "mnist_nonprivate": {"epsilon": None, "epsilon_paper_convention": None},
    "mnist_dpsinkhorn": {"epsilon": 1.0123, "epsilon_paper_convention": 10.02},
    "mnist_dpsinkhorn_eps10": {"epsilon": 10.0, "epsilon_paper_convention": 60.5},
    "fmnist_dpsinkhorn": {"epsilon": 1.2, "epsilon_paper_convention": 10.1},
}


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, Path]:
    """A config file and a results folder with every file Table 1 reads."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "results" / "fake"
    for exp, per_seed in RESULTS.items():
        # Non-private rows live under nonprivate/ (config.experiment_dir), DP rows beside it.
        where = out / ("" if "dpsinkhorn" in exp else "nonprivate") / exp
        for seed, (fid, *accs) in enumerate(per_seed):
            fileio.write_json(where / f"fid_seed{seed}.json", {"fid": fid})
            for model, acc in zip(["logreg", "mlp", "cnn"], accs, strict=True):
                fileio.write_json(where / f"acc_{model}_seed{seed}.json", {"accuracy": acc})
        if exp in PRIVACY:
            fileio.write_json(where / "privacy.json", {"mechanism": "x", **PRIVACY[exp]})
    rng = np.random.default_rng(0)
    for exp in ["mnist_dpsinkhorn", "fmnist_dpsinkhorn"]:
        images = rng.integers(0, 256, size=(40, 28, 28), dtype=np.uint8)
        fileio.save_samples(out / exp / "samples_seed0.npz", images, np.arange(40) % 10)
    return config, out


CSV_COLUMNS = ("method", "dataset", "epsilon", "epsilon_paper_convention", "fid", "fid_std")
CSV_COLUMNS += ("acc_logreg", "acc_logreg_std", "acc_mlp", "acc_mlp_std", "acc_cnn", "acc_cnn_std")
CSV_COLUMNS += ("source",)


def read_csv(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS
    return {(r["method"], r["dataset"]): r for r in rows}


def test_table1_numbers_land_in_the_right_cells(run):
    config, out = run
    written = table1([config], out)
    assert {p.name for p in written} == {
        "table1.md",
        "table1.csv",
        "table1.tex",
        "samples_mnist.png",
        "samples_fmnist.png",
    }
    rows = read_csv(out / "tables" / "table1.csv")

    dp = rows[("DP-Sinkhorn (paper setting)", "mnist")]
    assert float(dp["fid"]) == pytest.approx(42.0)
    assert float(dp["fid_std"]) == pytest.approx(np.std([40.0, 44.0], ddof=1), abs=1e-4)
    assert float(dp["acc_logreg"]) == pytest.approx(81.0)  # fractions -> %
    assert float(dp["acc_cnn"]) == pytest.approx(83.0)
    assert float(dp["acc_cnn_std"]) == pytest.approx(math.sqrt(2), abs=1e-4)
    assert float(dp["epsilon"]) == pytest.approx(1.0123)
    assert float(dp["epsilon_paper_convention"]) == pytest.approx(10.02)
    assert dp["source"] == "this run"

    sound = rows[("DP-Sinkhorn (sound ε=10)", "mnist")]
    assert float(sound["fid"]) == 30.0 and float(sound["fid_std"]) == 0.0
    assert float(sound["epsilon"]) == 10.0

    for method in ["Real data", "Non-private Sinkhorn"]:
        assert rows[(method, "mnist")]["epsilon"] == "inf"
        assert rows[(method, "mnist")]["epsilon_paper_convention"] == "inf"
    assert float(rows[("Real data", "mnist")]["acc_mlp"]) == pytest.approx(97.5)

    fmnist = rows[("DP-Sinkhorn (paper setting)", "fmnist")]
    assert float(fmnist["fid"]) == pytest.approx(125.0)


def test_reported_baselines_copied_from_the_paper(run):
    config, out = run
    table1([config], out)
    rows = read_csv(out / "tables" / "table1.csv")
    for method in ["G-PATE", "DP-CGAN", "DataLens", "DP-MERF", "GS-WGAN"]:
        for dataset in ["mnist", "fmnist"]:
            assert rows[(method, dataset)]["source"] == "reported in paper"
            assert float(rows[(method, dataset)]["epsilon"]) == 10.0
    assert float(rows[("GS-WGAN", "mnist")]["fid"]) == 61.3
    assert float(rows[("G-PATE", "mnist")]["acc_cnn"]) == 51.0  # first number of 51/80.9
    assert float(rows[("G-PATE", "fmnist")]["acc_cnn"]) == 50.0
    assert rows[("DataLens", "fmnist")]["acc_logreg"] == ""  # N/A stays empty
    assert float(rows[("DataLens", "fmnist")]["acc_cnn"]) == 70.61
    assert float(rows[("DP-MERF", "fmnist")]["acc_mlp"]) == 74.5
    # Our rows come first within each dataset, datasets in config order.
    methods = [key for key in rows]
    assert methods[0] == ("Real data", "mnist")
    assert methods.index(("GS-WGAN", "mnist")) < methods.index(
        ("DP-Sinkhorn (paper setting)", "fmnist")
    )


def test_markdown_shows_paper_values_next_to_ours(run):
    config, out = run
    table1([config], out)
    md = (out / "tables" / "table1.md").read_text()
    assert "42.0 ± 2.8 (paper 48.4)" in md  # MNIST DP-Sinkhorn FID
    assert "81.0 ± 1.4 (paper 82.8)" in md  # MNIST DP-Sinkhorn Log Reg
    assert "1.5 ± 0.7 (paper 1.6)" in md  # MNIST real-data FID
    assert "55.0 ± 7.1 (paper 54.2)" in md  # non-private, m = 1
    assert "125.0 ± 7.1 (paper 128.3)" in md  # Fashion-MNIST DP-Sinkhorn FID
    assert "10.02 (paper 10)" in md
    assert "(paper" not in md.split("DP-Sinkhorn (sound ε=10)")[1].split("\n")[0]
    assert "![MNIST](../figures/samples_mnist.png)" in md
    assert "G-PATE¹" in md and "80.9" in md


def test_latex_is_a_booktabs_tabular(run):
    config, out = run
    table1([config], out)
    tex = (out / "tables" / "table1.tex").read_text()
    assert "\\begin{tabular}{lrrrrrr}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    assert "DP-Sinkhorn (sound $\\varepsilon$=10)" in tex
    assert "42.0 $\\pm$ 2.8" in tex
    assert "GS-WGAN\\textsuperscript{\\dag}" in tex
    body = [line for line in tex.splitlines() if line.endswith("\\\\") and "&" in line]
    assert all(line.count("&") == 6 for line in body)


def test_figures_are_pngs_with_one_row_per_class(run):
    config, out = run
    table1([config], out)
    from matplotlib.image import imread

    image = imread(out / "figures" / "samples_mnist.png")
    assert image.ndim == 3 and image.shape[0] > 100
    grid = sample_grid(
        np.arange(40 * 4, dtype=np.uint8).reshape(40, 2, 2) % 255, np.arange(40) % 10, 10, 3
    )
    assert grid.shape == (10 * 4 - 2, 3 * 4 - 2)


def test_missing_result_file_is_named(run):
    config, out = run
    (out / "mnist_dpsinkhorn" / "acc_mlp_seed1.json").unlink()
    with pytest.raises(FileNotFoundError, match="mnist_dpsinkhorn/acc_mlp_seed1.json"):
        table1([config], out)
    assert not (out / "tables" / "table1.csv").exists()


def test_accuracy_in_percent_is_refused(run):
    config, out = run
    fileio.write_json(out / "nonprivate" / "real_mnist" / "acc_cnn_seed0.json", {"accuracy": 99.0})
    with pytest.raises(ValueError, match="real_mnist/acc_cnn_seed0.json.*fraction"):
        table1([config], out)


def test_cli(run):
    config, out = run
    import argparse

    parser = argparse.ArgumentParser()
    report_cli.register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", "table1", "--config", str(config), "--out-dir", str(out)])
    assert args.handler(args) == 0
    assert (out / "tables" / "table1.md").is_file()


@pytest.mark.parametrize("name", ["table3", "table6"])
def test_cli_refuses_a_table_the_config_does_not_produce(run, capsys, name):
    """A CelebA table of a config without CelebA rows: exit 2 naming it, no empty table."""
    from dpsinkhorn.cli import main

    config, out = run
    assert main(["report", name, "--config", str(config), "--out-dir", str(out)]) == 2
    error = f"dpsinkhorn report: error: this config does not produce {name!r} (it produces: "
    assert capsys.readouterr().err.startswith(error)
    assert not (out / "tables" / f"{name}.md").exists()


def _ledger(clipping: str, sigma: float, steps: int, guarantee: str | None = None) -> dict:
    """A privacy.json ledger as train writes it (the accountant's numbers, not typed in)."""
    from dpsinkhorn.privacy import accounting, mechanism

    z = mechanism.noise_multiplier(sigma, 50, clipping)
    ledger = {
        "clipping": clipping,
        "sigma": sigma,
        "q": 50 / 60000,
        "steps": steps,
        "delta": 1e-5,
        "noise_multiplier": z,
        "sensitivity": sigma / z,  # noise std / multiplier, with clip 0.5 (std = 2 Δ σ = σ)
        "epsilon": accounting.compute_epsilon(z, 50 / 60000, steps, 1e-5),
        "epsilon_paper_convention": accounting.paper_convention_epsilon(
            50 / 60000, sigma, steps, 50, 1e-5
        ),
        "accountant": "rdp (dp-accounting)",
    }
    return ledger | ({"guarantee": guarantee} if guarantee else {})


def test_perrow_row_names_its_mechanism_and_both_sound_epsilons(run):
    config, out = run
    text = config.read_text().replace(
        "  fmnist_dpsinkhorn:",
        "  mnist_perrow:\n"
        "    {dataset: mnist, table1_row: perrow, clipping: per_sample, steps: 1000}\n"
        "  fmnist_dpsinkhorn:",
    )
    config.write_text(text.replace("table1_row: paper}", "table1_row: paper, steps: 1000}", 1))
    for seed, (fid, *accs) in enumerate(RESULTS["mnist_dpsinkhorn"]):
        fileio.write_json(out / "mnist_perrow" / f"fid_seed{seed}.json", {"fid": fid + 1})
        for model, acc in zip(["logreg", "mlp", "cnn"], accs, strict=True):
            fileio.write_json(
                out / "mnist_perrow" / f"acc_{model}_seed{seed}.json", {"accuracy": acc}
            )
    block, perrow = _ledger("batch", 1.5, 1000), _ledger("per_sample", 1.5, 1000)
    fileio.write_json(out / "mnist_dpsinkhorn" / "privacy.json", block)
    fileio.write_json(out / "mnist_perrow" / "privacy.json", perrow)
    table1([config], out)
    rows = read_csv(out / "tables" / "table1.csv")
    row = rows[(ROW_LABELS["perrow"], "mnist")]
    assert float(row["epsilon"]) == pytest.approx(perrow["epsilon"], rel=1e-3)
    # same paper-convention ε as the block row, much larger sound ε
    assert (
        row["epsilon_paper_convention"]
        == rows[(ROW_LABELS["paper"], "mnist")]["epsilon_paper_convention"]
    )
    assert perrow["epsilon"] > 10 * block["epsilon"]
    md = (out / "tables" / "table1.md").read_text()
    assert "each generated row clipped to Δ" in md and "as one vector" in md
    assert "noise multiplier 0.212" in md  # σ / √B = 1.5 / √50
    perrow_line = next(line for line in md.splitlines() if "`mnist_perrow` | dp_sinkhorn" in line)
    cells = [c.strip() for c in perrow_line.strip("|").split("|")]
    assert cells[4] == "per_sample"
    assert float(cells[11]) == pytest.approx(perrow["epsilon"], abs=0.01)  # RDP
    assert 0 < float(cells[12]) < float(cells[11])  # PLD is tighter than RDP here
    assert "noise seed was public" not in md


def test_public_noise_seed_is_said_in_the_caption(run):
    config, out = run
    public = _ledger("batch", 1.5, 10, guarantee="none: the noise seed is public")
    fileio.write_json(out / "mnist_dpsinkhorn" / "privacy.json", public)
    table1([config], out)
    md = (out / "tables" / "table1.md").read_text()
    assert "No privacy guarantee for `mnist_dpsinkhorn`: the noise seed was public" in md
    assert "`fmnist_dpsinkhorn`" not in md.split("No privacy guarantee")[1].split("**")[0]


OWN_CONFIG = """
run_name: own
seeds: [0]
evaluation: {num_samples: 40, classifiers: [logreg]}
datasets:
  scans: {path: /data/scans.npz, classes: [benign, malign], title: Scans}
experiments:
  real_scans: {dataset: scans, table1_row: real, method: real_data}
  scans_dp: {dataset: scans, table1_row: paper, conditional: false, steps: 10}
"""


def test_own_dataset_table_and_reproduction_speak_of_that_dataset(tmp_path, monkeypatch):
    """An own dataset's Table 1 is titled by it, has no G-PATE footnote and no sentence
    about two paper-setting rows, calls its unconditional grid one row of samples, and its
    reproduction.md leaves out the committed MNIST results set's section."""
    from dpsinkhorn.config.targets import table_files
    from dpsinkhorn.report.common import load_config_like
    from dpsinkhorn.report.reproduction import reproduction_markdown

    config_file = tmp_path / "own.yaml"
    config_file.write_text(OWN_CONFIG)
    out = tmp_path / "results" / "own"
    config, _ = load_config_like([config_file])
    files = table_files(config, "table1", out)
    for path in map(Path, files["results"]):
        key = "fid" if path.name.startswith("fid") else "accuracy"
        fileio.write_json(path, {key: 0.5})
    ledger = {
        "mechanism": "x",
        "epsilon": 3.0,
        "epsilon_paper_convention": 20.0,
        "clipping": "batch",
        "noise_multiplier": 1.0,
        "sensitivity": 1.0,
    }
    for path in files["privacy"]:
        fileio.write_json(Path(path), ledger)
    for path in files["samples"]:
        fileio.save_samples(Path(path), np.zeros((20, 28, 28), np.uint8), -np.ones(20, np.int64))
    table1([config_file], out)
    text = (out / "tables" / "table1.md").read_text()
    assert text.startswith("# Table 1: DP image generation on Scans\n")
    assert "MNIST" not in text and "G-PATE" not in text
    assert "both paper-setting rows" not in text
    assert "(unconditional: one row of samples)" in text and "one row per class" not in text
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the committed results sets
    md = reproduction_markdown(config, out, [str(config_file)])
    assert "results set" not in md and "H100" not in md and "MNIST" not in md


def test_paper_table_keeps_its_title_footnote_and_mechanism_sentence(run):
    """The paper's datasets keep the paper's title and the G-PATE footnote; the sentence on
    two paper-setting rows appears only where a dataset has both mechanisms."""
    from dpsinkhorn.report.common import Row, mechanism_note
    from dpsinkhorn.report.tables import table1_title

    config, out = run
    table1([config], out)
    text = (out / "tables" / "table1.md").read_text()
    assert text.startswith("# Table 1: DP image generation on MNIST and Fashion-MNIST\n")
    assert "¹ G-PATE" in text
    assert table1_title(["mnist"]) == "Table 1: DP image generation on MNIST"
    ledger = {"clipping": "batch", "noise_multiplier": 1.5, "sensitivity": 1.0}
    one = [Row(ROW_LABELS["paper"], "mnist", "this run", exp_name="a", privacy=ledger)]
    two = one + [Row(ROW_LABELS["perrow"], "mnist", "this run", exp_name="b", privacy=ledger)]
    assert "both paper-setting rows" not in mechanism_note(one)
    assert "both paper-setting rows" in mechanism_note(two)


def test_mechanism_note_names_the_released_code_or_the_papers_text_by_clipping():
    """Table 1's caption says, from each DP row's clipping setting (not its name), whether
    it ran the released code's mechanism (block clipped as one vector) or the paper's
    text (each row clipped); a parameter-gradient row is neither."""
    from dpsinkhorn.report.common import Row, mechanism_note

    def note(**ledger) -> str:
        return mechanism_note(
            [Row("DP-Sinkhorn", "mnist", "this run", exp_name="x", privacy=ledger)]
        )

    assert "the released code's mechanism" in note(clipping="batch")
    assert "the paper's text" not in note(clipping="batch")
    assert "the paper's text (Appendix B.1" in note(clipping="per_sample", perturbation="image")
    parameter = note(clipping="batch", perturbation="parameter")
    assert "released code" not in parameter and "paper's text" not in parameter


def test_readme_row_tag_names_the_mechanism_by_clipping():
    """README.md's Table 1 rows carry the same source, short: from the ledger's clipping."""
    from dpsinkhorn.report.common import mechanism_tag

    assert mechanism_tag({"clipping": "batch"}) == "released code's mechanism"
    assert mechanism_tag({"clipping": "per_sample", "perturbation": "image"}) == "paper's text"
    assert mechanism_tag({"clipping": "batch", "perturbation": "parameter"}) == ""
    assert mechanism_tag({"method": "dpmerf"}) == ""
