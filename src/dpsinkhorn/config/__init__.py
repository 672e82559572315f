"""Configuration: load, validate and query experiment configs. Torch-free: the only
package Snakemake imports while it parses the workflow (tests/test_architecture.py).
Import public names from ``dpsinkhorn.config`` itself; this file re-exports them."""

# ruff: noqa: F401
from dpsinkhorn.config import studies
from dpsinkhorn.config.experiments import (
    BENCHMARKS_DIR,
    FIGURES_DIR,
    LOGS_DIR,
    NONPRIVATE,
    PRIVATE_METHODS,
    PUBLIC_TEST_SPLITS,
    RUN_FOLDERS,
    TABLES_DIR,
    all_classifiers,
    classifiers_of,
    data_identity,
    data_mirror_of,
    dataset_of,
    datasets,
    evaluation_dir,
    experiment,
    experiment_classifiers,
    experiment_dir,
    experiment_home,
    experiment_names,
    experiment_spec,
    figure_datasets,
    figure_experiment,
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
from dpsinkhorn.config.identity import deep_merge, experiment_spec_of
from dpsinkhorn.config.targets import (
    TABLE_FIGURES,
    report_tables,
    table_figure_experiments,
    table_files,
)
from dpsinkhorn.config.validate import (
    OVERRIDABLE,
    SWEEP_BF16_ERROR,
    at_least,
    check_device,
    check_overrides,
    cli_or_config,
    device_option,
    load_config,
    load_schema,
    make_experiment,
    setting_source,
    validate,
)
from dpsinkhorn.config.workflow import (
    config_file_args,
    data_inputs,
    prepare_workflow_process,
    wildcard_regex,
)
