"""The results set of ``dpsinkhorn gpu-window``: the finished cells of a window's working
folder, written after every call (:func:`write_set`).

An experiment enters the set only when its evaluation finished: every FID and classifier
file of every seed exists (one evaluation job writes them all, and Snakemake deletes the
outputs of a job it stopped). A stopped evaluation's finished phases
(``evaluate_progress.json``) stay in the archive and are never shown as cells. Each
experiment's provenance names the call (device, commit) whose evaluation finished it and
(``phases``) the commit and code that computed each phase, a resumed one's included.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from dpsinkhorn import fileio
from dpsinkhorn.config.experiments import (
    BENCHMARKS_DIR,
    evaluation_dir,
    experiment_dir,
    experiment_home,
)
from dpsinkhorn.config.targets import EVALUATION_PHASES, evaluation_files
from dpsinkhorn.config.validate import load_config
from dpsinkhorn.report.resultset import render

#: Files of an experiment folder that a results set holds (never generator.pt or samples).
SET_FILES = ("privacy.json", "train_log.csv", "fid_seed*.json", "acc_*_seed*.json")


def finished(config: Mapping, results: Path, exp: str) -> bool:
    """Whether every evaluation file (FID, each classifier, every seed) of ``exp`` exists."""
    return all(Path(f).is_file() for f in evaluation_files(config, results, [exp]))


def write_set(window: Mapping, workdir: Path, set_dir: Path, state: dict) -> list[Path]:
    """Copy the finished cells into ``set_dir`` with ``provenance.json``; render its
    Table 1 (:func:`dpsinkhorn.report.resultset.render`) when it holds a Table 1 row.
    ``state`` (the window's) gives the calls, items, imports and commands; each newly
    finished experiment is stamped with the last call (``state["finished"]``)."""
    config = load_config([window["config_path"]])
    results = workdir / f"results/{config['run_name']}"
    calls = state.get("calls", [])
    stamps = state.setdefault("finished", {})
    experiments = {}
    for item in window["work"]:
        for exp in item["experiments"]:
            if not finished(config, results, exp):
                continue  # no cell of a stopped or unstarted evaluation
            if exp not in stamps and calls:
                stamps[exp] = {k: calls[-1][k] for k in ("call", "device", "commit")}
            src, scores = experiment_dir(config, results, exp), evaluation_dir(config, results, exp)
            files = sorted({p for d in (src, scores) for pat in SET_FILES for p in d.glob(pat)})
            for path in files:
                fileio.write_bytes(set_dir / exp / path.name, path.read_bytes())
            entry = {"work_item": item["name"], "command": state.get("commands", {}).get(exp, "")}
            if exp in stamps:
                entry["evaluated_in"] = stamps[exp]
            phases = scores / EVALUATION_PHASES  # each phase's commit and code, resumed too
            if phases.is_file():
                entry["phases"] = fileio.read_json(phases)
            gen = src / "generator.pt"
            if exp in state.get("imports", {}):
                entry["generator"] = state["imports"][exp]
                entry["imported"] = (
                    "generator, ledger and training log copied from a committed run; "
                    "only the evaluation was run in this window"
                )
            elif gen.is_file():
                entry["generator"] = {"bytes": gen.stat().st_size, "sha256": fileio.sha256_of(gen)}
            bench = results / BENCHMARKS_DIR / f"{experiment_home(config, exp)}evaluate_{exp}.tsv"
            if bench.is_file():  # Snakemake's benchmark of the evaluation job (one line)
                head, first = bench.read_text().splitlines()[:2]
                row = dict(zip(head.split("\t"), first.split("\t"), strict=True))
                entry["evaluate_seconds"] = float(row["s"])
            experiments[exp] = entry
    provenance = {
        "name": set_dir.name,
        "what": "outputs of `dpsinkhorn gpu-window` calls (evaluation results, training "
        "ledgers and logs, no generators); only experiments whose evaluation finished",
        "device": calls[-1]["device"] if calls else "unknown",
        "commit": calls[-1]["commit"] if calls else "unknown",
        "date": calls[-1]["finished"][:10] if calls else "unknown",
        "config": window["configfile"],
        "config_changes": [f"snakemake --config {o}" for o in window["overrides"]],
        "window": str(window["path"]),
        "calls": calls,
        "items": state.get("items", {}),
        "experiments": experiments,
    }
    fileio.write_json(set_dir / "provenance.json", provenance)
    written = [set_dir / "provenance.json"]
    try:
        written += render(set_dir, [window["config_path"]])
    except ValueError as err:  # no Table 1 row yet: the set still holds its files
        state.setdefault("notes", []).append(f"results set not rendered: {err}")
        print(f"warning: results set {set_dir} not rendered: {err}", file=sys.stderr)
    return written
