"""Experiments of a validated config (``training_defaults`` with each one's keys on top):
which train, their datasets and folders, the table rows they fill. Torch-free."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn.config.identity import deep_merge, experiment_spec_of

PathLike = str | os.PathLike

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
#: ``channels`` each generator takes, per image size.
GENERATOR_WIDTHS = {"dcgan": {28: 3, 32: 3, 64: 4}, "biggan": {32: 4}, "merf": {28: 3, 32: 3}}
#: Datasets known by name; others are declared under the config's ``datasets:``.
BUILTIN_DATASETS = ("mnist", "fmnist", "celeba")

#: Folder under results/<run>/ of what is computed from private data outside any ledger.
NONPRIVATE = "nonprivate"
TABLES_DIR = "tables"
FIGURES_DIR = "figures"
LOGS_DIR = "logs"
BENCHMARKS_DIR = "benchmarks"
#: Fixed folders under results/<run>/: no experiment may take one of these names.
RUN_FOLDERS = (NONPRIVATE, TABLES_DIR, FIGURES_DIR, LOGS_DIR, BENCHMARKS_DIR)
#: Datasets whose test split is public; scores against any other go under ``nonprivate/``.
PUBLIC_TEST_SPLITS = ("mnist", "fmnist", "celeba")
#: The synthetic CelebA source's folder under data_dir (``celeba_fixture``).
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
        folder = prepared_folder_of(config, spec["dataset"])
        if folder != spec["dataset"]:
            spec["prepared_folder"] = folder
    spec["name"] = name
    return spec


def dataset_definition(config: Mapping, dataset: str | None) -> dict | None:
    """The config's ``datasets.<dataset>`` entry (an own dataset), or None."""
    entry = (config.get("datasets") or {}).get(dataset) if dataset else None
    return None if entry is None else dict(entry)


def definition_sha256(definition: Mapping) -> str:
    """SHA-256 of an own dataset's validated entry, as canonical JSON (first 16 hex digits)."""
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]


#: Built-in datasets whose archives are MD5-checked: every source gives the same files.
VERIFIED_SOURCES = ("mnist", "fmnist")


def normal_mirror(mirror: str | os.PathLike | None) -> str | None:
    """``data_mirror`` as its real path (so a new spelling reruns nothing), or None."""
    return None if mirror is None else os.path.realpath(os.path.expanduser(os.fspath(mirror)))


def builtin_source(dataset: str, mirror: str | os.PathLike | None, data_dir) -> str:
    """What decides a built-in dataset's prepared bytes: its MD5-checked archives, the
    download, ``mirror <data_dir>/<path>`` (inside data_dir) or ``mirror <real path>``."""
    if dataset in VERIFIED_SOURCES:
        return "official archives (MD5-checked)"
    if mirror is None:
        return "download"
    real, root = normal_mirror(mirror), normal_mirror(data_dir)
    inside = os.path.relpath(real, root)
    if inside != os.pardir and not inside.startswith(os.pardir + os.sep):
        return f"mirror <data_dir>/{Path(inside).as_posix()}"
    return f"mirror {real}"


def data_identity(config: Mapping, dataset: str) -> str:
    """What decides a dataset's prepared bytes (the data rule's rerun-triggering param):
    an own dataset's entry hash, else :func:`builtin_source`."""
    definition = dataset_definition(config, dataset)
    if definition is not None:
        return f"own dataset entry {definition_sha256(definition)}"
    return builtin_source(dataset, data_mirror_of(config, dataset), config.get("data_dir", "data"))


def prepared_folder(dataset: str, definition: Mapping | None, source: str | None = None) -> str:
    """Folder under ``data_dir`` of a dataset's prepared ``{train,test}.npz``:
    ``<name>-<definition_sha256>`` (own), ``<name>`` (verified, download or unknown source),
    else ``<name>-<sha256(source)[:16]>``, so two sources never share a folder."""
    if definition is not None:
        return f"{dataset}-{definition_sha256(definition)}"
    if source in (None, "download") or dataset in VERIFIED_SOURCES:
        return dataset
    return f"{dataset}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def prepared_folder_of(config: Mapping, dataset: str) -> str:
    """:func:`prepared_folder` of a config's dataset (its source: :func:`data_identity`)."""
    definition = dataset_definition(config, dataset)
    source = None if definition is not None else data_identity(config, dataset)
    return prepared_folder(dataset, definition, source)


