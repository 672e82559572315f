"""Config loading and validation, and the workflow's dry run and lint on every shipped config."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import listed_outputs

from dpsinkhorn import config as cfg
from dpsinkhorn.config import studies, targets

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "config").glob("*.yaml"))
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def with_experiment(tmp_path: Path, body: str, defaults: str = "") -> Path:
    """A config file with one experiment ``e`` whose keys are ``body`` (YAML flow map;
    dataset mnist unless ``body`` names one)."""
    body = body if "dataset:" in body else f"dataset: mnist, {body}"
    text = f"training_defaults: {{{defaults}}}\nexperiments:\n  e: {{{body}}}\n"
    return write(tmp_path, text)


def error_of(*paths: Path) -> str:
    with pytest.raises(ValueError) as info:
        cfg.load_config(list(paths))
    return str(info.value)


# ------------------------------------------------------------------------------ loading


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    config = cfg.load_config(path)
    assert config["run_name"] == path.stem.replace("config", "paper")
    assert config["data_mirror"] is None and config["fid_weights"] is None
    rows = cfg.table1_experiments(config)
    for dataset in cfg.datasets(config):
        if dataset == "celeba":  # Tables 3 and 6, not Table 1
            rows = cfg.table_experiments(config, "table3")
            assert cfg.table_experiments(config, "table6")[(dataset, "real")] == "real_celeba"
        assert rows[(dataset, "real")] == f"real_{dataset}"
        assert rows[(dataset, "nonprivate")] == f"{dataset}_nonprivate"
    assert "mnist_dpsinkhorn" in config["experiments"]


def test_paper_config_matches_the_paper_on_celeba():
    """Appendix D.3/D.4 and Table 6 ("under L2 loss"): the CelebA rows."""
    config = cfg.load_config(REPO / "config" / "config.yaml")
    assert cfg.classifiers_of(config, "celeba") == ["mlp", "cnn"]
    assert cfg.classifiers_of(config, "mnist") == ["logreg", "mlp", "cnn"]
    for name, generator in [("celeba_dpsinkhorn", "biggan"), ("celeba_dcgan", "dcgan")]:
        exp = cfg.experiment(config, name)
        assert exp["generator"] == generator and exp["method"] == "dp_sinkhorn"
        settings = ("sigma", "clip", "batch_size", "steps", "delta", "lr", "entropy_reg", "m")
        assert [exp[k] for k in settings] == [1.9, 0.5, 50, 1_700_000, 1e-6, 1e-5, 5.0, 0.0]
        assert (exp["latent_dim"], exp["embed_dim"]) == (32, 4)
    assert cfg.experiment(config, "celeba_dpsinkhorn")["channels"] == [256] * 4
    assert cfg.table_experiments(config, "table6") == {
        ("celeba", "real"): "real_celeba",
        ("celeba", "dcgan"): "celeba_dcgan",
        ("celeba", "biggan"): "celeba_dpsinkhorn",
    }


def test_paper_config_matches_the_paper():
    config = cfg.load_config(REPO / "config" / "config.yaml")
    mnist = cfg.experiment(config, "mnist_dpsinkhorn")
    assert (mnist["sigma"], mnist["clip"], mnist["batch_size"], mnist["steps"]) == (
        1.5,
        0.5,
        50,
        160000,
    )
    assert (mnist["lr"], mnist["p"], mnist["m"], mnist["delta"]) == (1e-4, 0.4, 1.0, 1e-5)
    fmnist = cfg.experiment(config, "fmnist_dpsinkhorn")
    assert (fmnist["sigma"], fmnist["lr"], fmnist["m"], fmnist["steps"]) == (1.9, 1e-5, 3.0, 280000)
    assert cfg.experiment(config, "fmnist_nonprivate")["batch_size"] == 500
    for name in ["mnist_dpsinkhorn_eps10", "fmnist_dpsinkhorn_eps10"]:
        exp = cfg.experiment(config, name)
        assert exp["sigma"] is None and exp["target_epsilon"] == 10
    assert config["seeds"] == [0, 1, 2, 3, 4]
    assert config["evaluation"]["num_samples"] == 60000


def test_schema_defaults_are_the_paper_defaults():
    """Defaults filled from the schema equal config.yaml's training_defaults and evaluation,
    all but FID's features: the paper's GPU runs take tf32 (measured within 0.1% of FID on
    an H100), the default stays IEEE fp32."""
    paper = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    filled = cfg.validate({"experiments": {"e": {"dataset": "mnist"}}})
    assert filled["training_defaults"] == paper["training_defaults"]
    assert filled["evaluation"] == {**paper["evaluation"], "fid_precision": "fp32"}
    assert paper["evaluation"]["fid_precision"] == "tf32"


def test_experiment_keys_mirror_training_keys():
    schema = cfg.load_schema()
    training = set(schema["$defs"]["training"]["properties"])
    experiment = set(schema["$defs"]["experiment"]["properties"])
    assert experiment == training | {"dataset", "table1_row", "rows"}


def test_later_files_override_earlier_ones(tmp_path):
    base = with_experiment(tmp_path, "sigma: 2.0")
    over = write(tmp_path, "seeds: [7]\nexperiments:\n  e: {steps: 5}\n", "over.yaml")
    config = cfg.load_config([base, over])
    assert config["seeds"] == [7]
    exp = cfg.experiment(config, "e")
    assert (exp["sigma"], exp["steps"], exp["name"]) == (2.0, 5, "e")
    assert exp["lr"] == 1e-4  # from the schema defaults


def test_empty_sections_take_defaults(tmp_path):
    config = cfg.load_config(write(tmp_path, "evaluation:\nexperiments:\n  e: {dataset: mnist}\n"))
    assert config["evaluation"]["num_samples"] == 60000


# ---------------------------------------------------------------------------- errors


def test_unknown_key_is_named(tmp_path):
    path = with_experiment(tmp_path, "sigam: 1.0")
    message = error_of(path)
    assert message.startswith(f"{path}: experiments.e.sigam: unknown key (allowed: ")
    assert "sigma" in message


def test_unknown_top_level_and_evaluation_keys(tmp_path):
    path = write(tmp_path, "evaluation: {num_sample: 5}\nexperiments:\n  e: {dataset: mnist}\n")
    assert "evaluation.num_sample: unknown key" in error_of(path)
    path = write(tmp_path, "seed: 1\nexperiments:\n  e: {dataset: mnist}\n")
    assert f"{path}: seed: unknown key" in error_of(path)


def test_wrong_type_names_key_and_value(tmp_path):
    message = error_of(with_experiment(tmp_path, "steps: many"))
    assert "experiments.e.steps: bad value 'many': must be of type integer or null" in message
    message = error_of(with_experiment(tmp_path, "", defaults="delta: 1e-5"))
    assert "training_defaults.delta: bad value '1e-5'" in message and "1.0e-5" in message
    message = error_of(with_experiment(tmp_path, "dataset: cifar10"))
    assert "experiments.e.dataset: bad value 'cifar10': must be one of mnist, fmnist" in message


@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_a_value_that_is_no_finite_number_names_its_file(tmp_path, value):
    """YAML's .nan, unequal to itself, is still traced to the file that holds it."""
    path = with_experiment(tmp_path, f"sigma: {value}")
    assert error_of(path).startswith(f"{path}: experiments.e.sigma: bad value")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("experiments:\n  e: {dataset: mnist, betas: [.nan, 0.9]}\n", "experiments.e.betas.0"),
        (
            "training_defaults: {lr: .nan}\nexperiments:\n  e: {dataset: mnist}\n",
            "training_defaults.lr",
        ),
        (
            "datasets: {d: {path: x, test_fraction: .nan}}\nexperiments:\n  e: {dataset: d}\n",
            "datasets.d.test_fraction",
        ),
        (
            "experiments:\n  e: {dataset: mnist}\nstudies:\n  fig4c:\n    bases: [e]\n"
            "    cells: {a: {p: 0.5}}\n    p_values: [0, 1, .nan]\n",
            "studies.fig4c.p_values.2",
        ),
    ],
)
def test_no_finite_number_is_refused_at_any_depth(tmp_path, text, where):
    """YAML's .nan and .inf pass the schema's bounds wherever they are (a list's item, a
    dataset, a study): each is refused naming its file and key."""
    path = write(tmp_path, text)
    assert error_of(path) == f"{path}: {where}: bad value nan: must be a finite number"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("experiments:\n  e: {dataset: mnist, steps: 1000.0}\n", "experiments.e.steps"),
        ("seeds: [0.0, 1]\nexperiments:\n  e: {dataset: mnist}\n", "seeds.0"),
        (
            "evaluation: {num_samples: 100.0}\nexperiments:\n  e: {dataset: mnist}\n",
            "evaluation.num_samples",
        ),
    ],
)
def test_an_integer_key_takes_no_float(tmp_path, text, where):
    """JSON Schema's integer also takes 1000.0, which training refused without naming the
    file, and which a seed would carry into file names (samples_seed0.0.npz)."""
    path = write(tmp_path, text)
    assert error_of(path).startswith(f"{path}: {where}: bad value ")
    assert "must be of type integer" in error_of(path)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("experiments:\n  1: {dataset: mnist}\n", "experiments.1: bad name 1"),
        (
            "datasets: {yes: {path: x}}\nexperiments:\n  e: {dataset: mnist}\n",
            "datasets.True: bad name True",
        ),
        (
            "datasets: [a]\nexperiments:\n  e: {dataset: mnist}\n",
            "datasets: bad value ['a']: must be of type object",
        ),
    ],
)
def test_keys_that_are_no_text_and_sections_that_are_no_mapping(tmp_path, capsys, text, where):
    """A name YAML reads as a number or a boolean, or a list for a section, is one line
    naming the file and the key (exit 2), not a traceback."""
    path = write(tmp_path, text)
    from dpsinkhorn import cli

    assert cli.main(["targets", "all", "--config", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dpsinkhorn targets: error: {path}: {where}")


def test_an_error_names_the_file_of_a_list_item_a_default_or_a_study(tmp_path):
    """Keys that no file spells out (an item of a list, a key filled from the schema's
    defaults, an experiment made by a study) are traced to the file, not to --config."""
    path = write(
        tmp_path, "datasets: {d: {path: x, classes: [a, '']}}\nexperiments:\n  e: {dataset: d}\n"
    )
    assert error_of(path).startswith(f"{path}: datasets.d.classes.1: bad value ''")
    path = write(tmp_path, "datasets: {d: {path: x.npz}}\nexperiments:\n  e: {dataset: d}\n")
    assert error_of(path).startswith(f"{path}: datasets.d.classes: an .npz dataset needs")
    path = write(tmp_path, "datasets: {mnist: {path: x}}\nexperiments:\n  e: {dataset: mnist}\n")
    assert error_of(path).startswith(f"{path}: datasets.mnist: bad name 'mnist'")
    path = write(
        tmp_path,
        "experiments:\n  e: {dataset: mnist}\n"
        "studies:\n  fig5: {bases: [e], vary: {sigmaa: [1.0]}}\n",
    )
    message = error_of(path)
    assert message.startswith(f"{path}: experiments.fig5_sigmaa1.sigmaa: unknown key")
    assert message.endswith("(an experiment made by studies.fig5)")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"a: [\n", "not valid YAML (line 2, column 1: expected the node content"),
        (bytes(range(256)), "not valid YAML (not UTF-8 text: byte 128)"),
    ],
)
def test_a_file_that_is_no_yaml_is_one_line(tmp_path, capsys, content, problem):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    from dpsinkhorn import cli

    assert cli.main(["targets", "all", "--config", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dpsinkhorn targets: error: {path}: {problem}") and "\\n" not in line


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    """Two experiments of one name (YAML keeps the last without a word) are an error of
    the CLI and of the workflow, naming the file, the line and the key; `<<: *anchor`
    still lets a mapping redefine a merged key."""
    text = (
        "experiments:\n  e: {dataset: mnist, sigma: 1.0}\n"
        "  f: {dataset: mnist, method: real_data}\n  e: {dataset: fmnist, sigma: 2.0}\n"
    )
    path = write(tmp_path, text)
    problem = f"{path}: not valid YAML (line 4, column 3: duplicate key 'e')"
    assert error_of(path) == problem
    from dpsinkhorn import cli

    assert cli.main(["targets", "all", "--config", str(path)]) == 2
    assert capsys.readouterr().err == f"dpsinkhorn targets: error: {problem}\n"
    result = snakemake(tmp_path, "-n", "--configfile", str(path))
    assert result.returncode != 0 and problem in result.stdout + result.stderr
    merged = "training_defaults: &d {lr: 0.1, steps: 5}\nexperiments:\n"
    merged += "  e: {<<: *d, dataset: mnist, steps: 7}\n"
    spec = cfg.experiment(cfg.load_config(write(tmp_path, merged, "m.yaml")), "e")
    assert (spec["lr"], spec["steps"]) == (0.1, 7)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["train", "--device", "tpu"],
            "argument --device: 'tpu': must be auto, cpu, cuda or cuda:N",
        ),
        (
            ["train-sweep", "--device", "cuda:x"],
            "argument --device: 'cuda:x': must be auto, cpu, cuda or cuda:N",
        ),
        (["train", "--stop-after", "0"], "argument --stop-after: must be at least 1, got 0"),
        (
            ["bench", "--device", "gpu"],
            "argument --device: 'gpu': must be auto, cpu, cuda or cuda:N",
        ),
        (["bench", "--steps", "-1"], "argument --steps: must be at least 1, got -1"),
        (["bench", "--warmup", "-1"], "argument --warmup: must be at least 0, got -1"),
        (["bench", "--profile", "-1"], "argument --profile: must be at least 0, got -1"),
        (["plan", "--bench-steps", "0"], "argument --bench-steps: must be at least 1, got 0"),
        (
            ["plan", "--steps-per-s", "nan"],
            "argument --steps-per-s: must be a positive number of steps/s, got nan",
        ),
        (
            ["plan", "--steps-per-s", "-1"],
            "argument --steps-per-s: must be a positive number of steps/s, got -1",
        ),
    ],
)
def test_command_line_devices_and_counts_are_checked(tmp_path, capsys, argv, error):
    """A --device torch cannot name, or a count below its least (0 steps timed: 0 steps/s,
    -1: a negative rate; --stop-after 0: exit 75 with no step), exits 2 naming the option
    and the value, before anything runs."""
    from dpsinkhorn import cli

    command, *options = argv
    required = {
        "train": ["--experiment", "e", "--out", str(tmp_path / "o")],
        "train-sweep": ["--experiments", "e", "--out-root", str(tmp_path)],
        "bench": ["--experiment", "e"],
        "plan": [],
    }[command]
    quick = str(REPO / "config" / "quick.yaml")
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--config", quick, *required, *options])
    assert stop.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line == f"dpsinkhorn {command}: error: {error}"


