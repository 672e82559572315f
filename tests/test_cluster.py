"""What SLURM jobs ask for (dpsinkhorn.config.cluster, profiles/slurm), without a cluster.

A dry run of config/config.yaml through profiles/slurm lists every job with its resources;
each experiment's evaluation is one job (evaluate_<exp>).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpsinkhorn import config as cfg
from dpsinkhorn import plan
from dpsinkhorn.config import cluster

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
PAPER = REPO / "config" / "config.yaml"
QUICK = REPO / "config" / "quick.yaml"
PROFILE = REPO / "profiles" / "slurm"
H100 = REPO / "results-paper-scale" / "mnist-paper-setting-h100" / "step_rates.json"
DAY = 24 * 60


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """The repo's workflow in ``workdir`` (the checkout gets no .snakemake/)."""
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def local_rules() -> set[str]:
    """The Snakefile's ``localrules`` (they run where Snakemake runs, never as a job)."""
    block = (REPO / "Snakefile").read_text().split("localrules:")[1].split("\n\n")[0]
    return set(re.findall(r"(\w+),", block))


def dry_run_jobs(output: str) -> list[dict]:
    """Every job of a dry run: rule, wildcards, runtime, slurm_extra and group (or None)."""
    jobs, group = [], None
    for block in re.split(r"\n(?=\[[^\]]+\] Group job | *rule [\w-]+:)", output):
        header = re.match(r"\[[^\]]+\] Group job (\S+)", block)
        if header:
            group = header.group(1)
            continue
        rule = re.match(r"( *)rule ([\w-]+):", block)
        if not rule:
            continue
        wildcards = re.search(r"wildcards: (.*)", block)
        runtime = re.search(r"runtime=(\d+)", block)
        extra = re.search(r"slurm_extra=('[^']*')", block)
        jobs.append(
            {
                "rule": rule.group(2),
                "wildcards": dict(w.split("=", 1) for w in wildcards.group(1).split(", "))
                if wildcards
                else {},
                "runtime": int(runtime.group(1)) if runtime else None,
                "slurm_extra": extra.group(1) if extra else None,
                "group": group if rule.group(1) else None,  # group members are indented
            }
        )
    return jobs


