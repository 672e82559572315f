"""Typical times that README.md and docs/ quote (``report.docblocks``' ``timings`` blocks),
from committed results sets' ``provenance.json`` and ``step_rates.json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpsinkhorn import fileio

#: provenance keys of an experiment's times, each named ``<step>_...``
STEP_KEYS = (
    "train_seconds train_cpu_wall_seconds evaluate_seconds evaluate_cpu_wall_seconds".split()
)


def duration(seconds: float) -> str:
    """``'45 s'`` under 100 s, else minutes with one decimal (``'31.0 min'``)."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def timing_rows(set_dir: Path, totals: bool = False) -> list[tuple[str, str]]:
    """(what ran, its time) of one set in file order; ``totals``: whole commands only."""
    provenance = fileio.read_json(set_dir / "provenance.json")
    rows = []
    for what, seconds in provenance.get("wall_seconds", {}).items():
        command, _, note = what.partition(" (")  # `make test` (866 passed)
        rows.append((f"`{command}`" + (f" ({note}" if note else ""), duration(seconds)))
    if totals:
        return rows
    for name, exp in provenance.get("experiments", {}).items():
        rows += [(f"{k.split('_')[0]} `{name}`", duration(exp[k])) for k in STEP_KEYS if k in exp]
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
