"""Experiments of a validated config: their settings, and where the paper's tables use them.

An experiment is ``training_defaults`` with its own keys on top. The questions asked of
it here (which ones train, which datasets they use, which table row each one fills)
are what the workflow, the CLI steps and the reports share. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn.config.identity import deep_merge, experiment_spec_of

#: Table 1 rows this project fills, in table order, and the method each one needs.
TABLE1_ROWS = {
    "real": "real_data",
    "nonprivate": "sinkhorn",
    "paper": "dp_sinkhorn",
    "perrow": "dp_sinkhorn",
    "sound10": "dp_sinkhorn",
    "sound_official": "dp_sinkhorn",
    "dpmerf": "dpmerf",
}
#: Methods whose experiment is a DP release: a privacy ledger covers its folder.
PRIVATE_METHODS = ("dp_sinkhorn", "dpmerf")

#: The CelebA tables (paper Tables 3 and 6): each row and the method it needs.
#: An experiment names its rows with ``rows: {table3: dp, table6: biggan}``.
TABLE_ROWS = {
    "table3": {
        "real": "real_data",
        "nonprivate": "sinkhorn",
        "dp": "dp_sinkhorn",
        "dpmerf": "dpmerf",
    },
    "table6": {"real": "real_data", "dcgan": "dp_sinkhorn", "biggan": "dp_sinkhorn"},
}
#: Table 6 compares generators: its DP rows need this ``generator``.
TABLE6_GENERATOR = {"dcgan": "dcgan", "biggan": "biggan"}
#: Generator widths (``channels``) each architecture takes, per image size (as
#: ``models.DCGAN_LAYERS`` / ``models.GENERATORS`` build them).
GENERATOR_WIDTHS = {"dcgan": {28: 3, 32: 3, 64: 4}, "biggan": {32: 4}, "merf": {28: 3, 32: 3}}


def generator_widths(generator: str, image_size: int | None = None) -> tuple[int, ...]:
    """How many ``channels`` the generator may take at ``image_size`` (None: not known
    from the config, e.g. arrays given to the Python API: any of its sizes; the
    generator itself then refuses a wrong count for the data's size)."""
    by_size = GENERATOR_WIDTHS[generator]
    if image_size in by_size:
        return (by_size[image_size],)
    return tuple(sorted(set(by_size.values())))


#: The datasets dpsinkhorn knows by name (their facts: ``data.catalog.DATASETS``); any
#: other dataset is declared under the config's ``datasets:``.
BUILTIN_DATASETS = ("mnist", "fmnist", "celeba")

#: The folder under results/<run>/ of everything computed from the private data that no
#: privacy ledger covers: non-private experiments (``sinkhorn``, ``real_data``), gradient
#: studies, FID statistics of a test split, and scores against a private test split.
NONPRIVATE = "nonprivate"
#: The other folders under results/<run>/: the reports' tables and figures, and the
#: workflow's job logs and benchmarks (workflow/rules/common.smk).
TABLES_DIR = "tables"
FIGURES_DIR = "figures"
LOGS_DIR = "logs"
BENCHMARKS_DIR = "benchmarks"
#: Every fixed folder directly under results/<run>/. An experiment's folder is
#: results/<run>/<name> (a DP release), so no experiment may take one of these names
#: (``config.validate``): its release would live inside the run's own folder.
RUN_FOLDERS = (NONPRIVATE, TABLES_DIR, FIGURES_DIR, LOGS_DIR, BENCHMARKS_DIR)
#: Datasets whose test split is public (published benchmarks): FID and classifier scores of a
#: DP generator's samples against it are post-processing of the release plus public data.
#: Any other dataset's test split is private: those scores live under ``nonprivate/``.
PUBLIC_TEST_SPLITS = ("mnist", "fmnist", "celeba")
#: Where the smoke run's synthetic CelebA source goes, under data_dir (``celeba_fixture``).
FIXTURE_SOURCE = "celeba_source"


def experiment_names(config: Mapping) -> list[str]:
    """Experiment names in config order."""
    return list(config.get("experiments") or {})


def experiment(config: Mapping, name: str) -> dict:
    """Settings of one experiment: ``training_defaults`` with its own keys on top, plus ``name``."""
    experiments = config.get("experiments") or {}
    if name not in experiments:
        known = ", ".join(experiments) or "none"
        raise ValueError(f"unknown experiment {name!r} (known: {known})")
    spec = deep_merge(config.get("training_defaults") or {}, experiments[name])
    spec.setdefault("table1_row", None)
    spec.setdefault("rows", {})
    definition = dataset_definition(config, spec.get("dataset"))
    if definition is not None:  # an own dataset: its entry travels with the experiment
        spec["dataset_definition"] = definition
    elif spec.get("dataset") in BUILTIN_DATASETS:
        # A built-in dataset prepared from a source of its own (CelebA from a mirror or the
        # fixture): the folder travels with the experiment (bookkeeping: the data's own
        # fingerprint, not its folder, is what identifies a training).
        folder = prepared_folder_of(config, spec["dataset"])
        if folder != spec["dataset"]:
            spec["prepared_folder"] = folder
    spec["name"] = name
    return spec


def dataset_definition(config: Mapping, dataset: str | None) -> dict | None:
    """The config's ``datasets.<dataset>`` entry (an own dataset), or None (built-in / unknown).

    An experiment of an own dataset carries it as ``dataset_definition``, so every stage
    that reads the experiment can build the dataset's facts
    (``data.catalog.dataset_info(name, definition)``) without the whole config.
    """
    entry = (config.get("datasets") or {}).get(dataset) if dataset else None
    return None if entry is None else dict(entry)


def definition_sha256(definition: Mapping) -> str:
    """SHA-256 of an own dataset's validated entry, as canonical JSON (first 16 hex digits)."""
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]


