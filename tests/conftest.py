"""Shared pytest fixtures: real data and weights from ``../shared`` (a test that needs a
missing one is skipped, naming the file; under ``CI=true`` it fails instead), and the
command line run in-process."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import require_shared, shared_path

from dpsinkhorn import cli


@pytest.fixture(scope="session", autouse=True)
def record_store_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test's record store (``privacy.record_store``) is one temporary folder per
    session, never the user's: ``DPSINKHORN_RECORD_STORE`` is set here, before any test or
    module fixture runs, and the workflows, SLURM jobs and CLIs the tests start inherit it."""
    from dpsinkhorn.privacy.record_store import STORE_ENV

    path = tmp_path_factory.mktemp("record_store")
    os.environ[STORE_ENV] = str(path)
    return path


def _shared_path(env_var: str) -> Path:
    return require_shared(shared_path(env_var), f"set {env_var}")


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    """Folder holding MNIST/raw/*.gz and FashionMNIST/raw/*.gz."""
    return _shared_path("DPSINKHORN_DATA_MIRROR")


@pytest.fixture(scope="session")
def fid_weights() -> Path:
    """pytorch-fid's Inception weights file."""
    return _shared_path("DPSINKHORN_FID_WEIGHTS")


@pytest.fixture(scope="session")
def prepared_mnist(tmp_path_factory: pytest.TempPathFactory, data_mirror: Path) -> Path:
    """Data root with mnist prepared once per session (``<root>/mnist/*.npz``); needs only
    MNIST in the mirror (the GPU tests carry no more)."""
    from dpsinkhorn.data import datasets as data

    root = tmp_path_factory.mktemp("data")
    data.prepare("mnist", root, mirror=data_mirror)
    return root


@pytest.fixture(scope="session")
def prepared_data(prepared_mnist: Path, data_mirror: Path) -> Path:
    """Data root with mnist and fmnist prepared once per session (``<root>/<name>/*.npz``)."""
    from dpsinkhorn.data import datasets as data

    data.prepare("fmnist", prepared_mnist, mirror=data_mirror)
    return prepared_mnist


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    """``dpsinkhorn ARGV`` in-process through ``cli.main``; returns the exit code.

    Command modules that do not exist (yet) are left out of the parser, so one command's
    tests run while another's module is being moved; with all of them present this is
    exactly the real CLI.
    """
    present = [m for m in cli.COMMAND_MODULES if importlib.util.find_spec(f"dpsinkhorn.{m}")]
    monkeypatch.setattr(cli, "COMMAND_MODULES", present)
    return cli.main


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: live SLURM cluster test (make test-slurm; skipped without it)"
    )


#: ``record_property`` names whose values the summary prints, passed or failed: figures a
#: test measures (the kill-anywhere test's moments, seed and rules hit), which pytest
#: would otherwise show only for a failure, and pytest-xdist not even the ``-s`` print.
SUMMARY_PROPERTIES = ("kill_anywhere",)


def pytest_terminal_summary(terminalreporter):
    """Prints the SUMMARY_PROPERTIES the tests recorded (they travel with the test reports,
    so also from pytest-xdist's workers)."""
    lines = [
        f"{report.nodeid}: {value}"
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name in SUMMARY_PROPERTIES
    ]
    if lines:
        terminalreporter.section("measured figures")
        for line in lines:
            terminalreporter.write_line(line)


