"""Studies: the paper's ablations and grids (Tables 2, 4, 5; Figures 4a, 4b, 4c, 5) as
experiments. A ``studies:`` entry names ``bases``, common ``settings`` and either ``vary``
(one cell per combination) or named ``cells``; :func:`plan_cells` makes each cell an
experiment ``<study>_<cell>`` (reusing an experiment of equal settings)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpsinkhorn.config.identity import deep_merge, experiment_spec_of

#: The studies a config may define: what the paper shows, and the kind of output.
STUDIES = {
    "table2": "Table 2: ablation of perturbation, cost and debiasing (MNIST)",
    "table4": "Table 4: hyper-parameter search on MNIST (appendix)",
    "table5": "Table 5: hyper-parameter search on Fashion-MNIST (appendix)",
    "fig4a": "Figure 4a: robustness to learning rate and optimiser (MNIST)",
    "fig4b": "Figure 4b: privacy-utility trade-off (MNIST)",
    "fig4c": "Figure 4c: bias and variance of the gradient estimator against p (MNIST)",
    "fig5": "Figure 5: effect of p on FID and error rate (appendix)",
    "eps10": "Sound ε = 10 study (MNIST): batch size, learning rate, clipping mode and p "
    "at a fixed sound ε = 10",
}
TABLE_STUDIES = ("table2", "table4", "table5")
FIGURE_STUDIES = ("fig4a", "fig4b", "fig4c", "fig5", "eps10")

#: Short names for varied keys in generated experiment names (others keep their key).
SHORT_KEYS = {"target_epsilon": "eps", "sigma": "s", "clip": "c", "optimizer": ""}
#: Keys of a base experiment that place it in a table; cells never inherit them.
PLACEMENT_KEYS = ("table1_row", "rows")


@dataclass(frozen=True)
class Cell:
    """One cell of a study: its label, the experiment that fills it, and what it varies."""

    study: str
    label: str
    experiment: str
    base: str
    changes: dict


def _value_label(value: Any) -> str:
    """1e-3 -> '0p001', 0.2 -> '0p2', 'adam' -> 'adam' (names stay path- and regex-safe)."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        value = f"{value:g}"
    return str(value).replace(".", "p").replace("+", "")


def _vary_cells(vary: Mapping[str, list]) -> list[tuple[str, dict]]:
    """(label, changes) of each combination of the varied values, the first key slowest."""
    cells = []
    for values in itertools.product(*vary.values()):
        changes = dict(zip(vary, values, strict=True))
        label = "_".join(f"{SHORT_KEYS.get(k, k)}{_value_label(v)}" for k, v in changes.items())
        cells.append((label, changes))
    return cells


def _spec_key(definition: Mapping, defaults: Mapping) -> str:
    """What makes two experiment definitions train the same generator (see config)."""
    return experiment_spec_of(deep_merge(defaults, definition))


def plan_cells(config: Mapping) -> tuple[dict[str, list[Cell]], dict[str, dict]]:
    """(cells per study, new experiment definitions); idempotent: a config that holds the
    generated experiments gets nothing new."""
    experiments = dict(config.get("experiments") or {})
    defaults = config.get("training_defaults") or {}
    known = {_spec_key(d, defaults): name for name, d in experiments.items()}
    new: dict[str, dict] = {}
    cells: dict[str, list[Cell]] = {}
    for study, definition in (config.get("studies") or {}).items():
        bases = definition["bases"]
        cells_of = definition.get("cells")
        pattern = list(cells_of.items()) if cells_of else _vary_cells(definition["vary"])
        cells[study] = []
        for base in bases:
            if base not in experiments:
                raise ValueError(
                    f"studies.{study}.bases: unknown experiment {base!r} "
                    f"(known: {', '.join(experiments) or 'none'})"
                )
            for label, changes in pattern:
                full_label = label if len(bases) == 1 else f"{base}_{label}"
                if "experiment" in changes:
                    name = changes["experiment"]
                    if name not in experiments:
                        raise ValueError(
                            f"studies.{study}.cells.{label}.experiment: unknown experiment {name!r}"
                        )
                    cells[study].append(Cell(study, full_label, name, base, {}))
                    continue
                kept = {k: v for k, v in experiments[base].items() if k not in PLACEMENT_KEYS}
                settings = definition.get("settings") or {}
                cell_def = copy.deepcopy({**kept, **settings, **changes})
                key = _spec_key(cell_def, defaults)
                name = known.get(key)
                if name is None:
                    name = f"{study}_{full_label}"
                    if name in experiments:
                        raise ValueError(
                            f"studies.{study}: generated experiment name {name!r} is already "
                            "used by a different experiment; rename that experiment"
                        )
                    known[key] = name
                    experiments[name] = new[name] = cell_def
                cells[study].append(Cell(study, full_label, name, base, dict(changes)))
    return cells, new


def study_cells(config: Mapping, study: str) -> list[Cell]:
    """The cells of one study, in table/figure order."""
    cells, _ = plan_cells(config)
    if study not in cells:
        raise ValueError(
            f"the config has no study {study!r} (it has: {', '.join(cells) or 'none'})"
        )
    return cells[study]


def configured_studies(config: Mapping) -> list[str]:
    """Studies of the config, in the paper's order."""
    present = config.get("studies") or {}
    return [s for s in STUDIES if s in present]


def study_experiments(config: Mapping, study: str) -> list[str]:
    """Distinct experiments of a study, in cell order."""
    return list(dict.fromkeys(c.experiment for c in study_cells(config, study)))
