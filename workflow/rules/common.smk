# Shared settings, paths and input functions. All logic lives in dpsinkhorn.config.

import shlex
from pathlib import Path

from dpsinkhorn.config import (
    BENCHMARKS_DIR,
    FIGURES_DIR,
    LOGS_DIR,
    TABLES_DIR,
    all_classifiers,
    check_overrides,
    config_file_args,
    data_inputs,
    data_mirror_of,
    dataset_of,
    datasets,
    evaluation_dir,
    experiment_classifiers,
    experiment_dir,
    experiment_home,
    experiment_names,
    experiment_spec,
    figure_datasets,
    prepared_folder_of,
    prepare_workflow_process,
    private_experiments,
    real_experiments,
    table1_experiments,
    trained_experiments,
    validate,
    wildcard_regex,
)
from dpsinkhorn.config import targets
from dpsinkhorn.config.cluster import (
    SLURM_SIGNAL,
    Requests,
    capped_minutes,
    eval_runtime_minutes,
)
from dpsinkhorn.config.workflow import (
    check_dataset_paths,
    check_kept_outputs,
    data_identity,
    data_source_args,
    gradient_settings,
    killed_writers_folders,
    private_trainings,
    remove_killed_writers_temps,
)
from dpsinkhorn.privacy.trainings import RECORD_DIR, finished_copy_dir, refuse_changed_settings
from dpsinkhorn.report import captions

# Same schema and messages as the CLI: fills defaults, names the file and key of an error.
config.update(validate(config, workflow.configfiles))
check_overrides(config, workflow.configfiles)

# Jobs find `dpsinkhorn` beside this Snakemake's Python (no activated venv needed), and
# one Ctrl-C stops the workflow instead of letting a retry restart training.
prepare_workflow_process()

RESULTS = f"results/{config['run_name']}"
DATA = config["data_dir"]
# A finished secret-key DP experiment whose settings changed is refused here, before
# Snakemake removes its outputs to rerun it (DPSINKHORN_RETRAIN=<exp> allows it; the
# record counts it: docs/PRIVACY.md). Checked once, by the Snakemake that plans the jobs.
# A training folder whose rerun stopped (refused, Ctrl-C, bad input) holds the earlier
# run's files, which Snakemake put back and now takes as up to date: said in one line.
if not workflow.remote_exec:
    check_dataset_paths(config, workflow.configfiles)
    refuse_changed_settings(Path(DATA) / RECORD_DIR, private_trainings(config, RESULTS))
    check_kept_outputs(config, RESULTS)
# The run's fixed folders (dpsinkhorn.config.RUN_FOLDERS: no experiment takes their names).
LOGS = f"{RESULTS}/{LOGS_DIR}"
BENCH = f"{RESULTS}/{BENCHMARKS_DIR}"
TABLES = f"{RESULTS}/{TABLES_DIR}"
FIGURES = f"{RESULTS}/{FIGURES_DIR}"
EVAL = config["evaluation"]
SEEDS = config["seeds"]
# The steps read their settings from these files (relative to the working directory).
CONFIG_FILES = config_file_args(workflow.configfiles)
DEVICE = f"--device {config['device']}"
# Always explicit (--x or --no-x): the training CLI reads the config files again, and an
# override such as --config cuda_graphs=False must win over the file's value.
TRAIN_DEVICE = (
    DEVICE
    + (" --cuda-graphs" if config["cuda_graphs"] else " --no-cuda-graphs")
    + (" --compile-solver" if config["compile_solver"] else " --no-compile-solver")
    + f" --precision {config['precision']}"
)
# Steps that run a network ask for one GPU (the `gpu` resource), unless device is cpu.
# --executor slurm turns it into --gpus=1; on one machine, profiles/default caps the total
# at the number of local GPUs and dpsinkhorn.devices gives each step a GPU of its own.
GPUS = 0 if config["device"] == "cpu" else 1

# FID reference statistics: the whole real test set, or a seeded random subset of it.
FID_SIZE = EVAL["fid_reference_size"]
FID_SUBSET = "" if FID_SIZE is None else f"--num {FID_SIZE} --seed 0"
# What every evaluation job passes on from the config's `evaluation:` and fid_weights.
EVAL_OPTIONS = (
    ("" if config["fid_weights"] is None else f"--weights {shlex.quote(config['fid_weights'])} ")
    + f"--sqrtm {EVAL['fid_sqrtm']} --max-epochs {EVAL['max_epochs']}"
    + f" --patience {EVAL['patience']} --batch-size {EVAL['batch_size']}"
    + f" --max-iter {EVAL['logreg_max_iter']}"
    + ("" if EVAL["fid_precision"] == "fp32" else f" --fid-precision {EVAL['fid_precision']}")
)
# Only used with --software-deployment-method conda (path relative to the rule files).
CONDA_ENV = "../../envs/dpsinkhorn.yaml"
# snakemake --report: each table/figure's caption is its rule's `caption` param, written
# by dpsinkhorn.report.captions.caption (what was run: config, steps, sigma, epsilon, seeds).
CAPTION = "../report/output.rst"

