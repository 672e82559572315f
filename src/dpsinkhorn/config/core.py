"""Run configuration: load YAML, fill defaults, validate, and answer questions about it.

One schema (``config.schema.json``, shipped with the package) describes a run. The CLI
(``load_config``) and the Snakemake workflow (``validate`` on Snakemake's ``config``)
both go through :func:`validate`, so both report a bad key the same way, e.g.::

    config/quick.yaml: experiments.mnist_dpsinkhorn.sigam: unknown key (allowed: ...)

The helpers below the validation part (experiment lists, datasets, Table 1 rows) are
what the workflow rules use, so that the ``.smk`` files stay free of logic.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dpsinkhorn.config import studies
from dpsinkhorn.config.specs import (  # noqa: F401  (part of this module's API)
    IMPLICIT_DEFAULTS,
    NON_SEMANTIC_KEYS,
    deep_merge,
    experiment_spec_of,
)

SCHEMA_PATH = Path(__file__).with_name("schema.json")

#: Keys that may be overridden on the Snakemake command line (``--config key=value``).
#: Every other setting is read by the CLI steps from the config files themselves, so
#: an override of it would silently not reach them; :func:`check_overrides` refuses it.
OVERRIDABLE = (
    "data_mirror",
    "fid_weights",
    "device",
    "sweep_runs",
    "cuda_graphs",
    "compile_solver",
    "precision",
)

#: Why a sweep (``sweep_runs`` > 1) cannot train in bf16.
SWEEP_BF16_ERROR = (
    "precision bf16 cannot train sweeps: torch.func.vmap, which runs a sweep's generators, "
    "does not apply autocast on every device (pytorch/pytorch#105442); use sweep_runs: 1 "
    "or precision fp32 / tf32"
)

#: Table 1 rows this project fills, in table order, and the method each one needs.
TABLE1_ROWS = {
    "real": "real_data",
    "nonprivate": "sinkhorn",
    "paper": "dp_sinkhorn",
    "perrow": "dp_sinkhorn",
    "sound10": "dp_sinkhorn",
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

PathLike = str | os.PathLike


def cli_or_config(cli_value: Any, cfg: Mapping[str, Any], key: str) -> Any:
    """The command line's value of setting ``key`` when one was given (not ``None``),
    else the config's. Flags are ``--x`` / ``--no-x`` with default ``None``, so the
    workflow's ``--config x=False`` can switch off a file's ``x: true``."""
    return cfg[key] if cli_value is None else cli_value


# --------------------------------------------------------------------------- loading


@functools.cache
def load_schema() -> dict:
    """The JSON schema of a run configuration."""
    return json.loads(SCHEMA_PATH.read_text())


def read_yaml(path: PathLike) -> dict:
    """Read one YAML config file; it must hold a mapping."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a mapping of keys, got {type(data).__name__}")
    return data


def _as_paths(paths: Sequence[PathLike] | PathLike) -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        return [Path(paths)]
    return [Path(p) for p in paths]


def load_config(paths: Sequence[PathLike] | PathLike) -> dict:
    """Read YAML file(s) (later ones override earlier ones), fill defaults, validate.

    Raises ``ValueError`` naming the file, the key path and the bad value.
    """
    files = _as_paths(paths)
    if not files:
        raise ValueError("no config file given")
    merged: dict = {}
    for path in files:
        merged = deep_merge(merged, read_yaml(path))
    return validate(merged, files)


# ------------------------------------------------------------------------ validation


def validate(config: Mapping, source: str | Sequence[PathLike] = "config") -> dict:
    """Fill schema defaults into a copy of ``config``, validate it, and return the copy.

    ``source`` names where the config came from: a label, or the list of config files
    (then each error names the file that set the offending key; keys set in no file
    came from the command line and are reported as ``--config``).
    """
    filled = copy.deepcopy(dict(config))
    _fill_defaults(filled, load_schema())
    messages = _schema_errors(filled)
    if not messages and filled.get("studies"):
        # Each study cell becomes an experiment, checked like any other (dpsinkhorn.config.studies).
        try:
            studies.expand(filled)
        except ValueError as err:
            where, _, message = str(err).partition(": ")
            messages = [(where.split("."), message)]
        if not messages:
            messages = [
                (path, f"{message} (an experiment made by studies)")
                for path, message in _schema_errors(filled)
            ]
    if not messages:
        messages = _semantic_errors(filled)
    if messages:
        lines = [f"{_source_of(path, source, filled)}: {msg}" for path, msg in messages]
        raise ValueError("\n".join(lines))
    return filled