#: Unit tests marked ``slow`` (every parametrisation), so that ``make test-fast`` stays under
#: 5 min; ``make test`` runs them. Seconds each took (all parametrisations, setup included
#: where listed by --durations) in a `pytest -m "not slow" --durations=60` run on the 2-core
#: machine at load average 6-8 (so about three times their time on an idle machine): every
#: test of 20 s or more there (docs/TESTING.md).
SLOW_TESTS: dict[str, int] = {
    # 371 s when each waited 120 s for a file; 26 s since they signal at the first step
    "test_train.py::test_signal_checkpoints_and_exits_nonzero": 26,
    "test_fid.py::test_real_vs_real_is_much_smaller_than_real_vs_shuffled_pixels": 302,
    "test_fid.py::test_pytorch_fid_value_on_real_statistics": 257,
    "test_fid.py::test_eigh_matches_pytorch_fid_rank_deficient": 250,
    "test_fid.py::test_fid_stats_then_self_fid_is_zero": 24,
    "test_fid.py::test_activations_shape_and_dtype": 118,
    "test_fid.py::test_eigh_of_identical_inputs_is_zero": 117,
    "test_precision.py::test_bf16_step_stays_within_tolerance": 98,
    "test_sweep.py::test_train_sweep_writes_single_run_files_and_resumes": 89,
    "test_faults.py::test_second_writer_of_an_output_folder_is_refused": 65,
    "test_fid.py::test_eigh_matches_pytorch_fid_full_rank": 63,
    "test_faults.py::test_damaged_checkpoint_is_one_line_and_not_retried": 59,
    "test_resultset.py::"
    "test_committed_h100_set_holds_no_loss_no_generator_and_its_table_is_current": 57,
    "test_step.py::test_a_single_run_is_the_step_of_a_sweep_of_one": 56,
    "test_release.py::test_noise_key_is_secret_and_reproducible_mode_says_so": 52,
    "test_classify.py::test_batched_seeds_agree_with_the_oracles": 48,
    "test_sweep.py::test_sweep_follows_each_single_run": 44,
    "test_publish.py::test_private_and_nonprivate_files_live_apart": 38,
    "test_publish.py::test_public_noise_seed_needs_the_flag": 36,
    "test_train.py::test_resume_is_bit_identical_and_counts_each_step_once": 35,
    "test_release.py::test_resume_on_other_data_is_refused": 34,
    "test_resultset.py::test_missing_cells_are_shown_missing_and_new_files_update_the_table": 30,
    "test_bench.py::test_bench_sweep_layer_profile_and_solver": 28,
    "test_train.py::test_checkpoint_of_other_settings_is_not_resumed": 28,
    "test_release.py::test_secret_key_resumes_bit_identically_from_the_checkpoint": 27,
    "test_faults.py::test_sigint_stops_a_snakemake_run_and_keeps_the_checkpoint": 26,
    "test_release.py::test_rng_state_reaches_set_state_as_a_cpu_byte_tensor": 25,
    "test_fid.py::test_same_network_as_pytorch_fid_download_path": 23,
    "test_release.py::test_no_two_runs_or_sweep_members_share_noise": 22,
    "test_report.py::test_perrow_row_names_its_mechanism_and_both_sound_epsilons": 22,
    "test_release.py::test_buffer_overflow_is_handled_and_charged_to_delta": 20,
    # 10-20 s in that run, or 12 s or more in a second run at load average 2-5 (those of
    # module-scoped fixtures left out: another test of the module would pay for them)
    "test_api.py::test_readme_example_runs_as_written": 24,
    "test_classify.py::test_accuracy_well_above_chance": 23,
    "test_sweep.py::test_sweep_fails_when_a_workspace_cannot_be_deleted": 23,
    "test_studies.py::test_outputs_inputs_and_targets_cli": 20,
    "test_train.py::test_parameter_perturbation_resume_is_bit_identical": 19,
    "test_config.py::test_dry_run_default_config_and_overrides": 19,
    "test_privacy.py::test_cli_epsilon_steps_and_sigma": 18,
    "test_release.py::test_release_folder_holds_no_private_loss": 16,
    "test_train.py::test_python_api_on_own_arrays": 15,
    "test_cluster.py::test_paper_config_asks_at_most_a_day_per_job": 15,
    "test_owndata.py::test_snakemake_dry_run_resolves_an_own_dataset": 15,
    "test_config.py::test_dry_run_lists_every_job": 15,
    "test_train.py::test_train_from_target_epsilon_and_nonprivate": 14,
    "test_sweep.py::test_sweep_step_never_synchronises": 14,
    "test_fid.py::test_grayscale_and_rgb_inputs_agree": 14,
    "test_gradstudy.py::test_deterministic_and_independent_of_p_order": 13,
    "test_ot.py::test_compiled_solver_trains_like_the_eager_one": 13,
    "test_cluster.py::test_every_job_keeps_under_a_smaller_cap": 13,
    "test_config.py::test_single_cell_reruns_alone": 13,
    "test_faults.py::test_oversized_batch_is_refused_naming_key_and_file": 12,
    "test_faults.py::test_generator_bytes_are_deterministic_and_hashed": 12,
    "test_train.py::test_l1_cost_trains_with_the_l1_diameter": 11,
    "test_sweep.py::test_train_sweep_cli": 10,
    "test_ablations.py::test_cli_subcommands": 10,
    # the evaluation against its oracles, its benchmark script (load average 4-8)
    "test_bench_evaluate_phases.py::test_evaluate_phases_writes_every_phase": 37,
    "test_fid.py::test_features_and_fid_agree_with_pytorch_fid": 42,
    "test_evaluate_job.py::test_generator_job_writes_each_seeds_draw_and_its_fid": 37,
    "test_evaluate_job.py::test_a_stopped_job_resumes_after_its_finished_phases": 30,
    # three Snakemake runs and two trainings on the digits (idle 2-core machine)
    "test_trainings.py::test_a_workflow_rerun_that_is_refused_keeps_the_finished_generator": 35,
    "test_trainings.py::"
    "test_a_second_config_of_the_same_name_never_deletes_the_first_ones_data": 10,
}