#: Built-in datasets whose every source is checked byte for byte (archive MD5s) against
#: torchvision's list: preparing them from a download or any mirror gives the same files.
VERIFIED_SOURCES = ("mnist", "fmnist")
#: :func:`builtin_source` of a verified dataset.
VERIFIED = "official archives (MD5-checked)"
#: :func:`builtin_source` of a built-in dataset read from no mirror: downloaded into
#: ``<data_dir>/torchvision`` (or placed there by hand), one such source per data_dir.
DOWNLOAD = "download"


def normal_mirror(mirror: str | os.PathLike | None) -> str | None:
    """``data_mirror`` as one spelling: the real path (``~`` expanded, relative to the
    working directory, symbolic links resolved), or None. Relative, absolute and symlinked
    spellings of one folder are then one workflow parameter: changing the spelling reruns
    nothing."""
    return None if mirror is None else os.path.realpath(os.path.expanduser(os.fspath(mirror)))


def builtin_source(dataset: str, mirror: str | os.PathLike | None, data_dir) -> str:
    """What decides a built-in dataset's prepared bytes, read from ``mirror`` (None: the
    download) into ``data_dir``: :data:`VERIFIED` for MNIST and Fashion-MNIST (every
    source gives the same bytes, so the mirror is no part of it); :data:`DOWNLOAD`; else
    ``mirror <real path>``, or ``mirror <data_dir>/<path>`` for one inside ``data_dir``
    (the synthetic fixture's ``celeba_source``), which stays one source when the working
    folder moves. ``dpsinkhorn data`` and the config (:func:`data_identity`) both name a
    source with it, so they find the same folder (:func:`prepared_folder`)."""
    if dataset in VERIFIED_SOURCES:
        return VERIFIED
    if mirror is None:
        return DOWNLOAD
    real, root = normal_mirror(mirror), normal_mirror(data_dir)
    inside = os.path.relpath(real, root)
    if inside != os.pardir and not inside.startswith(os.pardir + os.sep):
        return f"mirror <data_dir>/{Path(inside).as_posix()}"
    return f"mirror {real}"


def data_identity(config: Mapping, dataset: str) -> str:
    """What decides a dataset's prepared bytes: the data rule's one rerun-triggering param,
    and what names its folder (:func:`prepared_folder_of`).

    MNIST and Fashion-MNIST: the official archives, MD5-checked against torchvision's list
    whether downloaded or copied from any mirror, so every source gives the same bytes and
    the mirror's location is no part of it (moving it, or another config naming another
    copy, reruns nothing). CelebA: its images are not checked, so the source
    (:func:`builtin_source`: the mirror's real path, the fixture's folder or ``download``).
    An own dataset: its entry's hash.
    """
    definition = dataset_definition(config, dataset)
    if definition is not None:
        return f"own dataset entry {definition_sha256(definition)}"
    return builtin_source(dataset, data_mirror_of(config, dataset), config.get("data_dir", "data"))


