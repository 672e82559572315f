"""Checks across keys that the JSON schema cannot express (:func:`semantic_errors`, run by
``validate`` after the schema); each error is (key path, message)."""

from __future__ import annotations

from dpsinkhorn.config.cluster import cluster_errors
from dpsinkhorn.config.experiments import (
    BUILTIN_DATASETS,
    FIXTURE_SOURCE,
    RUN_FOLDERS,
    TABLE1_ROWS,
    TABLE6_GENERATOR,
    TABLE_ROWS,
    experiment,
    experiment_names,
    generator_widths,
)

#: Why a sweep (``sweep_runs`` > 1) cannot train in bf16.
SWEEP_BF16_ERROR = (
    "precision bf16 cannot train sweeps: torch.func.vmap, which runs a sweep's generators, "
    "does not apply autocast on every device (pytorch/pytorch#105442); use sweep_runs: 1 "
    "or precision fp32 / tf32"
)

#: Why an experiment may not be named like a folder of the run (``RUN_FOLDERS``).
RESERVED_EXPERIMENT_ERROR = (
    "bad name {!r}: results/<run>/ already has a folder of that name ({}; in any case), where "
    "a DP release's folder would be; rename the experiment"
)

#: Names an own dataset (``datasets:``) may not take: built-ins and folders of data_dir.
RESERVED_DATASET_NAMES = (*BUILTIN_DATASETS, "torchvision", FIXTURE_SOURCE)


def semantic_errors(config: dict) -> list[tuple[list, str]]:
    """Checks across keys that the schema cannot express."""
    errors: list[tuple[list, str]] = []
    if config["precision"] == "bf16" and config["sweep_runs"] > 1:
        errors.append((["precision"], SWEEP_BF16_ERROR))
    errors += cluster_errors(config)
    errors += own_dataset_errors(config)
    rows: dict[tuple[str, str], str] = {}
    table_rows: dict[tuple[str, str, str], str] = {}
    for name in experiment_names(config):
        exp = experiment(config, name)
        at = ["experiments", name]
        method = exp["method"]
        if name.lower() in RUN_FOLDERS:  # lower: one folder on a case-insensitive disk
            errors.append((at, RESERVED_EXPERIMENT_ERROR.format(name, ", ".join(RUN_FOLDERS))))
        errors += _celeba_errors(config, exp, at, table_rows)
        known = [*BUILTIN_DATASETS, *(config.get("datasets") or {})]
        if exp["dataset"] not in known:
            errors.append(
                (
                    at + ["dataset"],
                    f"bad value {exp['dataset']!r}: must be one of {', '.join(known)}",
                )
            )
        if method != "real_data":
            if exp["sigma"] is None and exp["steps"] is None:
                errors.append((at + ["sigma"], "sigma and steps are both null; give at least one"))
            elif method in ("sinkhorn", "dpmerf") and exp["steps"] is None:
                errors.append((at + ["steps"], f"method {method} needs steps (generator steps)"))
            elif method == "dpmerf" and exp["sigma"] is None and exp["target_epsilon"] is None:
                errors.append(
                    (at + ["target_epsilon"], "sigma is null, so target_epsilon is needed")
                )
            if method == "dpmerf" and exp["epsilon_convention"] != "sound":
                errors.append(
                    (
                        at + ["epsilon_convention"],
                        "method dpmerf has one release and no paper convention: must be sound",
                    )
                )
            if method == "dpmerf" and exp["rff_features"] % 2:
                errors.append(
                    (at + ["rff_features"], f"bad value {exp['rff_features']}: must be even")
                )
            if exp.get("generator") == "merf" and method != "dpmerf":
                errors.append((at + ["generator"], "generator merf is DP-MERF's: method dpmerf"))
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
        row = exp["table1_row"]
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
        if row == "sound_official" and not (
            exp["target_epsilon"] == 10
            and exp["sigma"] is not None
            and exp["clipping"] == "batch"
            and exp["epsilon_convention"] == "sound"
        ):
            errors.append(
                (
                    at + ["table1_row"],
                    "row 'sound_official' needs the official code's sigma, clipping: batch and "
                    "target_epsilon: 10 (sound), so that the budget sets the steps",
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


def own_dataset_errors(config: dict) -> list[tuple[list, str]]:
    """Names and class lists of the ``datasets:`` entries (the schema checks the rest)."""
    errors: list[tuple[list, str]] = []
    for name, entry in (config.get("datasets") or {}).items():
        at = ["datasets", name]
        if name in RESERVED_DATASET_NAMES:
            errors.append(
                (at, f"bad name {name!r}: taken by a built-in dataset or a data_dir folder")
            )
        if entry.get("classes"):  # the rule of sample files: refused before a training
            from dpsinkhorn.fileio import check_class_names

            try:
                check_class_names(entry["classes"], "bad value")
            except ValueError as err:
                errors.append((at + ["classes"], str(err)))
        if str(entry["path"]).lower().endswith(".npz") and entry["classes"] is None:
            errors.append(
                (
                    at + ["classes"],
                    "an .npz dataset needs its class list (public, in label order): classes are "
                    "never counted from the private labels",
                )
            )
    return errors


def _celeba_errors(config: dict, exp: dict, at: list, seen: dict) -> list[tuple[list, str]]:
    """Generator widths, and the Table 3 / Table 6 rows of one experiment."""
    errors = []
    generator = exp.get("generator") or "dcgan"
    # A dataset declared in the config (``datasets:``) names its image size; the paper's
    # datasets are 28x28 or 32x32.
    declared = ((config.get("datasets") or {}).get(exp["dataset"]) or {}).get("image_size")
    widths = generator_widths(generator, declared)
    if exp["method"] != "real_data" and len(exp["channels"]) not in widths:
        size = f" at {declared}x{declared}" if declared else ""
        count = " or ".join(map(str, widths))
        errors.append(
            (
                at + ["channels"],
                f"generator {generator} needs {count} widths{size}, got {exp['channels']}",
            )
        )
    if generator == "biggan" and exp["dataset"] != "celeba":
        errors.append((at + ["generator"], "biggan makes 32x32 RGB images: dataset celeba only"))
    for table, row in exp["rows"].items():
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