#: Per-test limits (s) above pyproject.toml's ``timeout`` (900 s) for the test that runs a
#: whole workflow in its setup: the first selected test of each of these modules (its
#: module-scoped fixture runs the workflow; the module's later tests read that run and keep
#: the 900 s), and single tests that are a whole run each. Generous, so that only a hang
#: trips them on a loaded 2-core machine (docs/TESTING.md).
TIMEOUTS_FIRST_OF_MODULE = {
    "test_workflow.py": 3600,  # the smoke run: up to 36 min of `make test` on 2 loaded cores
    "test_owndata_workflow.py": 1500,  # "a few minutes" (its docstring)
    "test_slurm.py": 3000,  # its fixture stops the workflow itself after 2,400 s
    "test_kill_anywhere.py": 1800,  # the uninterrupted reference run, then the first life
}
TIMEOUTS_OF_TEST: dict[str, int] = {}


def _name(item: pytest.Item) -> str:
    """``<file>::<test function>`` of a collected test (all parametrisations alike)."""
    return f"{item.path.name}::{getattr(item, 'originalname', item.name)}"


#: Test files that run longest (a whole workflow, or many Inception passes), longest first:
#: collected first, so that pytest-xdist (``--dist loadfile``, make test) starts them at
#: once while the other files fill the other worker, and the short files come last, where
#: they balance the two workers' ends.
FIRST_FILES = (
    "test_workflow.py",
    "test_kill_anywhere.py",
    "test_owndata_workflow.py",
    "test_fid.py",
    "test_evaluate_job.py",
)


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items):
    """Marks the tests of SLOW_TESTS ``slow``; puts the files of FIRST_FILES first, in that
    order (each file's tests keep theirs)."""
    for item in items:
        if _name(item) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    order = [*FIRST_FILES, None]  # None: every other file
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, rank[None]))


def pytest_collection_finish(session):
    """Gives the tests named in TIMEOUTS_* their limit (an explicit ``timeout`` mark wins);
    after -m/-k: the first test of a module is the first that will run."""
    seen = set()
    for item in session.items:
        module = item.path.name
        limit = TIMEOUTS_OF_TEST.get(_name(item))
        if module in TIMEOUTS_FIRST_OF_MODULE and module not in seen:
            seen.add(module)
            limit = TIMEOUTS_FIRST_OF_MODULE[module]
        if limit and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))