@pytest.fixture(scope="module")
def paper_jobs(tmp_path_factory) -> list[dict]:
    result = snakemake(
        tmp_path_factory.mktemp("paper"),
        "-n",
        "--profile",
        str(PROFILE),
        "--configfile",
        str(PAPER),
        "--config",
        "sweep_runs=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dry_run_jobs(result.stdout)


def test_paper_config_asks_at_most_a_day_per_job(paper_jobs):
    slurm = [j for j in paper_jobs if j["rule"] not in local_rules()]
    assert all(j["runtime"] is not None for j in slurm)
    assert max(j["runtime"] for j in slurm) <= DAY
    assert not any(j["group"] for j in slurm)  # no group jobs: evaluation is one rule


def test_mnist_training_asks_for_its_measured_time(tmp_path):
    """The 160k-step MNIST training: 160,000 / 516.85 steps/s (H100) x 3 + 10 min."""
    result = snakemake(
        tmp_path,
        "results/paper/mnist_dpsinkhorn/generator.pt",
        "-n",
        "--profile",
        str(PROFILE),
        "--configfile",
        str(PAPER),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (train,) = [j for j in dry_run_jobs(result.stdout) if j["rule"] == "train"]
    assert train["runtime"] == math.ceil(160000 / 516.85 / 60 * 3 + 10) == 26
    assert train["runtime"] <= 12 * 60


def test_profile_slurm_works_as_typed(tmp_path):
    """`snakemake --profile slurm`, typed in the checkout's root, finds the shipped profile
    (the top-level link ``slurm`` -> profiles/slurm: Snakemake looks for a profile name
    relative to the current directory first) with the workflow profile on top of it."""
    assert (REPO / "slurm").is_symlink() and (REPO / "slurm").resolve() == PROFILE.resolve()
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [
            "snakemake",
            "results/quick/mnist_dpsinkhorn/generator.pt",
            "--profile",
            "slurm",
            "-n",
            "-d",
            str(tmp_path),
            "--configfile",
            str(QUICK),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    used = "Using profiles slurm and workflow specific profile profiles/default"
    assert used in result.stdout + result.stderr
    # the shipped profile's setting for the training
    assert re.search(r"rule train:[^\[]*slurm_extra='?--signal=TERM@300", result.stdout)


def test_sweeps_get_the_signal_and_a_rate_based_request(paper_jobs):
    sweeps = [j for j in paper_jobs if j["rule"].startswith("train_sweep_")]
    assert sweeps
    assert all(j["slurm_extra"] == cluster.SLURM_SIGNAL for j in sweeps)
    # the B 50 MNIST sweeps of 8: 160,000 sweep steps at the measured 114.84 sweep steps/s
    b50 = [j for j in sweeps if j["rule"] == "train_sweep_table2_param_l2"]
    assert [j["runtime"] for j in b50] == [math.ceil(160000 / 114.84 / 60 * 3 + 10)]


def test_evaluation_of_one_experiment_is_one_job(paper_jobs):
    """One evaluate_<exp> job per experiment, asking for its nominal minutes, at most a day."""
    config = cfg.load_config([PAPER])
    evaluation = [j for j in paper_jobs if j["rule"].startswith("evaluate_")]
    assert sorted(j["rule"] for j in evaluation) == sorted(
        f"evaluate_{e}" for e in cfg.experiment_names(config)
    )
    for job in evaluation:
        exp = job["rule"].removeprefix("evaluate_")
        assert job["runtime"] == cluster.eval_runtime_minutes(config, exp) <= DAY, job
    assert not [j for j in paper_jobs if j["rule"] in ("sample", "fid", "classify")]


def test_slurm_jobs_are_trainings_references_studies_and_one_evaluation_per_experiment(
    paper_jobs,
):
    config = cfg.load_config([PAPER])
    config["sweep_runs"] = 8
    remote = [j["rule"] for j in paper_jobs if j["rule"] not in local_rules()]
    assert sum(r.startswith("evaluate_") for r in remote) == len(cfg.experiment_names(config))
    kinds = ("train", "train_sweep_", "fid_reference", "grad_study", "evaluate_")
    assert all(any(r == k or (k.endswith("_") and r.startswith(k)) for k in kinds) for r in remote)


def test_profile_signal_and_retries_cover_the_chains():
    profile = yaml.safe_load((PROFILE / "config.v8+.yaml").read_text())
    assert profile["set-resources"]["train"]["slurm_extra"] == cluster.SLURM_SIGNAL
    assert profile["preemptible-rules"] == ["train"]
    assert profile["preemptible-retries"] == cluster.UNKNOWN_CHAIN_RETRIES
    assert "group-components" not in profile
    config = cfg.load_config([PAPER])
    requests = cluster.Requests(config, [REPO])
    needed = max(requests(e).retries for e in cfg.trained_experiments(config))
    assert needed <= profile["preemptible-retries"]


def test_a_long_training_runs_as_a_chain():
    config = cfg.load_config([PAPER])
    config["cluster"] = {**config["cluster"], "max_job_minutes": 20}  # 5 min to train each
    request = cluster.train_request(config, ["mnist_dpsinkhorn"], cluster.load_rates(H100))
    train_minutes = 160000 / 516.85 / 60 * 3
    assert request.minutes == 20 and request.chain_jobs == math.ceil(train_minutes / 5) == 4
    assert request.retries == 3 + cluster.OTHER_RETRIES


def test_a_short_training_asks_for_more_than_the_signal_lead():
    """A limit under the SIGTERM lead would signal the job as it starts: never asked."""
    config = cfg.load_config([PAPER])
    config["cluster"] = {**config["cluster"], "startup_minutes": 0, "safety_factor": 1}
    config["experiments"]["mnist_dpsinkhorn"]["steps"] = 1000  # ~2 s at the H100's rate
    request = cluster.train_request(config, ["mnist_dpsinkhorn"], cluster.load_rates(H100))
    assert request.estimate_minutes < 1
    assert request.minutes == cluster.SIGNAL_LEAD_MINUTES + 1 and request.chain_jobs == 1


def test_unmeasured_shape_asks_for_the_cap():
    config = cfg.load_config([PAPER])
    rates = cluster.load_rates(H100)
    request = cluster.train_request(config, ["celeba_dpsinkhorn"], rates)
    assert request.minutes == DAY and request.chain_jobs is None
    assert "no measured step rate for celeba B" in request.note
    assert request.retries == cluster.UNKNOWN_CHAIN_RETRIES
    solved = cluster.train_request(config, ["table4_s1p1_c1p0_p0p2_m1"], rates)
    assert solved.minutes == DAY and "solved from target_epsilon" in solved.note


def test_rates_are_keyed_by_the_steps_shape_not_the_datasets_name():
    """Fashion-MNIST (28 x 28 x 1, B 50, the paper's DCGAN) takes MNIST's measured rate; an
    own dataset of the same shape too; CelebA (32 x 32 x 3), another batch size, image size
    or generator do not."""
    rates = cluster.load_rates(H100)
    own = {
        "dataset": "digits",
        "batch_size": 50,
        "dataset_definition": {"image_size": 28, "channels": 1},
    }
    for spec in ({"dataset": "fmnist", "batch_size": 50}, own):
        rate, source = cluster.matching_rate(rates, spec, 1)
        assert rate == 516.85 and source.startswith("measured")
    for spec in (
        {"dataset": "celeba", "batch_size": 50},
        {"dataset": "fmnist", "batch_size": 64},
        {**own, "dataset_definition": {"image_size": 32, "channels": 1}},
        {**own, "generator": "biggan", "channels": [256, 256, 256, 256]},
    ):
        assert cluster.matching_rate(rates, spec, 1) == (None, "")


def test_sweep_without_a_sweep_rate_takes_the_single_rate_per_run():
    spec = {"dataset": "mnist", "batch_size": 50}
    rate, source = cluster.matching_rate(cluster.load_rates(H100), spec, 16)
    assert rate == pytest.approx(516.85 / 16) and source.startswith("single-run rate / 16")


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "step-rate file not found (cluster.step_rates)"),
        ("{not json", "not a readable JSON step-rate file"),
        ('{"rates": []}', "needs a non-empty list 'rates'"),
        ('{"rates": [{"dataset": "mnist", "batch_size": 50, "runs": 1}]}', "has no 'steps_per_s'"),
    ],
)
def test_bad_rate_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "rates.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError) as err:
        cluster.load_rates(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_workflow_names_a_missing_rate_file(tmp_path):
    conf = tmp_path / "c.yaml"
    data = yaml.safe_load(QUICK.read_text())
    data["cluster"] = {"step_rates": "no/such/rates.json"}
    conf.write_text(yaml.safe_dump(data))
    result = snakemake(tmp_path, "-n", "--configfile", str(conf))
    assert result.returncode != 0
    assert "no/such/rates.json: step-rate file not found" in result.stdout + result.stderr


def test_plan_names_a_malformed_rate_file(tmp_path, capsys):
    from dpsinkhorn import cli

    conf = tmp_path / "c.yaml"
    data = yaml.safe_load(QUICK.read_text())
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"rates": [{"dataset": "mnist"}]}))
    data["cluster"] = {"step_rates": str(rates)}
    conf.write_text(yaml.safe_dump(data))
    assert cli.main(["plan", "--config", str(conf), "--rates"]) == 2
    assert f"{rates}: rates[0] has no 'batch_size'" in capsys.readouterr().err