def prepared_folder(dataset: str, definition: Mapping | None, source: str | None = None) -> str:
    """The folder under ``data_dir`` that holds a dataset's prepared ``{train,test}.npz``.

    An own dataset: ``<name>-<definition_sha256>``, keyed by its whole ``datasets:`` entry
    (source path, size, channels, resizing, split), so two configs, or two entries of the
    same name, never write, or delete, each other's files. A built-in dataset: its name
    when every source gives the same bytes (:data:`VERIFIED_SOURCES`) or when read from
    :data:`DOWNLOAD` (one per data_dir) or ``source`` is not known (None); else
    ``<name>-<first 16 hex digits of sha256(source)>``, ``source`` being its
    :func:`builtin_source`: CelebA from two mirrors (its images are not checked), or from
    the synthetic fixture, never shares a folder.
    """
    if definition is not None:
        return f"{dataset}-{definition_sha256(definition)}"
    if source is None or source == DOWNLOAD or dataset in VERIFIED_SOURCES:
        return dataset
    return f"{dataset}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def prepared_folder_of(config: Mapping, dataset: str) -> str:
    """:func:`prepared_folder` of a config's dataset (its source: :func:`data_identity`)."""
    definition = dataset_definition(config, dataset)
    source = None if definition is not None else data_identity(config, dataset)
    return prepared_folder(dataset, definition, source)


def experiment_spec(config: Mapping, name: str) -> str:
    """The settings that define an experiment's generator, as canonical JSON.

    A Snakemake param of the train rule: when it changes, the generator is retrained.
    Bookkeeping keys (``identity.NON_SEMANTIC_KEYS``) are left out, so changing them does not.
    """
    return experiment_spec_of(experiment(config, name))


def trained_experiment(config: Mapping, name: str, refusal: str) -> dict:
    """:func:`experiment`, refusing a ``real_data`` one with "uses real data: <refusal>"."""
    spec = experiment(config, name)
    if spec["method"] == "real_data":
        raise ValueError(f"experiment {name} uses real data: {refusal}")
    return spec


def dataset_of(config: Mapping, name: str) -> str:
    return experiment(config, name)["dataset"]


def needs_training(config: Mapping, name: str) -> bool:
    """Whether the experiment trains a generator (everything but ``real_data``)."""
    return experiment(config, name)["method"] != "real_data"


def is_private(config: Mapping, name: str) -> bool:
    """Whether the experiment is a DP release (:data:`PRIVATE_METHODS`: a ledger covers its
    folder)."""
    return experiment(config, name)["method"] in PRIVATE_METHODS


def private_experiments(config: Mapping) -> list[str]:
    """The DP releases of the config (:func:`is_private`), in config order."""
    return [n for n in experiment_names(config) if is_private(config, n)]


def experiment_home(config: Mapping, name: str) -> str:
    """``""`` for a DP release, else ``"nonprivate/"``: its folder is results/<run>/<home><name>."""
    return "" if is_private(config, name) else f"{NONPRIVATE}/"


def experiment_dir(config: Mapping, results: str | Path, name: str) -> Path:
    """The folder of an experiment's generator, ledger and samples (see :func:`experiment_home`)."""
    return Path(results) / f"{experiment_home(config, name)}{name}"


def evaluation_home(config: Mapping, name: str) -> str:
    """Where the FID / classifier scores go: the experiment's folder when its test split is
    public (:data:`PUBLIC_TEST_SPLITS`), else ``"nonprivate/"`` (scores against private data)."""
    if dataset_of(config, name) not in PUBLIC_TEST_SPLITS:
        return f"{NONPRIVATE}/"
    return experiment_home(config, name)


def evaluation_dir(config: Mapping, results: str | Path, name: str) -> Path:
    """The folder of an experiment's ``fid_seed*.json`` and ``acc_*_seed*.json``."""
    return Path(results) / f"{evaluation_home(config, name)}{name}"