def _schema_errors(config: dict) -> list[tuple[list, str]]:
    """(key path, message) of every schema violation, in key order."""
    validator_cls = jsonschema.validators.validator_for(load_schema())
    errors = sorted(
        validator_cls(load_schema()).iter_errors(config),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    return [_describe(error) for error in errors]


def _resolve(schema: dict, root: dict) -> dict:
    """Follow a local ``$ref`` ("#/$defs/...") if there is one."""
    ref = schema.get("$ref")
    if not ref:
        return schema
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, root), **{k: v for k, v in schema.items() if k != "$ref"}}


def _fill_defaults(instance: dict, schema: dict, root: dict | None = None) -> None:
    """Set missing keys that have a schema ``default``, recursing into named properties.

    Experiments (under ``patternProperties``) get no defaults: they are merged over
    ``training_defaults`` by :func:`experiment`, and a filled default would win.
    """
    root = root or schema
    schema = _resolve(schema, root)
    for key, sub in schema.get("properties", {}).items():
        sub = _resolve(sub, root)
        empty_section = instance.get(key, 0) is None and isinstance(sub.get("default"), dict)
        if (key not in instance or empty_section) and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])  # also `evaluation:` left empty
        # Study settings and cells are changes to other experiments: filling defaults
        # into them would overwrite those experiments' own values.
        if isinstance(instance.get(key), dict) and key != "studies":
            _fill_defaults(instance[key], sub, root)


