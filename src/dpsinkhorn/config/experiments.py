"""Experiments of a validated config: their settings, and where the paper's tables use them.

An experiment is ``training_defaults`` with its own keys on top. The questions asked of
it here (which ones train, which datasets they use, which table row each one fills)
are what the workflow, the CLI steps and the reports share. Torch-free.
"""

from __future__ import annotations

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
}

#: The CelebA tables (paper Tables 3 and 6): each row and the method it needs.
#: An experiment names its rows with ``rows: {table3: dp, table6: biggan}``.
TABLE_ROWS = {
    "table3": {"real": "real_data", "nonprivate": "sinkhorn", "dp": "dp_sinkhorn"},
    "table6": {"real": "real_data", "dcgan": "dp_sinkhorn", "biggan": "dp_sinkhorn"},
}
#: Table 6 compares generators: its DP rows need this ``generator``.
TABLE6_GENERATOR = {"dcgan": "dcgan", "biggan": "biggan"}
#: Generator widths (``channels``) each architecture takes.
GENERATOR_WIDTHS = {"dcgan": 3, "biggan": 4}
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
    spec["name"] = name
    return spec


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
    return [d for d in datasets(config) if figure_experiment(config, d) is not None]


def classifiers_of(config: Mapping, dataset: str) -> list[str]:
    """The classifiers trained on this dataset's samples (``classifiers_by_dataset`` wins)."""
    evaluation = config["evaluation"]
    return list(evaluation["classifiers_by_dataset"].get(dataset, evaluation["classifiers"]))


def all_classifiers(config: Mapping) -> list[str]:
    """Every classifier used by any experiment (the ``model`` wildcard's values)."""
    return list(dict.fromkeys(m for d in datasets(config) for m in classifiers_of(config, d)))


def fixture_source(config: Mapping) -> str | None:
    """``<data_dir>/celeba_source`` when CelebA comes from the synthetic fixture, else None."""
    if config["celeba_fixture"] is None:
        return None
    return str(Path(config["data_dir"]) / FIXTURE_SOURCE)


def data_mirror_of(config: Mapping, dataset: str) -> str | None:
    """The ``--mirror`` of ``dpsinkhorn data`` for a dataset (the fixture's folder for CelebA)."""
    if dataset == "celeba" and fixture_source(config) is not None:
        return fixture_source(config)
    return config["data_mirror"]
