"""Run configuration: load YAML, fill defaults from ``schema.json``, validate (the CLI and
the workflow alike: the schema, then checks across keys), and say which file set a key, e.g.
``config/quick.yaml: experiments.mnist_dpsinkhorn.sigam: unknown key (allowed: ...)``."""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dpsinkhorn.config import studies
from dpsinkhorn.config.cluster import cluster_errors
from dpsinkhorn.config.experiments import (
    BUILTIN_DATASETS,
    FIXTURE_SOURCE,
    GENERATOR_WIDTHS,
    RUN_FOLDERS,
    TABLE1_ROWS,
    TABLE6_GENERATOR,
    TABLE_ROWS,
    PathLike,
    experiment,
    experiment_names,
    normal_mirror,
)
from dpsinkhorn.config.identity import deep_merge

SCHEMA_PATH = Path(__file__).with_name("schema.json")

#: Keys that may be overridden on the Snakemake command line (``--config key=value``).
#: Every other setting is read by the CLI steps from the config files themselves, so
#: an override of it would silently not reach them; :func:`check_overrides` refuses it.
OVERRIDABLE = tuple(
    "data_mirror fid_weights device sweep_runs cuda_graphs compile_solver precision".split()
)


def cli_or_config(cli_value: Any, cfg: Mapping[str, Any], key: str) -> Any:
    """The command line's value of setting ``key`` when one was given (not ``None``),
    else the config's. Flags are ``--x`` / ``--no-x`` with default ``None``, so the
    workflow's ``--config x=False`` can switch off a file's ``x: true``."""
    return cfg[key] if cli_value is None else cli_value


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (argparse names the option, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def check_device(name: str) -> str:
    """``name`` if the config's ``device`` key may take it (torch refuses others only with
    a RuntimeError, after the setup); else a ValueError naming it."""
    if not isinstance(name, str) or not re.fullmatch(
        load_schema()["properties"]["device"]["pattern"], name
    ):
        raise ValueError(f"device {name!r}: must be auto, cpu, cuda or cuda:N")
    return name


def device_option(text: str) -> str:
    """An argparse ``type`` for ``--device``: :func:`check_device`."""
    try:
        return check_device(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be auto, cpu, cuda or cuda:N") from None


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
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not valid YAML (not UTF-8 text: byte {err.start})") from err
    except OSError as err:  # no read permission, an I/O error
        raise ValueError(f"{path}: cannot read the config file ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({_yaml_problem(err)})") from err
    if not isinstance(data, dict | None):
        raise ValueError(f"{path}: must hold a mapping of keys, got {type(data).__name__}")
    return data or {}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, where a key given twice in one mapping (two experiments of one
    name) is an error: PyYAML keeps the last one and drops the other without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be redefined
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # refused by the safe loader itself
            if key in seen:
                problem = f"duplicate key {key!r}"
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: where the YAML parser stopped, and why."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _as_paths(paths: Sequence[PathLike] | PathLike) -> list[Path]:
    return [Path(p) for p in ([paths] if isinstance(paths, str | os.PathLike) else paths)]


def load_config(paths: Sequence[PathLike] | PathLike) -> dict:
    """Read YAML file(s) (later ones win), fill defaults, validate; a ``ValueError`` names
    the file, the key path and the bad value."""
    files = _as_paths(paths)
    if not files:
        raise ValueError("no config file given")
    merged: dict = {}
    for path in files:
        merged = deep_merge(merged, read_yaml(path))
    return validate(merged, files)


def validate(config: Mapping, source: str | Sequence[PathLike] = "config") -> dict:
    """A validated copy of ``config`` with schema defaults filled in. ``source``: a label,
    or the config files (each error then names the file that set the key, or ``--config``)."""
    filled = copy.deepcopy(dict(config))
    # Keys that are no text (YAML's `1:`, `yes:`) and values that are no finite number
    # (YAML's .nan and .inf pass the schema's bounds) are refused wherever they are.
    messages = _value_errors(filled)
    made: dict[str, str] = {}  # experiment made by a study -> that study
    if not messages:
        _fill_defaults(filled, load_schema())
        datasets = filled.get("datasets")
        for entry in datasets.values() if isinstance(datasets, dict) else ():
            if isinstance(entry, dict):  # own datasets: under patternProperties
                _fill_defaults(entry, load_schema()["$defs"]["own_dataset"])
        messages = _schema_errors(filled)
    if not messages and filled.get("studies"):
        # Each study cell becomes an experiment, checked like any other (dpsinkhorn.config.studies).
        try:
            cells, new = studies.plan_cells(filled)
            made = {c.experiment: s for s, cs in cells.items() for c in cs if c.experiment in new}
            filled["experiments"] = {**filled["experiments"], **new}
        except ValueError as err:
            where, _, message = str(err).partition(": ")
            messages = [(where.split("."), message)]
        if not messages:
            messages = [
                (path, f"{message} (an experiment made by studies.{made.get(path[1], '')})")
                for path, message in _schema_errors(filled)
            ]
    if not messages:
        messages = semantic_errors(filled)
    if messages:
        lines = []
        for path, msg in messages:
            # An experiment made by a study is in no file: name the file of that study.
            study = made.get(path[1]) if path[:1] == ["experiments"] and len(path) > 1 else None
            file = _file_of(["studies", study] if study else path, source, filled)
            lines.append(f"{file}: {'.'.join(map(str, path)) or '<top level>'}: {msg}")
        raise ValueError("\n".join(lines))
    filled["data_mirror"] = normal_mirror(filled.get("data_mirror"))
    return filled


def _value_errors(node: Any, path: list | None = None) -> list[tuple[list, str]]:
    """A key that is no text (YAML reads ``1:`` as a number, ``yes:`` as true) or a number
    that is not finite (YAML's .nan, .inf), at any depth."""
    path = path or []
    if isinstance(node, float) and not math.isfinite(node):
        return [(path, f"bad value {node!r}: must be a finite number")]
    if not isinstance(node, dict | list):
        return []
    errors = []
    for key, value in node.items() if isinstance(node, dict) else enumerate(node):
        if isinstance(node, dict) and not isinstance(key, str):
            errors.append((path + [key], f"bad name {key!r}: a key must be text (quote it)"))
        else:
            errors += _value_errors(value, path + [key])
    return errors


@functools.cache
def _validator_class() -> type:
    """The schema's validator, where an integer is an int: JSON Schema also takes 1000.0,
    which later fails as a step count or makes a file ``samples_seed0.0.npz``."""
    base = jsonschema.validators.validator_for(load_schema())
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)


def _schema_errors(config: dict, schema: dict | None = None) -> list[tuple[list, str]]:
    """(key path, message) of every violation of the schema (or of ``schema``), in key order."""
    errors = sorted(
        _validator_class()(schema or load_schema()).iter_errors(config),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    return [_describe(error, config) for error in errors]


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
    """Set missing keys that have a schema ``default``, recursing into named properties
    (not experiments: a default there would win over ``training_defaults``)."""
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


def _describe(error: jsonschema.ValidationError, checked: Mapping) -> tuple[list, str]:
    """(key path, message) for one schema error, in words a user can act on: the schema's
    own ``message`` where it has one ({value}: the value; {<key>}: a key of ``checked``)."""
    path = list(error.absolute_path)
    schema, value, kind = error.schema, error.instance, error.validator
    if "message" in schema:
        return path, schema["message"].format_map({**checked, "value": value})
    branches = error.validator_value if kind in ("oneOf", "anyOf") else []
    if branches and all(set(b) == {"required"} for b in branches):  # a study: cells or vary
        keys = " or ".join(k for b in branches for k in b["required"])
        both = error.context == [] and isinstance(value, dict)  # valid under each branch
        return path, f"give {keys}, not both" if both else f"give {keys}"
    if branches and error.context:
        # No branch fits (a study cell: {experiment: NAME} or settings): the error of the
        # branch with the fewest, e.g. the unknown key, not the whole value.
        by_branch: dict[int, list] = {}
        for sub in error.context:
            by_branch.setdefault(sub.schema_path[0], []).append(sub)
        fewest = min(by_branch.values(), key=len)
        return _describe(max(fewest, key=lambda e: len(e.absolute_path)), checked)
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


_MISSING = object()


def _readable(files: Sequence[PathLike] | PathLike) -> list[tuple[Path, dict]]:
    """(file, its data) of the config files that read as YAML mappings."""
    loaded = []
    for file in _as_paths(files):
        try:
            loaded.append((file, read_yaml(file)))
        except (OSError, ValueError):
            continue
    return loaded


def setting_source(files: Sequence[PathLike] | PathLike, names: Sequence[str], key: str) -> str:
    """``<file>: <key path>`` of the config file that sets ``key`` for the experiments
    ``names`` (``experiments.<name>.<key>``, else ``training_defaults.<key>``; later
    files win), or the schema default when no file sets it."""
    loaded = _readable(files)
    for file, data in reversed(loaded):
        for name in names:
            if _lookup(data, ["experiments", name, key]) is not _MISSING:
                return f"{file}: experiments.{name}.{key}"
    for file, data in reversed(loaded):
        if _lookup(data, ["training_defaults", key]) is not _MISSING:
            return f"{file}: training_defaults.{key}"
    return f"{', '.join(str(f) for f, _ in loaded) or 'config'}: {key} (schema default)"


def _lookup(node: Any, path: Sequence) -> Any:
    """The value at ``path`` (keys of mappings, indices of lists), or ``_MISSING``."""
    for key in path:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and type(key) is int and -len(node) <= key < len(node):
            node = node[key]
        else:
            return _MISSING
    return node


def _same(a: Any, b: Any) -> bool:
    """``a == b``, NaN equal to NaN (a YAML .nan is traced to the file that holds it)."""
    nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return nan or a == b


def _file_of(path: list, source: str | Sequence[PathLike], config: Mapping) -> str:
    """The last config file that set the key at ``path`` (``--config`` if none did); a
    missing or defaulted key: the last file that holds its parent."""
    if isinstance(source, str):
        return source
    loaded = _readable(source)
    value = _lookup(config, path)
    for file, data in reversed(loaded):
        found = _lookup(data, path)
        # A mapping (a dataset, an experiment) is merged over the files and filled with
        # defaults: the last file that holds it set it.
        mapping = isinstance(value, dict) and isinstance(found, dict)
        if value is not _MISSING and (mapping or _same(found, value)):
            return str(file)
    in_no_file = all(_lookup(data, path) is _MISSING for _, data in loaded)
    for file, data in reversed(loaded):
        # Below the top level (where --config sets keys), a key in no file was filled in
        # from the schema's defaults.
        defaulted = len(path) > 1 and in_no_file
        if (value is _MISSING or defaulted) and isinstance(_lookup(data, path[:-1]), dict):
            return str(file)
    return "--config" if _as_paths(source) else "config"


#: Why a sweep (``sweep_runs`` > 1) cannot train in bf16.
SWEEP_BF16_ERROR = (
    "precision bf16 cannot train sweeps: torch.func.vmap, which runs a sweep's generators, "
    "does not apply autocast on every device (pytorch/pytorch#105442); use sweep_runs: 1 "
    "or precision fp32 / tf32"
)
#: Names an own dataset (``datasets:``) may not take: built-ins and folders of data_dir.
RESERVED_DATASET_NAMES = (*BUILTIN_DATASETS, "torchvision", FIXTURE_SOURCE)


def semantic_errors(config: dict) -> list[tuple[list, str]]:
    """Checks across keys: the schema's ``experiment_rules`` on each experiment with its
    defaults, and what needs the config's tables (datasets, generator widths, table rows)."""
    errors: list[tuple[list, str]] = []
    if config["precision"] == "bf16" and config["sweep_runs"] > 1:
        errors.append((["precision"], SWEEP_BF16_ERROR))
    errors += cluster_errors(config)
    own = config.get("datasets") or {}
    for name, entry in own.items():
        if name in RESERVED_DATASET_NAMES:
            message = f"bad name {name!r}: taken by a built-in dataset or a data_dir folder"
            errors.append((["datasets", name], message))
        if entry.get("classes"):  # the rule of sample files: refused before a training
            from dpsinkhorn.fileio import check_class_names

            try:
                check_class_names(entry["classes"], "bad value")
            except ValueError as err:
                errors.append((["datasets", name, "classes"], str(err)))
    rules = load_schema()["$defs"]["experiment_rules"]
    seen: dict[tuple, str] = {}  # (table, dataset, row) -> the experiment that fills it
    folders: dict[str, str] = {}  # lower-case name -> the experiment that has that folder
    for name in experiment_names(config):
        exp, at = experiment(config, name), ["experiments", name]
        errors += [(at + path, message) for path, message in _schema_errors(exp, rules)]
        if (other := folders.setdefault(name.lower(), name)) != name:
            message = (
                f"bad name {name!r}: differs from experiment {other!r} only in case, and "
                "the two would share one folder on a case-insensitive disk; rename one"
            )
            errors.append((at, message))
        if name.lower() in RUN_FOLDERS:  # lower: one folder on a case-insensitive disk
            message = (
                f"bad name {name!r}: results/<run>/ already has a folder of that name "
                f"({', '.join(RUN_FOLDERS)}; in any case), where a DP release's folder "
                "would be; rename the experiment"
            )
            errors.append((at, message))
        if exp["dataset"] not in (known := [*BUILTIN_DATASETS, *own]):
            message = f"bad value {exp['dataset']!r}: must be one of {', '.join(known)}"
            errors.append((at + ["dataset"], message))
        generator = exp.get("generator") or "dcgan"
        size = (own.get(exp["dataset"]) or {}).get("image_size")  # own datasets name theirs
        by_size = GENERATOR_WIDTHS[generator]
        widths = (by_size[size],) if size in by_size else tuple(sorted(set(by_size.values())))
        if exp["method"] != "real_data" and len(exp["channels"]) not in widths:
            at_size = f" at {size}x{size}" if size else ""
            count = " or ".join(map(str, widths))
            message = f"generator {generator} needs {count} widths{at_size}, got {exp['channels']}"
            errors.append((at + ["channels"], message))
        rows = {"table1_row": exp["table1_row"], **exp["rows"]}
        for table, row in rows.items():
            if row is None:
                continue
            where = at + (["table1_row"] if table == "table1_row" else ["rows", table])
            needed = TABLE1_ROWS[row] if table == "table1_row" else TABLE_ROWS[table][row]
            if needed != exp["method"]:
                errors.append((where, f"row {row!r} needs method {needed}, not {exp['method']}"))
            if table == "table6" and TABLE6_GENERATOR.get(row, generator) != generator:
                errors.append((where, f"row {row!r} needs generator: {TABLE6_GENERATOR[row]}"))
            other = seen.setdefault((table, exp["dataset"], row), name)
            if other != name:
                errors.append((where, f"{exp['dataset']} row {row!r} is already filled by {other}"))
    return errors


def check_overrides(config: Mapping, files: Sequence[PathLike]) -> None:
    """Refuse ``--config`` overrides (of Snakemake's ``config`` over its ``files``) of keys
    that the CLI steps read from the files."""
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


def make_experiment(name: str = "custom", **settings: Any) -> dict:
    """A validated experiment from ``training_defaults`` keys (the rest: schema defaults,
    the paper's MNIST setting), e.g. ``make_experiment(target_epsilon=5.0, sigma=None)``."""
    settings.setdefault("dataset", "mnist")
    return experiment(validate({"experiments": {name: settings}}, "make_experiment"), name)