@pytest.mark.parametrize("minutes", [1, 15])
def test_max_job_minutes_must_leave_time_to_train(minutes):
    with pytest.raises(ValueError) as err:
        cfg.validate(
            {"cluster": {"max_job_minutes": minutes}, "experiments": {"e": {"dataset": "mnist"}}},
            "c.yaml",
        )
    assert str(err.value) == (
        f"c.yaml: cluster.max_job_minutes: bad value {minutes}: must exceed the SIGTERM lead "
        "(5 min) + cluster.startup_minutes (10 min) = 15 min, or a job never trains"
    )


def test_evaluation_job_asks_its_nominal_minutes_within_the_cap():
    """Per seed: sampling 1 h (trained experiments only), FID 2 h, each classifier 4 h."""
    config = cfg.load_config([PAPER])
    config["seeds"] = [0]
    assert cluster.eval_runtime_minutes(config, "mnist_dpsinkhorn") == 60 + 120 + 3 * 240
    assert cluster.eval_runtime_minutes(config, "real_mnist") == 120 + 3 * 240
    assert cluster.eval_runtime_minutes(config, "celeba_dpsinkhorn") == 60 + 120 + 2 * 240
    config["seeds"] = [0, 1, 2, 3, 4]
    for name in ("mnist_dpsinkhorn", "real_mnist", "celeba_dpsinkhorn"):
        assert cluster.eval_runtime_minutes(config, name) == config["cluster"]["max_job_minutes"]


def test_every_job_keeps_under_a_smaller_cap(tmp_path):
    """max_job_minutes 60: no SLURM job of the paper's config asks for more."""
    site = tmp_path / "site.yaml"
    site.write_text("cluster:\n  max_job_minutes: 60\n")
    result = snakemake(
        tmp_path, "-n", "--profile", str(PROFILE), "--configfile", str(PAPER), str(site)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    slurm = [j for j in dry_run_jobs(result.stdout) if j["rule"] not in local_rules()]
    assert max(j["runtime"] for j in slurm) <= 60
    assert any(j["rule"].startswith("evaluate_") and j["runtime"] == 60 for j in slurm)


def test_safety_factor_must_be_finite():
    with pytest.raises(ValueError, match=r"cluster.safety_factor: bad value inf: must be a finite"):
        cfg.validate(
            {"cluster": {"safety_factor": math.inf}, "experiments": {"e": {"dataset": "mnist"}}},
            "c.yaml",
        )


def test_plan_prints_the_request_the_rule_makes():
    config = cfg.load_config([PAPER])
    rates = cluster.load_rates(H100)
    (job,) = plan.plan_from_rates(config, rates, ["mnist_dpsinkhorn"])["jobs"]
    request = cluster.Requests(config, [REPO])("mnist_dpsinkhorn")
    assert job["request_minutes"] == request.minutes == 26 and job["chain_jobs"] == 1
