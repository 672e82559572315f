"""Captions: :func:`caption`, a plain-text paragraph on what was run for an output (for
``snakemake --report``); never fails on missing result files."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config import PRIVATE_METHODS, experiment, experiment_dir
from dpsinkhorn.config.studies import STUDIES, study_cells
from dpsinkhorn.config.targets import CELEBA_TABLES, NAMES, SAMPLE_FIGURES, TITLES, cell_experiments
from dpsinkhorn.config.workflow import gradient_settings
from dpsinkhorn.report.common import (
    ConfigLike,
    PathLike,
    config_files_text,
    format_g,
    load_config_like,
    no_guarantee,
)
from dpsinkhorn.report.reproduction import not_paper_scale_reasons, produced_tables
from dpsinkhorn.report.studies import require_study
from dpsinkhorn.report.tables import fixture_data


def _read_privacy(path: Path) -> dict:
    try:
        data = fileio.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _experiment_text(config: Mapping, out_dir: Path, name: str) -> str:
    """'name (dataset, steps, σ, ε)': measured where privacy.json exists, else configured."""
    spec = experiment(config, name)
    dataset = spec["dataset"]
    if spec["method"] == "real_data":
        return f"{name} ({dataset}, real training data)"
    if spec["method"] not in PRIVATE_METHODS:
        return f"{name} ({dataset}, non-private Sinkhorn, {spec['steps']} steps)"
    privacy = _read_privacy(experiment_dir(config, out_dir, name) / "privacy.json")
    eps, eps_paper = privacy.get("epsilon"), privacy.get("epsilon_paper_convention")
    if isinstance(eps, int | float) and privacy.get("steps") is not None:
        sigma = privacy.get("sigma", spec["sigma"])
        text = f"{privacy['steps']} steps, σ {format_g(sigma, 'solved')}, ε {eps:.2f} sound"
        if spec["method"] == "dpmerf":  # one release, then the generator's steps
            steps = privacy.get("generator_steps", spec["steps"])
            text = f"DP-MERF, one release, noise multiplier {format_g(sigma, 'solved')}, "
            text += f"{steps} generator steps, ε {eps:.2f} sound"
        if isinstance(eps_paper, int | float):
            text += f" and {eps_paper:.2f} under the paper's convention"
    else:
        steps = "steps solved" if spec["steps"] is None else f"{spec['steps']} steps"
        sigma = "σ solved" if spec["sigma"] is None else f"σ {spec['sigma']:g}"
        if spec["target_epsilon"] is not None:
            convention = spec["epsilon_convention"]
            eps_text = f"target ε {spec['target_epsilon']:g} ({convention} convention)"
        else:
            eps_text = "ε computed after training"
        text = f"{steps}, {sigma}, {eps_text}"
    return f"{name} ({dataset}, {text}, δ {spec['delta']:g})"


def _rst_safe(text: str) -> str:
    """One line of plain text that reStructuredText shows as it is."""
    text = re.sub(r"[`*|\\]", "", text)
    text = re.sub(r"_+(?=[\s.,;:)]|$)", "", text)  # no trailing-underscore references
    return " ".join(text.split())


def caption(
    config: ConfigLike, out_dir: PathLike, name: str, config_files: Sequence[PathLike] = ()
) -> str:
    """One plain-text paragraph saying what was run for output ``name``. ``config``: config
    file(s), or a validated config (then ``config_files`` may name its files)."""
    if name not in NAMES:
        raise ValueError(f"no caption for {name!r} (one of {', '.join(NAMES)})")
    config, files = load_config_like(config)
    files = files or [str(f) for f in config_files]
    out_dir = Path(out_dir)
    if name in STUDIES:
        require_study(config, name, files)
    # The output's experiments; reproduction.md's: those of the tables it compares.
    tables = produced_tables(config) if name == "reproduction" else [name]
    exps = [e for e in dict.fromkeys(e for t in tables for e in cell_experiments(config, t)) if e]
    if not exps:
        raise ValueError(f"the config produces no {name!r}: it has no experiment for it")
    run = config.get("run_name", "?")
    parts = [f"{TITLES[name]}. Run {run} from {config_files_text(files, config)}."]
    if name in STUDIES:
        cells = study_cells(config, name)
        definition = (config.get("studies") or {}).get(name) or {}
        varied = list(definition.get("vary") or {}) or [k for c in cells for k in c.changes]
        varied_text = ", ".join(dict.fromkeys(varied)) or "nothing"
        parts.append(
            f"{len(cells)} cells from {', '.join(dict.fromkeys(c.base for c in cells))}, "
            f"varying {varied_text}."
        )
    parts.append(
        f"Experiment{'s' if len(exps) > 1 else ''}: "
        + "; ".join(_experiment_text(config, out_dir, e) for e in exps)
        + "."
    )
    if name == "fig4c":
        study = gradient_settings(config)
        parts.append(
            f"Gradient estimator G_p of each trained generator drawn over "
            f"{study['batches']} batches for p in "
            f"{', '.join(f'{p:g}' for p in study['p_values'])}, without clipping or noise "
            "(a non-private analysis of the training data, not a DP release)."
        )
    elif name in SAMPLE_FIGURES:
        layout = f"{SAMPLE_FIGURES[name]} per class, one row per class"
        if all(experiment(config, e).get("conditional", True) is False for e in exps):
            layout = "one row of an unconditional generator's samples"
        parts.append(f"Samples of seed {config['seeds'][0]}, {layout}.")
    else:
        seeds, s = config["seeds"], "s" if len(config["seeds"]) > 1 else ""
        parts.append(
            f"Mean and std over seed{s} {', '.join(map(str, seeds))} ({len(seeds)} seed{s}: "
            f"each seed one synthetic set of {config['evaluation']['num_samples']} samples and "
            "one training of each classifier)."
        )
    if name in CELEBA_TABLES and fixture_data(config):
        parts.append("Data: the synthetic CelebA fixture, not CelebA.")
    if name == "reproduction":
        reasons = not_paper_scale_reasons(config, files)
        if reasons:
            parts.append(f"Not at paper scale: {'; '.join(reasons)}.")
    ledgers = {e: _read_privacy(experiment_dir(config, out_dir, e) / "privacy.json") for e in exps}
    public = [e for e, privacy in ledgers.items() if no_guarantee(privacy)]
    if public:
        parts.append(
            f"No privacy guarantee for {', '.join(public)}: the noise seed was public "
            "(reproducible: true)."
        )
    return _rst_safe(" ".join(parts))
