"""Configuration: load, validate and query experiment configs (torch-free).

This is the only package Snakemake imports while it parses the workflow, so nothing
here may import torch, torchvision or matplotlib (``tests/test_architecture.py``).
Code outside the package imports the public names from ``dpsinkhorn.config`` itself;
they are defined in:

- :mod:`~dpsinkhorn.config.validate`: loading YAML, schema defaults, validation, errors;
- :mod:`~dpsinkhorn.config.experiments`: one experiment's settings, the table rows;
- :mod:`~dpsinkhorn.config.targets`: the outputs and the files each reads and writes;
- :mod:`~dpsinkhorn.config.workflow`: what only the Snakemake rules need;
- :mod:`~dpsinkhorn.config.identity`: what identifies an experiment (spec, sweep key);
- :mod:`~dpsinkhorn.config.studies`: the paper's ablations and grids as experiments.
"""

from dpsinkhorn.config import studies
from dpsinkhorn.config.experiments import (
    BENCHMARKS_DIR,
    FIGURES_DIR,
    FIXTURE_SOURCE,
    GENERATOR_WIDTHS,
    LOGS_DIR,
    NONPRIVATE,
    PRIVATE_METHODS,
    PUBLIC_TEST_SPLITS,
    RUN_FOLDERS,
    TABLE1_ROWS,
    TABLE6_GENERATOR,
    TABLE_ROWS,
    TABLES_DIR,
    all_classifiers,
    builtin_source,
    classifiers_of,
    data_identity,
    data_mirror_of,
    dataset_of,
    datasets,
    evaluation_dir,
    evaluation_home,
    experiment,
    experiment_classifiers,
    experiment_dir,
    experiment_home,
    experiment_names,
    experiment_spec,
    figure_datasets,
    figure_experiment,
    fixture_source,
    is_private,
    needs_training,
    paper_figure_datasets,
    prepared_folder,
    prepared_folder_of,
    private_experiments,
    real_experiments,
    table1_experiments,
    table_experiments,
    trained_experiment,
    trained_experiments,
)
from dpsinkhorn.config.identity import (
    IMPLICIT_DEFAULTS,
    NON_SEMANTIC_KEYS,
    deep_merge,
    experiment_spec_of,
)
from dpsinkhorn.config.semantics import SWEEP_BF16_ERROR
from dpsinkhorn.config.targets import (
    TABLE_FIGURES,
    report_tables,
    report_targets,
    table_figure_experiments,
    table_files,
    table_outputs,
)
from dpsinkhorn.config.validate import (
    OVERRIDABLE,
    SCHEMA_PATH,
    check_overrides,
    cli_or_config,
    load_config,
    load_schema,
    make_experiment,
    read_yaml,
    setting_source,
    validate,
)
from dpsinkhorn.config.workflow import (
    PathLike,
    config_file_args,
    data_inputs,
    prepare_workflow_process,
    wildcard_regex,
)

__all__ = [
    # validate
    "OVERRIDABLE",
    "SCHEMA_PATH",
    "SWEEP_BF16_ERROR",
    "check_overrides",
    "cli_or_config",
    "load_config",
    "load_schema",
    "make_experiment",
    "read_yaml",
    "setting_source",
    "validate",
    # experiments
    "FIXTURE_SOURCE",
    "GENERATOR_WIDTHS",
    "BENCHMARKS_DIR",
    "FIGURES_DIR",
    "LOGS_DIR",
    "NONPRIVATE",
    "RUN_FOLDERS",
    "TABLES_DIR",
    "PUBLIC_TEST_SPLITS",
    "TABLE1_ROWS",
    "TABLE6_GENERATOR",
    "TABLE_ROWS",
    "all_classifiers",
    "classifiers_of",
    "experiment_classifiers",
    "data_mirror_of",
    "dataset_of",
    "datasets",
    "evaluation_dir",
    "evaluation_home",
    "experiment",
    "experiment_dir",
    "builtin_source",
    "data_identity",
    "prepared_folder",
    "prepared_folder_of",
    "experiment_home",
    "experiment_names",
    "experiment_spec",
    "figure_datasets",
    "paper_figure_datasets",
    "figure_experiment",
    "fixture_source",
    "is_private",
    "PRIVATE_METHODS",
    "needs_training",
    "private_experiments",
    "real_experiments",
    "table1_experiments",
    "table_experiments",
    "trained_experiment",
    "trained_experiments",
    # targets
    "TABLE_FIGURES",
    "report_tables",
    "report_targets",
    "table_figure_experiments",
    "table_files",
    "table_outputs",
    # workflow
    "PathLike",
    "config_file_args",
    "data_inputs",
    "prepare_workflow_process",
    "wildcard_regex",
    # identity, studies
    "IMPLICIT_DEFAULTS",
    "NON_SEMANTIC_KEYS",
    "deep_merge",
    "experiment_spec_of",
    "studies",
]
