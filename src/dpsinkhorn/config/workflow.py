"""What only the Snakemake workflow needs: rule parameters, wildcard patterns, its process.
Torch-free: Snakemake imports it while it parses the workflow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from dpsinkhorn.config.experiments import (
    PathLike,
    data_identity,  # noqa: F401 (the data rule's param: workflow/rules/data.smk)
    data_mirror_of,
    dataset_definition,
    datasets,
    definition_sha256,
    experiment_dir,
    experiment_spec,
    fixture_source,
    prepared_folder_of,
    private_experiments,
    trained_experiments,
)


def data_inputs(config: Mapping, dataset: str) -> list[str]:
    """Inputs of the data rule: the fixture folder for a fixture CelebA, an own dataset's
    folder or .npz (``datasets.<name>.path``), else nothing."""
    definition = dataset_definition(config, dataset)
    if definition is not None:
        return [str(definition["path"])]
    return [fixture_source(config)] if dataset == "celeba" and fixture_source(config) else []


def data_source_args(config: Mapping, dataset: str, config_files: str) -> str:
    """Where ``dpsinkhorn data`` reads a dataset: ``--mirror <folder>`` (built-in), or
    ``--config <files> --definition-sha256 <hash>`` (own dataset)."""
    definition = dataset_definition(config, dataset)
    if definition is not None:
        return f"--config {config_files} --definition-sha256 {definition_sha256(definition)}"
    mirror = data_mirror_of(config, dataset)
    return "" if mirror is None else f"--mirror {shlex.quote(mirror)}"


def config_file_args(files: Iterable[PathLike]) -> str:
    """Config files as CLI arguments, relative to the working directory when inside it
    (one spelling, so Snakemake does not rerun steps for ``./x.yaml`` vs ``x.yaml``)."""
    args = []
    for file in files:
        path = os.path.abspath(file)
        rel = os.path.relpath(path)
        args.append(shlex.quote(path if rel.startswith("..") else rel))
    return " ".join(args)


def wildcard_regex(names: Iterable[str]) -> str:
    """A regex matching exactly these names (one that never matches if there are none)."""
    names = list(names)
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def gradient_settings(config: Mapping) -> dict:
    """fig4c's estimator p values and batch count (paper: 6 values of p, 300 batches)."""
    study = (config.get("studies") or {}).get("fig4c") or {}
    return {
        "p_values": study.get("p_values", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        "batches": study.get("batches", 300),
    }


def prepare_workflow_process() -> None:
    """Called once by common.smk: puts this Python's bin folder first on ``PATH`` (steps
    call ``dpsinkhorn``), and makes Ctrl-C Snakemake's graceful SIGTERM stop while jobs run,
    so an interrupted training is not retried."""
    own_bin = str(Path(sys.executable).parent)
    os.environ["PATH"] = os.pathsep.join([own_bin, os.environ.get("PATH", "")])

    def user_interrupt(signum, frame):
        if callable(signal.getsignal(signal.SIGTERM)):  # the scheduler's graceful stop
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            signal.default_int_handler(signum, frame)

    with contextlib.suppress(ValueError):  # not the main thread: leave Snakemake's default
        signal.signal(signal.SIGINT, user_interrupt)


def private_trainings(config: Mapping, results: PathLike) -> list[tuple[str, str, dict]]:
    """(experiment, absolute output folder, settings) of each DP release the config trains."""
    return [
        (
            name,
            str(Path(experiment_dir(config, results, name)).resolve()),
            json.loads(experiment_spec(config, name)),
        )
        for name in private_experiments(config)
    ]


#: Note a training leaves after a stop a retry cannot fix: ``{"exit_code", "message"}``.
STOPPED_NAME = ".dpsinkhorn.stopped"


def check_dataset_paths(config: Mapping, files: Iterable[PathLike]) -> None:
    """Raise a one-line ``ValueError`` naming the file and key of an own dataset whose
    ``path`` is not there: the data rule reads it, and the tables' captions its title and
    class names while the workflow is planned (else a Snakemake input-function traceback)."""
    from dpsinkhorn.config.validate import _file_of

    for name, entry in (config.get("datasets") or {}).items():
        if not Path(entry["path"]).exists():
            where = _file_of(["datasets", name, "path"], list(files), config)
            raise ValueError(
                f"{where}: datasets.{name}.path: {entry['path']}: no such file or folder "
                f"(a relative path is taken from {os.getcwd()})"
            )


def check_kept_outputs(config: Mapping, results: PathLike) -> None:
    """Raise a one-line ``ValueError`` while a training folder holds both a generator and
    :data:`STOPPED_NAME`: Snakemake put an earlier run's files back after a failed rerun
    and would otherwise call them up to date."""
    for name in trained_experiments(config):
        folder = Path(experiment_dir(config, results, name))
        note, generator = folder / STOPPED_NAME, folder / "generator.pt"
        if not (note.is_file() and generator.is_file()):
            continue
        try:
            message = json.loads(note.read_text()).get("message", "")
        except (OSError, ValueError):
            message = "(its note is unreadable)"
        raise ValueError(
            f"{folder}: holds the files of an earlier finished training of experiment "
            f"{name}, not of the inputs now: its last rerun stopped ({message}) and "
            f"Snakemake put the earlier files back. To keep them as they are, delete {note} "
            f"and mark them up to date (snakemake --touch {generator} with the same options); "
            f"to train it again, deal with that cause and run with --forcerun {generator}"
        )


def killed_writers_folders(
    config: Mapping, results: PathLike, kept_copy: Callable[[str], PathLike]
) -> list[Path]:
    """Folders only this run's jobs write: results, its datasets' prepared folders, the
    CelebA fixture source and each DP release's kept copy (``kept_copy(output folder)``).
    Not the rest of data_dir, which other runs share."""
    data = Path(config["data_dir"])
    folders = [Path(results), *(data / prepared_folder_of(config, d) for d in datasets(config))]
    if "celeba" in datasets(config) and fixture_source(config) is not None:
        folders.append(Path(fixture_source(config)))
    return folders + [Path(kept_copy(out)) for _, out, _ in private_trainings(config, results)]


def remove_killed_writers_temps(*roots: PathLike) -> None:
    """Delete the temporary files that killed writers left under ``roots``; say how many."""
    from dpsinkhorn.fileio import remove_stale_temps_under

    stale = [p for root in roots for p in remove_stale_temps_under(root)]
    if stale:
        print(f"removed {len(stale)} temporary files of killed writers, e.g. {stale[0]}")