def experiment_spec(config: Mapping, name: str) -> str:
    """:func:`~dpsinkhorn.config.identity.experiment_spec_of` (the train rule's param)."""
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
    """Whether the experiment is a DP release (:data:`PRIVATE_METHODS`)."""
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


def evaluation_dir(config: Mapping, results: str | Path, name: str) -> Path:
    """The folder of an experiment's ``fid_seed*.json`` and ``acc_*_seed*.json``: its own,
    or under ``nonprivate/`` for a private test split."""
    if dataset_of(config, name) not in PUBLIC_TEST_SPLITS:
        return Path(results) / NONPRIVATE / name
    return experiment_dir(config, results, name)


def trained_experiments(config: Mapping) -> list[str]:
    return [n for n in experiment_names(config) if needs_training(config, n)]


def real_experiments(config: Mapping) -> list[str]:
    return [n for n in experiment_names(config) if not needs_training(config, n)]


def datasets(config: Mapping) -> list[str]:
    """Datasets used by any experiment, in order of first use."""
    return list(dict.fromkeys(dataset_of(config, n) for n in experiment_names(config)))


def table1_experiments(config: Mapping) -> dict[tuple[str, str], str]:
    """:func:`table_experiments` of Table 1."""
    return table_experiments(config, "table1")


def table_experiments(config: Mapping, table: str) -> dict[tuple[str, str], str]:
    """``{(dataset, row): experiment}`` of Table 1 (``table1_row``) or a CelebA table
    (``rows:``), in the order of the datasets and of the table's rows."""
    rows = list(TABLE1_ROWS if table == "table1" else TABLE_ROWS[table])
    found = {}
    for name in experiment_names(config):
        exp = experiment(config, name)
        row = exp["table1_row"] if table == "table1" else exp["rows"].get(table)
        if row is not None:
            found[(exp["dataset"], row)] = name
    order = datasets(config)
    return dict(sorted(found.items(), key=lambda kv: (order.index(kv[0][0]), rows.index(kv[0][1]))))


def figure_experiment(config: Mapping, dataset: str) -> str | None:
    """The dataset's main DP experiment, shown in the sample figure: ``paper``, else ``sound10``."""
    rows = table1_experiments(config)
    return rows.get((dataset, "paper")) or rows.get((dataset, "sound10"))


def figure_datasets(config: Mapping) -> list[str]:
    """Datasets with a Table 1 DP experiment, whose samples Table 1 shows (samples_<d>.png)."""
    return [d for d in datasets(config) if figure_experiment(config, d) is not None]


def paper_figure_datasets(config: Mapping) -> list[str]:
    """Those of the built-in datasets (Figures 2 and 7 put their grids side by side)."""
    return [d for d in figure_datasets(config) if d in BUILTIN_DATASETS]


def classifiers_of(config: Mapping, dataset: str) -> list[str]:
    """The classifiers trained on this dataset's samples (``classifiers_by_dataset`` wins)."""
    evaluation = config["evaluation"]
    return list(evaluation["classifiers_by_dataset"].get(dataset, evaluation["classifiers"]))


def experiment_classifiers(config: Mapping, name: str) -> list[str]:
    """Classifiers trained on an experiment's samples: none for an unconditional one."""
    exp = experiment(config, name)
    return classifiers_of(config, exp["dataset"]) if exp.get("conditional", True) else []


def all_classifiers(config: Mapping) -> list[str]:
    """Every classifier used by any experiment (the ``model`` wildcard's values)."""
    return list(dict.fromkeys(m for d in datasets(config) for m in classifiers_of(config, d)))


def fixture_source(config: Mapping) -> str | None:
    """``<data_dir>/celeba_source`` when CelebA comes from the synthetic fixture, else None."""
    if config.get("celeba_fixture") is not None:
        return str(Path(config.get("data_dir", "data")) / FIXTURE_SOURCE)


def data_mirror_of(config: Mapping, dataset: str) -> str | None:
    """The ``--mirror`` of ``dpsinkhorn data`` for a dataset (the fixture's folder for CelebA)."""
    return (fixture_source(config) if dataset == "celeba" else None) or config.get("data_mirror")
