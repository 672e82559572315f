"""What a call of ``dpsinkhorn gpu-window`` starts: only work that can finish.

A training starts when it fits what is left of the allocation at the measured rate of its
step's shape (:func:`training_refusal`; :mod:`dpsinkhorn.plan` knows which trainings are
allocation-sized); an evaluation when the call can reach its next saved phase, from the
phase seconds earlier calls measured (:func:`evaluation_refusal`, :func:`measure_phases`).
Also what a call records of itself: its device and commit.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config.experiments import (
    LOGS_DIR,
    evaluation_dir,
    experiment_classifiers,
    experiment_dir,
    needs_training,
)
from dpsinkhorn.config.targets import results_dir
from dpsinkhorn.evaluate.phases import resumable

#: A phase's wall seconds as the evaluation job prints it (``[12:00:00] fid: 135.6 s``).
PHASE_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (sample|fid|classify_\w+): ([\d.]+) s$", re.M)


def training_refusal(
    config: Mapping, item: Mapping, exp: str, workdir: Path, left_s: float, limits: Mapping
) -> str | None:
    """Why ``exp``'s training is not started here (None: start it). A training starts when
    it fits what is left of the allocation (``left_s``) at the measured rate of its step's
    shape (``limits["rates"]``), or was started before (its private workspace is here), or
    is asked for (the item's ``long``, ``limits["start_long"]``)."""
    from dpsinkhorn.plan import ALLOCATION_WORK_MINUTES, training_minutes

    folder = experiment_dir(config, workdir / results_dir(config), exp)
    if item["long"] or limits["start_long"] or (folder / "private_workspace").is_dir():
        return None
    minutes = training_minutes(config, limits["rates"], exp)
    if minutes is None:
        return f"{exp}: no measured step rate, needs a cluster or long: true"
    if minutes > ALLOCATION_WORK_MINUTES:
        return f"{exp}: {minutes:.1f} min of training, needs a cluster or longer GPU time"
    if minutes * 60 > left_s:
        return f"{exp}: {minutes:.1f} min of training, {left_s / 60:.1f} min left"
    return None


def evaluation_refusal(config: Mapping, exp: str, workdir: Path, left_s: float, state: Mapping):
    """Why ``exp``'s evaluation is not started in this call (None: start it): the seconds
    earlier calls measured for sampling and its next unsaved phase exceed ``left_s``. A
    phase never measured is started (it cannot be known not to finish)."""
    measured = state.get("phase_seconds", {})
    progress = evaluation_dir(config, workdir / results_dir(config), exp)
    progress = progress / "evaluate_progress.json"
    # the phases the job will resume: saved by this code (evaluate.phases, the job's rule)
    done = resumable(fileio.read_json(progress).get("done", {})) if progress.is_file() else {}
    phases = ["fid", *(f"classify_{m}" for m in experiment_classifiers(config, exp))]
    left = [ph for ph in phases if ph.removeprefix("classify_") not in done]
    if not left or left[0] not in measured or "sample" not in measured:
        return None
    need = measured["sample"] + measured[left[0]]
    if need <= left_s:
        return None
    return f"{exp}: its next saved phase ({left[0]}) takes {need:.0f} s, {left_s:.0f} s left"


def measure_phases(config: Mapping, workdir: Path, state: dict) -> None:
    """Record the longest seconds of each evaluation phase the jobs' logs show."""
    measured = state.setdefault("phase_seconds", {})
    for log in (workdir / results_dir(config) / LOGS_DIR).rglob("evaluate_*.log"):
        for phase, seconds in PHASE_LINE.findall(log.read_text(errors="replace")):
            measured[phase] = max(measured.get(phase, 0.0), float(seconds))


def done_training(config: Mapping, workdir: Path, exp: str) -> bool:
    root = workdir / results_dir(config)
    return not needs_training(config, exp) or (
        (experiment_dir(config, root, exp) / "privacy.json").is_file()
        and (experiment_dir(config, root, exp) / "generator.pt").is_file()
    )


def step_rates(path: str | None, config_path: Path, repo: Path) -> list[dict]:
    """The measured step rates (``path``, else the workflow config's ``cluster.step_rates``
    found in the working directory or the repository); none when the config's is absent."""
    from dpsinkhorn.config.cluster import load_rates, rates_file
    from dpsinkhorn.config.validate import load_config

    if path is not None:
        return load_rates(path)
    found = rates_file(load_config([config_path]), [repo])
    return load_rates(found) if found.is_file() else []


# --------------------------------------------------------------- the call's device


def device_name() -> str:
    """The GPU's name (torch), else ``cpu (<processor>)``."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
        return f"cpu (torch {torch.__version__}, {os.cpu_count()} cores)"
    except ImportError:
        return f"cpu ({os.cpu_count()} cores)"


def device_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; a CPU -> ``cpu``."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name.split("(")[0])
    return found.group(1).lower() if found else "cpu"


def commit_of(repo: Path) -> str:
    """``git rev-parse --short HEAD`` of ``repo``, ``unknown`` outside a repository."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"