def test_an_unreadable_file_is_one_line(tmp_path, capsys):
    """A config file that exists but cannot be read: exit 2 naming it, no traceback."""
    path = tmp_path / "c.yaml"
    path.write_text("experiments: {e: {dataset: mnist}}\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads it anyway; /proc/self/mem fails with EIO
        path = Path("/proc/self/mem")
    if not path.is_file():
        pytest.skip("no unreadable file here")
    from dpsinkhorn import cli

    assert cli.main(["targets", "all", "--config", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"dpsinkhorn targets: error: {path}: cannot read the config file (")


def test_an_output_path_under_a_file_is_one_line(tmp_path, capsys):
    """An output folder that cannot be made (a file where a folder belongs, e.g. a
    data_dir that names a file): exit 2, one line naming the path, no traceback."""
    (tmp_path / "file").write_text("")
    from dpsinkhorn import cli

    out = tmp_path / "file" / "fixture"
    assert cli.main(["celeba-fixture", "--out", str(out), "--num", "10"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dpsinkhorn celeba-fixture: error: [Errno 20] Not a directory: ")
    assert str(out) in line


def test_num_samples_is_at_least_what_fid_needs(tmp_path):
    """evaluation.num_samples: 1 would stop every evaluation job, after the trainings, with
    `--num must be at least 2` (FID needs 2 images): it is refused when the config is read."""
    text = "evaluation: {num_samples: 1}\nexperiments:\n  e: {dataset: mnist}\n"
    message = error_of(write(tmp_path, text))
    assert message == f"{tmp_path / 'c.yaml'}: evaluation.num_samples: bad value 1: must be >= 2"


@pytest.mark.parametrize("sigma", [0, -1.5])
def test_sigma_must_be_positive(tmp_path, sigma):
    message = error_of(with_experiment(tmp_path, f"sigma: {sigma}"))
    assert f"experiments.e.sigma: bad value {sigma}: must be > 0" in message


@pytest.mark.parametrize(
    ("body", "key", "text"),
    [
        ("sigma: null, steps: null", "sigma", "give at least one"),
        ("sigma: null", "target_epsilon", "target_epsilon is needed"),
        ("method: sinkhorn, steps: null", "steps", "needs steps"),
        ("batch_size: 0", "batch_size", "must be >= 1"),
        ("p: 1.5", "p", "must be <= 1"),
        ("delta: 1.0", "delta", "must be < 1"),
        ("table1_row: real", "table1_row", "needs method real_data"),
        ("table1_row: sound10", "table1_row", "target_epsilon: 10"),
        ("table1_row: perrow", "table1_row", "needs clipping: per_sample, not batch"),
    ],
)
def test_semantic_errors_name_the_key(tmp_path, body, key, text):
    message = error_of(with_experiment(tmp_path, body))
    assert f"experiments.e.{key}: " in message and text in message


@pytest.mark.parametrize("name", [*cfg.RUN_FOLDERS, "Logs"])
def test_an_experiment_never_takes_a_folder_of_the_run(tmp_path, capsys, name):
    """results/<run>/<name> is a DP release's folder: a name of one of the run's own folders
    (config.RUN_FOLDERS, in any case) is refused in one line naming it and its file."""
    path = write(
        tmp_path, f"experiments:\n  {name}: {{dataset: mnist}}\n  ok: {{dataset: mnist}}\n"
    )
    from dpsinkhorn import cli

    assert cli.main(["targets", "all", "--config", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{path}: experiments.{name}: bad name {name!r}: results/<run>/ already has" in line
    folders = {*re.findall(r"\(([^;]*);", line)[0].split(", ")}
    assert folders == {"nonprivate", "tables", "figures", "logs", "benchmarks"}
    renamed = write(tmp_path, f"experiments:\n  {name}_dp: {{dataset: mnist}}\n", "ok.yaml")
    assert cfg.load_config(renamed)["experiments"]


def test_experiment_names_differ_in_more_than_case(tmp_path):
    """`Mnist_dp` and `mnist_dp` would share results/<run>/mnist_dp/ on a case-insensitive
    disk: refused, naming both."""
    text = "experiments:\n  mnist_dp: {dataset: mnist}\n  Mnist_dp: {dataset: mnist}\n"
    message = error_of(write(tmp_path, text))
    assert message == (
        f"{tmp_path / 'c.yaml'}: experiments.Mnist_dp: bad name 'Mnist_dp': differs from "
        "experiment 'mnist_dp' only in case, and the two would share one folder on a "
        "case-insensitive disk; rename one"
    )


def test_fid_precision_is_checked(tmp_path):
    """Only fp32, tf32 and fp16 are offered; the removed ``evaluation.fast`` key is refused."""
    experiments = "experiments:\n  e: {dataset: mnist}\n"
    path = write(tmp_path, "evaluation: {fid_precision: bf16}\n" + experiments)
    message = error_of(path)
    assert "evaluation.fid_precision: bad value 'bf16': must be one of fp32, tf32, fp16" in message
    assert "fast" in error_of(write(tmp_path, "evaluation: {fast: true}\n" + experiments))
    for precision in ("tf32", "fp16"):
        path = write(tmp_path, f"evaluation: {{fid_precision: {precision}}}\n" + experiments)
        assert cfg.load_config(path)["evaluation"]["fid_precision"] == precision


def test_real_data_needs_no_sigma_or_steps(tmp_path):
    cfg.load_config(with_experiment(tmp_path, "method: real_data, sigma: null, steps: null"))


def test_duplicate_table1_row(tmp_path):
    text = "experiments:\n  a: {dataset: mnist, table1_row: paper}\n"
    text += "  b: {dataset: mnist, table1_row: paper}\n"
    assert "experiments.b.table1_row: mnist row 'paper' is already filled by a" in error_of(
        write(tmp_path, text)
    )


def test_error_names_the_file_that_set_the_key(tmp_path):
    base = with_experiment(tmp_path, "sigma: 1.0")
    over = write(tmp_path, "experiments:\n  e: {sigma: -2}\n", "over.yaml")
    assert error_of(base, over).startswith(f"{over}: experiments.e.sigma:")


def test_validate_on_a_dict_names_command_line_values(tmp_path):
    path = with_experiment(tmp_path, "sigma: 1.0")
    config = cfg.deep_merge(yaml.safe_load(path.read_text()), {"device": "gpu"})
    with pytest.raises(ValueError, match=r"^--config: device: bad value 'gpu'"):
        cfg.validate(config, [path])


def test_unknown_experiment_lists_known_ones():
    config = cfg.load_config(REPO / "config" / "quick.yaml")
    with pytest.raises(ValueError, match="unknown experiment 'nope' .*mnist_dpsinkhorn"):
        cfg.experiment(config, "nope")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        cfg.load_config(tmp_path / "nope.yaml")


def test_check_overrides(tmp_path):
    path = REPO / "config" / "quick.yaml"
    config = cfg.load_config(path)
    cfg.check_overrides({**config, "data_mirror": "/x", "device": "cpu"}, [path])
    with pytest.raises(ValueError, match="seeds must be changed in a config file"):
        cfg.check_overrides({**config, "seeds": [3]}, [path])


def test_workflow_helpers():
    config = cfg.load_config(REPO / "config" / "quick.yaml")
    assert cfg.trained_experiments(config) == [
        "mnist_nonprivate",
        "mnist_dpsinkhorn",
        "mnist_dpmerf",
    ]
    assert cfg.real_experiments(config) == ["real_mnist"]
    assert cfg.figure_experiment(config, "mnist") == "mnist_dpsinkhorn"
    assert re.fullmatch(cfg.wildcard_regex(["a_b", "c"]), "a_b")
    assert not re.fullmatch(cfg.wildcard_regex([]), "")
    assert cfg.config_file_args([Path.cwd() / "x.yaml", "./y.yaml"]) == "x.yaml y.yaml"


# ------------------------------------------------------------------------- workflow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the repo's workflow in ``workdir`` (so the checkout gets no .snakemake/)."""
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^([\w-]+)\s+(\d+)$", table, re.M)}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_dry_run_lists_every_job(tmp_path, path):
    result = snakemake(tmp_path, "-n", "--configfile", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    config = cfg.load_config(path)
    n_trained = len(cfg.trained_experiments(config))
    counts = job_counts(result.stdout)
    assert counts == {
        "data": len(cfg.datasets(config)),
        "fid_reference": len(cfg.datasets(config)),
        "train": n_trained,
        # one job per experiment: its samples, FID and classifiers, every seed
        **{f"evaluate_{e}": 1 for e in config["experiments"]},
        "table1": 1,
        **dict.fromkeys(cfg.report_tables(config), 1),  # CelebA Tables 3 and 6
        **({"celeba_fixture": 1} if config["celeba_fixture"] else {}),
        **study_job_counts(config),
        "all": 1,
        "total": sum(counts.values()) - counts["total"],
    }
    files = " ".join(map(str, [path]))
    assert f"dpsinkhorn train --config {files} --experiment mnist_dpsinkhorn" in result.stdout
    # evaluation.fid_precision reaches every evaluation job, and fp32 leaves the command as it was
    precision = config["evaluation"]["fid_precision"]
    evaluations = [line for line in result.stdout.splitlines() if "dpsinkhorn evaluate " in line]
    assert len(evaluations) == len(config["experiments"])
    for line in evaluations:
        if precision == "fp32":
            assert "--fid-precision" not in line
        else:
            assert f"--fid-precision {precision}" in line and "--fast" not in line


def test_dry_run_with_sweeps_trains_each_experiment_once(tmp_path):
    """--config sweep_runs=4: compatible experiments share one train-sweep job each."""
    path = REPO / "config" / "smoke.yaml"
    result = snakemake(tmp_path, "-n", "--configfile", str(path), "--config", "sweep_runs=4")
    assert result.returncode == 0, result.stdout + result.stderr
    config = {**cfg.load_config(path), "sweep_runs": 4}
    alone, sweeps = targets.training_jobs(config)
    assert sweeps and all(2 <= len(group) <= 4 for group in sweeps)
    trained = [name for group in sweeps for name in group] + alone
    assert sorted(trained) == sorted(cfg.trained_experiments(config))
    counts = job_counts(result.stdout)
    assert counts["train"] == len(alone)
    assert {rule for rule in counts if rule.startswith("train_sweep_")} == {
        f"train_sweep_{group[0]}" for group in sweeps
    }
    for group in sweeps:
        assert f"--experiments {' '.join(group)} --out-root results/smoke" in result.stdout


def study_job_counts(config: dict) -> dict[str, int]:
    """Jobs of the rules in studies.smk: Tables 2/4/5, Figures 2/4/5/7, reproduction.md."""
    names = targets.available(config)
    counts = {
        "study_table": len([n for n in names if n in studies.TABLE_STUDIES]),
        "study_figure": len(
            [n for n in names if n in (*studies.FIGURE_STUDIES, *targets.SAMPLE_FIGURES)]
        ),
        "grad_study": len(targets.cell_experiments(config, "fig4c")) if "fig4c" in names else 0,
        "reproduction": 1,
        "privacy_summary": 1,  # report.smk: accounting across releases, release manifest
        "release_manifest": 1,
    }
    return {k: v for k, v in counts.items() if v}


def test_dry_run_default_config_and_overrides(tmp_path):
    """No --configfile: config/config.yaml; --config passes the mirror and weights on."""
    overrides = ["data_mirror=../m", "fid_weights=w.pth", "device=cpu"]
    result = snakemake(tmp_path, "-n", "--config", *overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    # Table 1: 12 MNIST / Fashion-MNIST (2 DP-MERF), Tables 3/6: 4 CelebA (1 DP-MERF), studies:
    # 43 more, and the sound ε = 10 study 22 (its b50 cell is mnist_dpsinkhorn_eps10, b50_s1p1
    # mnist_sound_official).
    assert job_counts(result.stdout)["train"] == 16 + 43 + 22
    # the mirror as its real path (relative to the working directory tmp_path)
    mirror = os.path.realpath(tmp_path / ".." / "m")
    assert f"dpsinkhorn data --dataset mnist --root data --mirror {mirror}" in result.stdout
    assert "--weights w.pth --device cpu" in result.stdout
    paper = REPO / "config" / "config.yaml"
    assert f"--config {paper} --experiment fmnist_dpsinkhorn_eps10" in result.stdout


def test_workflow_reports_config_errors_like_the_cli(tmp_path):
    bad = write(tmp_path, (REPO / "config" / "quick.yaml").read_text() + "extra: 1\n")
    result = snakemake(tmp_path, "-n", "--configfile", str(bad))
    assert result.returncode != 0
    assert error_of(bad) in result.stdout + result.stderr
    result = snakemake(
        tmp_path, "-n", "--configfile", str(REPO / "config" / "quick.yaml"), "--config", "seeds=[1]"
    )
    assert result.returncode != 0
    assert "seeds" in result.stdout + result.stderr


def test_workflow_names_an_own_dataset_path_that_is_not_there(tmp_path):
    """datasets.<name>.path missing: the dry run stops with one message naming the file,
    the key and the path (not a Snakemake input-function traceback from the captions)."""
    text = (REPO / "config" / "quick.yaml").read_text()
    text += "datasets:\n  mine: {path: no-such-folder, image_size: 28}\n"
    path = write(tmp_path, text)
    result = snakemake(tmp_path, "-n", "--configfile", str(path))
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "InputFunctionException" not in output
    assert f"{path}: datasets.mine.path: no-such-folder: no such file or folder" in output


def test_single_cell_reruns_alone(tmp_path):
    """With every file in place, asking again for one classifier cell is one job: its
    experiment's evaluation (one process evaluates the whole generator)."""
    quick = REPO / "config" / "quick.yaml"
    plan = snakemake(tmp_path, "-n", "--configfile", str(quick))
    outputs = re.findall(r"^ +output: (.+)$", plan.stdout, re.M)
    order = re.findall(r"^ *rule (\w+):$", plan.stdout, re.M)
    assert len(outputs) == len(order) - 1  # `all` has no output
    # Create outputs upstream first: data, train, fid_reference, then the rest.
    rank = {"data": 0, "train": 1, "fid_reference": 2}
    jobs = sorted(zip(order[: len(outputs)], outputs, strict=True), key=lambda j: rank.get(j[0], 3))
    mtime = 1_700_000_000
    for rule, files in jobs:
        mtime += 10 if rule != "table1" else 100
        for name in listed_outputs(files):
            file = tmp_path / name
            file.parent.mkdir(parents=True, exist_ok=True)
            file.touch()
            os.utime(file, (mtime, mtime))
    uptodate = snakemake(tmp_path, "-n", "--configfile", str(quick))
    assert "Nothing to be done" in uptodate.stdout + uptodate.stderr
    target = "results/quick/mnist_dpsinkhorn/acc_cnn_seed0.json"
    rule = "evaluate_mnist_dpsinkhorn"
    result = snakemake(tmp_path, target, "-n", "--forcerun", rule, "--configfile", str(quick))
    assert result.returncode == 0, result.stdout + result.stderr
    assert job_counts(result.stdout) == {rule: 1, "total": 1}


def test_lint(tmp_path):
    result = snakemake(tmp_path, "--lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_command_line_booleans_are_explained():
    with pytest.raises(ValueError, match="only True and False"):
        cfg.validate(
            {"cuda_graphs": "true", "experiments": {"e": {"dataset": "mnist"}}}, "--config"
        )


def test_data_mirror_is_one_parameter_however_spelled(tmp_path, monkeypatch):
    """Relative, absolute and symlinked spellings of one mirror validate to its real path,
    and a built-in dataset whose sources are MD5-checked has one identity for any mirror."""
    from dpsinkhorn.config.workflow import data_identity

    (tmp_path / "mirror").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mirror")
    monkeypatch.chdir(tmp_path / "mirror")
    quick = cfg.load_config([REPO / "config" / "quick.yaml"])
    real = os.path.realpath(tmp_path / "mirror")
    for spelling in ("../mirror", ".", str(tmp_path / "link"), f"{tmp_path}/mirror/"):
        assert cfg.validate({**quick, "data_mirror": spelling})["data_mirror"] == real
    assert cfg.validate(quick)["data_mirror"] is None
    identities = {
        data_identity(cfg.validate({**quick, "data_mirror": m}), "mnist") for m in (None, ".", "/x")
    }
    assert len(identities) == 1
    celeba = {data_identity({**quick, "data_mirror": m}, "celeba") for m in (None, real, "/x")}
    assert len(celeba) == 3


def test_every_output_has_a_title_a_kind_and_celeba_tables_a_figure():
    from dpsinkhorn.config.experiments import TABLE_ROWS

    assert set(targets.TITLES) == set(targets.NAMES)
    assert set(targets.NAMES) == {
        *targets.MAIN_TABLES,
        *studies.TABLE_STUDIES,
        *studies.FIGURE_STUDIES,
        *targets.SAMPLE_FIGURES,
        "reproduction",
    }
    assert set(targets.CELEBA_TABLES) == set(TABLE_ROWS) == set(targets.TABLE_FIGURES)


def test_a_device_torch_or_this_machine_lacks_is_one_line(tmp_path, capsys):
    """Commands whose --device reaches ``devices.resolve_device`` (plan, fid-stats, ...):
    a name outside auto/cpu/cuda/cuda:N, or CUDA on a machine without it, exits 2 in one
    line naming the device, before anything runs."""
    import torch

    from dpsinkhorn import cli

    quick = str(REPO / "config" / "quick.yaml")
    cases = [("tpu", "must be auto, cpu, cuda or cuda:N")]
    if not torch.cuda.is_available():
        cases.append(("cuda:0", "this machine has no CUDA device (use cpu or auto)"))
    for device, said in cases:
        assert cli.main(["plan", "--config", quick, "--device", device]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dpsinkhorn plan: error: device {device!r}: {said}"], err


def test_paths_with_spaces_reach_every_command_as_one_argument(tmp_path):
    """A data_dir, FID weights and config file whose paths hold spaces: every command the
    workflow would run (dry run, ``-p``) splits, as the shell splits it, into the whole
    paths (data, fid-stats, evaluate on generated and on real data)."""
    import shlex

    folder = tmp_path / "my configs"
    folder.mkdir()
    quick = yaml.safe_load((REPO / "config" / "quick.yaml").read_text())
    configfile = folder / "quick.yaml"
    configfile.write_text(yaml.safe_dump({**quick, "data_dir": "my data"}))
    weights = tmp_path / "fid weights.pth"
    result = snakemake(
        tmp_path / "w",
        "-n",
        "-p",
        "--configfile",
        str(configfile),
        "--config",
        f"fid_weights={weights}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    commands = [
        shlex.split(line.removeprefix("Shell command: ").split(" > ")[0])
        for line in result.stdout.splitlines()
        if line.startswith("Shell command: ") and "dpsinkhorn" in line
    ]
    ran = {args[args.index("dpsinkhorn") + 1] for args in commands}
    assert {"data", "train", "fid-stats", "evaluate"} <= ran, ran
    for args in commands:
        assert "my" not in args and "data/mnist/train.npz" not in args, args
        assert str(configfile) in args or "--config" not in args, args
        if "--weights" in args:
            assert args[args.index("--weights") + 1] == str(weights)
    roots = [a[a.index("--root") + 1] for a in commands if "--root" in a]
    assert roots and set(roots) == {"my data"}
    tests = [a[a.index("--test") + 1] for a in commands if "--test" in a]
    assert tests and all(t.startswith("my data/") for t in tests)


def test_a_seed_torch_cannot_take_is_refused_naming_its_key(tmp_path):
    """torch seeds its generators with at most 2**64 - 1 (more: "Overflow when unpacking
    long long" at train or evaluation time); the config says so naming the key."""
    import torch

    torch.Generator().manual_seed(2**64 - 1)  # the largest it takes
    with pytest.raises(ValueError, match="Overflow"):
        torch.Generator().manual_seed(2**64)
    path = tmp_path / "c.yaml"
    path.write_text(
        f"experiments:\n  e:\n    dataset: mnist\n    seed: {2**64}\nseeds: [{2**64}]\n"
    )
    with pytest.raises(ValueError) as refused:
        cfg.load_config([path])
    lines = str(refused.value).splitlines()
    assert f"{path}: experiments.e.seed: bad value {2**64}: must be <= {2**64 - 1}" in lines
    assert f"{path}: seeds.0: bad value {2**64}: must be <= {2**64 - 1}" in lines