def _dotted(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> tuple[list, str]:
    """(key path, message) for one schema error, in words a user can act on."""
    path = list(error.absolute_path)
    schema, value, kind = error.schema, error.instance, error.validator
    if kind == "additionalProperties" and isinstance(value, dict):
        allowed = sorted(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        bad = [k for k in value if k not in allowed and not any(re.match(p, k) for p in patterns)]
        key = bad[0] if bad else "?"
        if patterns and not allowed:
            return path + [key], f"bad name {key!r} (must match {patterns[0]})"
        return path + [key], f"unknown key (allowed: {', '.join(allowed)})"
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return path + [missing], "missing required key"
    if kind == "type":
        types = error.validator_value
        types = " or ".join(types) if isinstance(types, list) else types
        hint = ""
        if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+", value):
            hint = " (YAML reads 1e-5 as text; write 1.0e-5)"
        if types == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
            hint = " (snakemake --config reads only True and False as booleans)"
        return path, f"bad value {value!r}: must be of type {types}{hint}"
    if kind == "enum":
        options = ", ".join("null" if v is None else str(v) for v in error.validator_value)
        return path, f"bad value {value!r}: must be one of {options}"
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
        return path, f"bad value {value!r}: must be {op[kind]} {error.validator_value}"
    return path, f"bad value {value!r}: {error.message}"


def _semantic_errors(config: dict) -> list[tuple[list, str]]:
    """Checks across keys that the schema cannot express."""
    errors: list[tuple[list, str]] = []
    if config["precision"] == "bf16" and config["sweep_runs"] > 1:
        errors.append((["precision"], SWEEP_BF16_ERROR))
    rows: dict[tuple[str, str], str] = {}
    table_rows: dict[tuple[str, str, str], str] = {}
    for name in experiment_names(config):
        exp = experiment(config, name)
        at = ["experiments", name]
        method = exp["method"]
        errors += _celeba_errors(config, exp, at, table_rows)
        for key, value in exp.items():  # YAML's .nan / .inf pass the schema's bounds
            if isinstance(value, float) and not math.isfinite(value):
                errors.append((at + [key], f"bad value {value!r}: must be a finite number"))
        if method != "real_data":
            if exp["sigma"] is None and exp["steps"] is None:
                errors.append((at + ["sigma"], "sigma and steps are both null; give at least one"))
            elif method == "sinkhorn" and exp["steps"] is None:
                errors.append((at + ["steps"], "method sinkhorn (non-private) needs steps"))
            elif method == "dp_sinkhorn" and None in (exp["sigma"], exp["steps"]):
                if exp["target_epsilon"] is None:
                    missing = "sigma" if exp["sigma"] is None else "steps"
                    errors.append(
                        (at + ["target_epsilon"], f"{missing} is null, so target_epsilon is needed")
                    )
            if method == "dp_sinkhorn" and exp["perturbation"] == "parameter":
                if exp["clipping"] != "batch":
                    errors.append(
                        (
                            at + ["clipping"],
                            f"perturbation parameter clips the whole parameter gradient as "
                            f"one vector: clipping must be batch, not {exp['clipping']}",
                        )
                    )
        row = exp.get("table1_row")
        if row is None:
            continue
        if TABLE1_ROWS[row] != method:
            errors.append(
                (at + ["table1_row"], f"row {row!r} needs method {TABLE1_ROWS[row]}, not {method}")
            )
        if row == "sound10" and not (
            exp["target_epsilon"] == 10 and None in (exp["sigma"], exp["steps"])
        ):
            errors.append(
                (
                    at + ["table1_row"],
                    "row 'sound10' needs target_epsilon: 10 with sigma or steps null "
                    "(so that the target is what sets the noise or the length)",
                )
            )
        if row == "perrow" and exp["clipping"] != "per_sample":
            errors.append(
                (
                    at + ["table1_row"],
                    "row 'perrow' is the paper's per-row mechanism: it needs clipping: per_sample, "
                    f"not {exp['clipping']}",
                )
            )
        other = rows.setdefault((exp["dataset"], row), name)
        if other != name:
            errors.append(
                (at + ["table1_row"], f"{exp['dataset']} row {row!r} is already filled by {other}")
            )
    return errors


def _celeba_errors(config: dict, exp: dict, at: list, seen: dict) -> list[tuple[list, str]]:
    """Generator widths, and the Table 3 / Table 6 rows of one experiment."""
    errors = []
    generator = exp.get("generator") or "dcgan"
    widths = GENERATOR_WIDTHS[generator]
    if exp["method"] != "real_data" and len(exp["channels"]) != widths:
        errors.append(
            (
                at + ["channels"],
                f"generator {generator} needs {widths} widths, got {exp['channels']}",
            )
        )
    if generator == "biggan" and exp["dataset"] != "celeba":
        errors.append((at + ["generator"], "biggan makes 32x32 RGB images: dataset celeba only"))
    for table, row in (exp.get("rows") or {}).items():
        where = at + ["rows", table]
        needed = TABLE_ROWS[table][row]
        if needed != exp["method"]:
            errors.append((where, f"row {row!r} needs method {needed}, not {exp['method']}"))
        if table == "table6" and row in TABLE6_GENERATOR and TABLE6_GENERATOR[row] != generator:
            errors.append((where, f"row {row!r} needs generator: {TABLE6_GENERATOR[row]}"))
        other = seen.setdefault((table, exp["dataset"], row), exp["name"])
        if other != exp["name"]:
            errors.append((where, f"{exp['dataset']} row {row!r} is already filled by {other}"))
    return errors


_MISSING = object()


def setting_source(files: Sequence[PathLike] | PathLike, names: Sequence[str], key: str) -> str:
    """``<file>: <key path>`` of the config file that sets ``key`` for the experiments
    ``names`` (``experiments.<name>.<key>``, else ``training_defaults.<key>``; later
    files win), or the schema default when no file sets it."""
    loaded = []
    for file in _as_paths(files):
        try:
            loaded.append((file, read_yaml(file)))
        except (OSError, ValueError):
            continue
    for file, data in reversed(loaded):
        for name in names:
            if _lookup(data, ["experiments", name, key]) is not _MISSING:
                return f"{file}: experiments.{name}.{key}"
    for file, data in reversed(loaded):
        if _lookup(data, ["training_defaults", key]) is not _MISSING:
            return f"{file}: training_defaults.{key}"
    return f"{', '.join(str(f) for f, _ in loaded) or 'config'}: {key} (schema default)"


def _lookup(node: Any, path: Sequence) -> Any:
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _source_of(path: list, source: str | Sequence[PathLike], config: Mapping) -> str:
    """``<file>: <key path>``, naming the last config file that set the key to its value.

    A key in no file came from the command line (``--config``); a missing key is
    reported in the last file that holds its parent.
    """
    where = _dotted(path)
    if isinstance(source, str):
        return f"{source}: {where}"
    files = _as_paths(source)
    loaded = []
    for file in files:
        try:
            loaded.append((file, read_yaml(file)))
        except (OSError, ValueError):
            continue
    value = _lookup(config, path)
    for file, data in reversed(loaded):
        if value is not _MISSING and _lookup(data, path) == value:
            return f"{file}: {where}"
    for file, data in reversed(loaded):
        if value is _MISSING and path and isinstance(_lookup(data, path[:-1]), dict):
            return f"{file}: {where}"
    return f"{'--config' if files else 'config'}: {where}"


# ---------------------------------------------------------------------------- queries


def make_experiment(name: str = "custom", **settings: Any) -> dict:
    """A validated experiment from keyword settings, for the Python API.

    Keys are those of ``training_defaults`` (schema defaults fill the rest, i.e. the
    paper's MNIST setting); e.g. ``make_experiment(sigma=None, target_epsilon=5.0,
    steps=20000, delta=1e-6)``.
    """
    settings.setdefault("dataset", "mnist")
    return experiment(validate({"experiments": {name: settings}}, "make_experiment"), name)


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
    Bookkeeping keys (:data:`NON_SEMANTIC_KEYS`) are left out, so changing them does not.
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


def figure_experiment(config: Mapping, dataset: str) -> str | None:
    """The dataset's main DP experiment, shown in the sample figure: ``paper``, else ``sound10``."""
    rows = table1_experiments(config)
    return rows.get((dataset, "paper")) or rows.get((dataset, "sound10"))


def figure_datasets(config: Mapping) -> list[str]:
    return [d for d in datasets(config) if figure_experiment(config, d) is not None]


def classifiers_of(config: Mapping, dataset: str) -> list[str]:
    """The classifiers trained on this dataset's samples (``classifiers_by_dataset`` wins)."""
    evaluation = config["evaluation"]
    return list(
        evaluation.get("classifiers_by_dataset", {}).get(dataset, evaluation["classifiers"])
    )


def all_classifiers(config: Mapping) -> list[str]:
    """Every classifier used by any experiment (the ``model`` wildcard's values)."""
    return list(dict.fromkeys(m for d in datasets(config) for m in classifiers_of(config, d)))


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


def report_tables(config: Mapping) -> list[str]:
    """The CelebA tables (``table3``, ``table6``) that some experiment of the config fills."""
    return [t for t in TABLE_ROWS if table_experiments(config, t)]


#: The sample figure of each CelebA table: the rows whose samples it shows, top to bottom.
TABLE_FIGURES = {"table3": ("fig3", ("dp",)), "table6": ("fig6", ("dcgan", "biggan"))}


def table_figure_experiments(config: Mapping, table: str) -> list[str]:
    """Experiments shown in the table's figure (fig3: the DP row; fig6: DCGAN, BigGAN)."""
    rows = table_experiments(config, table)
    _, kinds = TABLE_FIGURES[table]
    return [name for (_, row), name in rows.items() if row in kinds]


def table_files(config: Mapping, table: str, results: PathLike) -> dict[str, list[str]]:
    """What a CelebA table reads: per-seed results, privacy reports, figure samples."""
    results = Path(results)
    rows = table_experiments(config, table)
    seed = config["seeds"][0]
    return {
        "results": [
            str(results / name / f"{metric}_seed{s}.json")
            for (dataset, _), name in rows.items()
            for metric in ["fid"] + [f"acc_{m}" for m in classifiers_of(config, dataset)]
            for s in config["seeds"]
        ],
        "privacy": [
            str(results / n / "privacy.json") for n in rows.values() if needs_training(config, n)
        ],
        "samples": [
            str(results / name / f"samples_seed{seed}.npz")
            for name in table_figure_experiments(config, table)
        ],
    }


def table_outputs(config: Mapping, table: str, results: PathLike) -> dict[str, str]:
    """The files ``dpsinkhorn report <table>`` writes (tables/<table>.{md,csv,tex}, figure)."""
    results = Path(results)
    figure, _ = TABLE_FIGURES[table]
    out = {suffix: str(results / "tables" / f"{table}.{suffix}") for suffix in ("md", "csv", "tex")}
    return {**out, "figure": str(results / "figures" / f"{figure}.png")}


def report_targets(config: Mapping, results: PathLike) -> list[str]:
    """Outputs of every CelebA table the config fills (for ``rule all``)."""
    return [f for t in report_tables(config) for f in table_outputs(config, t, results).values()]


def fixture_source(config: Mapping) -> str | None:
    """``<data_dir>/celeba_source`` when CelebA comes from the synthetic fixture, else None."""
    if config.get("celeba_fixture") is None:
        return None
    return str(Path(config["data_dir"]) / FIXTURE_SOURCE)


def data_mirror_of(config: Mapping, dataset: str) -> str | None:
    """The ``--mirror`` of ``dpsinkhorn data`` for a dataset (the fixture's folder for CelebA)."""
    if dataset == "celeba" and fixture_source(config) is not None:
        return fixture_source(config)
    return config.get("data_mirror")


def data_inputs(config: Mapping, dataset: str) -> list[str]:
    """Inputs of the data rule: the fixture folder for a fixture CelebA, else nothing."""
    source = fixture_source(config) if dataset == "celeba" else None
    return [] if source is None else [source]


def train_runtime_minutes(config: Mapping, name: str) -> int:
    """Generous wall-time estimate for a SLURM job (paper: ~1 step/s on a V100)."""
    steps = experiment(config, name)["steps"]
    return 3 * 24 * 60 if steps is None else max(30, int(steps / 60 * 1.5) + 30)


def config_file_args(files: Iterable[PathLike]) -> str:
    """Config files as CLI arguments: relative to the working directory when inside it.

    A stable spelling keeps Snakemake from rerunning steps because ``config/quick.yaml``
    was once given as ``./config/quick.yaml`` or as an absolute path.
    """
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


def check_overrides(config: Mapping, files: Sequence[PathLike]) -> None:
    """Refuse ``--config`` overrides of keys that the CLI steps read from the files.

    ``config`` is Snakemake's validated config; ``files`` are its ``--configfile`` files.
    """
    from_files = load_config(files)
    changed = sorted(
        key
        for key in set(config) | set(from_files)
        if key not in OVERRIDABLE and config.get(key) != from_files.get(key)
    )
    if changed:
        raise ValueError(
            f"--config may only override {', '.join(OVERRIDABLE)}; "
            f"{', '.join(changed)} must be changed in a config file "
            f"({', '.join(map(str, files))}): the steps read the files, not --config"
        )


# --------------------------------------------------------------------------- the workflow process


def prepare_workflow_process() -> None:
    """Called once by the workflow (common.smk) in the Snakemake process.

    * Puts the folder of the Python running Snakemake first on ``PATH``: the steps call
      ``dpsinkhorn``, and ``.venv/bin/snakemake`` then works without an activated venv
      (jobs inherit the variable).
    * Ctrl-C stops the workflow: Snakemake's own SIGINT handling lets a failed job be
      retried, so training (which checkpoints and exits 130 on the same SIGINT from the
      terminal) would be restarted. While jobs run, a SIGINT becomes Snakemake's graceful
      SIGTERM stop (no new job, no retry); before the scheduler runs, a KeyboardInterrupt.
    """
    own_bin = str(Path(sys.executable).parent)
    os.environ["PATH"] = os.pathsep.join([own_bin, os.environ.get("PATH", "")])

    def user_interrupt(signum, frame):
        if callable(signal.getsignal(signal.SIGTERM)):  # the scheduler's graceful stop
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            signal.default_int_handler(signum, frame)

    try:
        signal.signal(signal.SIGINT, user_interrupt)
    except ValueError:  # not the main thread: leave Snakemake's default
        pass