def trained_experiments(config: Mapping) -> list[str]:
    return [n for n in experiment_names(config) if needs_training(config, n)]


def real_experiments(config: Mapping) -> list[str]:
    return [n for n in experiment_names(config) if not needs_training(config, n)]


def datasets(config: Mapping) -> list[str]:
    """Datasets used by any experiment, in order of first use."""
    return list(dict.fromkeys(dataset_of(config, n) for n in experiment_names(config)))


def table1_experiments(config: Mapping) -> dict[tuple[str, str], str]:
    """``{(dataset, row): experiment}`` for experiments that fill a Table 1 row, table order."""
    found = {}
    for name in experiment_names(config):
        exp = experiment(config, name)
        if exp["table1_row"] is not None:
            found[(exp["dataset"], exp["table1_row"])] = name
    order = {row: i for i, row in enumerate(TABLE1_ROWS)}
    dataset_order = {d: i for i, d in enumerate(datasets(config))}
    return dict(sorted(found.items(), key=lambda kv: (dataset_order[kv[0][0]], order[kv[0][1]])))


def table_experiments(config: Mapping, table: str) -> dict[tuple[str, str], str]:
    """``{(dataset, row): experiment}`` of one CelebA table (``rows:``), in table order."""
    found = {}
    for name in experiment_names(config):
        exp = experiment(config, name)
        row = exp["rows"].get(table)
        if row is not None:
            found[(exp["dataset"], row)] = name
    order = {row: i for i, row in enumerate(TABLE_ROWS[table])}
    dataset_order = {d: i for i, d in enumerate(datasets(config))}
    return dict(sorted(found.items(), key=lambda kv: (dataset_order[kv[0][0]], order[kv[0][1]])))


def figure_experiment(config: Mapping, dataset: str) -> str | None:
    """The dataset's main DP experiment, shown in the sample figure: ``paper``, else ``sound10``."""
    rows = table1_experiments(config)
    return rows.get((dataset, "paper")) or rows.get((dataset, "sound10"))


def figure_datasets(config: Mapping) -> list[str]:
    """Datasets with a Table 1 DP experiment, whose samples Table 1 shows (samples_<d>.png)."""
    return [d for d in datasets(config) if figure_experiment(config, d) is not None]


def paper_figure_datasets(config: Mapping) -> list[str]:
    """Those of the paper's datasets: the sample grids of Figures 2 and 7 put them side by
    side (same image size); an own dataset's samples are in Table 1's samples_<d>.png."""
    return [d for d in figure_datasets(config) if d in BUILTIN_DATASETS]


def classifiers_of(config: Mapping, dataset: str) -> list[str]:
    """The classifiers trained on this dataset's samples (``classifiers_by_dataset`` wins)."""
    evaluation = config["evaluation"]
    return list(evaluation["classifiers_by_dataset"].get(dataset, evaluation["classifiers"]))


def experiment_classifiers(config: Mapping, name: str) -> list[str]:
    """The classifiers trained on one experiment's samples: its dataset's
    (:func:`classifiers_of`), none for an unconditional generator (``conditional: false``:
    its samples have no labels; only FID evaluates it)."""
    exp = experiment(config, name)
    if exp.get("conditional", True) is False:
        return []
    return classifiers_of(config, exp["dataset"])


def all_classifiers(config: Mapping) -> list[str]:
    """Every classifier used by any experiment (the ``model`` wildcard's values)."""
    return list(dict.fromkeys(m for d in datasets(config) for m in classifiers_of(config, d)))


def fixture_source(config: Mapping) -> str | None:
    """``<data_dir>/celeba_source`` when CelebA comes from the synthetic fixture, else None."""
    if config.get("celeba_fixture") is None:
        return None
    return str(Path(config.get("data_dir", "data")) / FIXTURE_SOURCE)


def data_mirror_of(config: Mapping, dataset: str) -> str | None:
    """The ``--mirror`` of ``dpsinkhorn data`` for a dataset (the fixture's folder for CelebA)."""
    if dataset == "celeba" and fixture_source(config) is not None:
        return fixture_source(config)
    return config.get("data_mirror")