# What the training jobs ask a cluster for (runtime, retries): from the measured step rates
# of cluster.step_rates (dpsinkhorn.config.cluster; the same numbers as dpsinkhorn plan
# --rates). Jobs without a measured rate ask for cluster.max_job_minutes and say so
# (printed by the Snakemake that submits cluster jobs, and in dry runs).
SUBMITS_JOBS = lambda: not workflow.remote_exec and workflow.non_local_exec_or_dryrun
REQUESTS = Requests(config, [workflow.basedir], warn=SUBMITS_JOBS)

TRAINED = wildcard_regex(trained_experiments(config))
# sweep_runs > 1: SWEEPS lists the groups trained together (rule train_sweep_<first member>);
# the others are trained one per job (rule train, constrained to TRAINED_ALONE).
TRAINED_ALONE, SWEEPS = targets.training_jobs(config)
TRAINED_ALONE = wildcard_regex(TRAINED_ALONE)
REAL = wildcard_regex(real_experiments(config))

# Prepared data: {DATA}/<folder>/{train,test}.npz, the folder a built-in dataset's name or
# an own dataset's <name>-<entry hash> (dpsinkhorn.config.prepared_folder): two configs
# that give the same name to other data never write, or delete, each other's files.
PREPARED = {prepared_folder_of(config, d): d for d in datasets(config)}


# An experiment's files live in {RESULTS}/{home}{exp}/: home is "" for a DP release and
# "nonprivate/" for everything no ledger covers (dpsinkhorn.config.experiment_home); the
# file lists of dpsinkhorn.config.targets pick the home, the rules only match it.
wildcard_constraints:
    home=r"(nonprivate/)?",
    dataset=wildcard_regex(datasets(config)),
    folder=wildcard_regex(PREPARED),
    exp=wildcard_regex(experiment_names(config)),
    model=wildcard_regex(all_classifiers(config)),
    seed=r"\d+",


def flag(name, value):
    """`name value` (the value shell-quoted) for an optional CLI flag, or nothing when
    value is None."""
    return "" if value is None else f"{name} {shlex.quote(str(value))}"


def prepared_file(dataset, split):
    """The prepared <split>.npz of a dataset."""
    return f"{DATA}/{prepared_folder_of(config, dataset)}/{split}.npz"


def dataset_file(split):
    """Input function: the prepared <split>.npz of the experiment's dataset."""
    return lambda w: prepared_file(dataset_of(config, w.exp), split)


def fid_reference(w):
    """Input function: the FID statistics of the experiment's real test set."""
    return targets.fid_reference_file(RESULTS, dataset_of(config, w.exp))


def experiment_file(name):
    """Input function: a file in the experiment's own folder (its generator, samples)."""
    return lambda w: f"{experiment_dir(config, RESULTS, w.exp)}/{name.format(**dict(w.items()))}"


def evaluation_outputs(experiments):
    """FID and classifier results of every seed of these experiments."""
    return targets.evaluation_files(config, RESULTS, experiments)


def celeba_table_inputs(table):
    """Input function: what the CelebA table `table` reads (results, privacy, samples)."""
    return lambda w: targets.table_files(config, table, RESULTS)


def outside_table1_outputs():
    """Results of experiments that fill no Table 1 row (still run by `all`)."""
    in_table = set(table1_experiments(config).values())
    return evaluation_outputs(e for e in experiment_names(config) if e not in in_table)


def report_caption(name=None):
    """Param function: the caption of output `name` (default: the {name} wildcard).

    It reads privacy.json files when they exist (for ε), so it takes `output`: Snakemake
    then treats it as derived and never reruns a step because its caption changed.
    """
    files = CONFIG_FILES.split()
    return lambda w, output: captions.caption(config, RESULTS, name or w.name, files)


def in_report(outputs):
    """Mark a table's Markdown and its figure for snakemake --report."""
    category = {"md": "Tables", "figure": "Figures"}
    return {
        key: report(path, caption=CAPTION, category=category[key]) if key in category else path
        for key, path in outputs.items()
    }
