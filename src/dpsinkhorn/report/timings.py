"""Typical times that README.md and docs/ quote, rendered from committed results sets'
``provenance.json`` (``wall_seconds``) and ``step_rates.json`` into the blocks between
``<!-- timings: results-paper-scale/<set> [...] -->`` and ``<!-- end timings -->``
(``timings totals:``: the whole commands' rows only); tests/test_docs.py compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpsinkhorn import fileio

#: provenance keys of an experiment -> the step they time
STEP_KEYS = {
    "train_seconds": "train",
    "train_cpu_wall_seconds": "train",
    "evaluate_seconds": "evaluate",
    "evaluate_cpu_wall_seconds": "evaluate",
}


def duration(seconds: float) -> str:
    """``'45 s'`` under 100 s, else minutes with one decimal (``'31.0 min'``)."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def timing_rows(set_dir: Path, totals: bool = False) -> list[tuple[str, str]]:
    """(what ran, its time) of one set, in the order its files list them; ``totals``: only
    the whole commands (``wall_seconds``)."""
    provenance = fileio.read_json(set_dir / "provenance.json")
    rows = []
    for what, seconds in provenance.get("wall_seconds", {}).items():
        command, _, note = what.partition(" (")  # `make test` (866 passed)
        rows.append((f"`{command}`" + (f" ({note}" if note else ""), duration(seconds)))
    if totals:
        return rows
    for name, exp in provenance.get("experiments", {}).items():
        rows += [
            (f"{step} `{name}`", duration(exp[k])) for k, step in STEP_KEYS.items() if k in exp
        ]
    rates = set_dir / "step_rates.json"
    for r in fileio.read_json(rates)["rates"] if rates.is_file() else []:
        sweep = f", {r['runs']} runs in one sweep" if r["runs"] > 1 else ""
        what = f"training, {r['dataset']} B = {r['batch_size']}{sweep} ({r['options']})"
        rows.append((what, f"{r['steps_per_s']:.0f} steps/s"))
    return rows


def timings_table(set_dirs: Sequence[str | Path], totals: bool = False) -> str:
    """One markdown table of the sets' times, then one line per set: its device and date."""
    lines = ["| what | time | results set |", "|---|---|---|"]
    notes = []
    for set_dir in map(Path, set_dirs):
        provenance = fileio.read_json(set_dir / "provenance.json")
        lines += [
            f"| {what} | {time} | `{set_dir.name}` |" for what, time in timing_rows(set_dir, totals)
        ]
        date = f", {provenance['date']}" if provenance.get("date") else ""
        notes.append(f"- `{set_dir.name}`: {provenance['device']}{date}.")
    return "\n".join([*lines, "", *notes]) + "\n"
