"""Issue 15's GPU targets against what ``benchmarks/gpu/run.sh`` measured in one folder.

    python3 benchmarks/gpu/targets.py OUT        # OUT: the run.sh output folder

Reads ``bench.jsonl`` (``dpsinkhorn bench`` lines), ``loop_<precision>.csv`` (training
logs of the ``loop`` stage), ``row_seconds.txt`` and ``row_benchmarks/*.tsv`` (the
``row`` stage) where present, and prints a Markdown table: target, measurement, met.
Standard library only (it runs before anything is installed).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

STEPS_PER_S = 2000.0  # one run, the paper's MNIST step, a precision within tolerance
LOOP_SHARE = 0.9  # training loop within 10% of its bench rate
SWEEP_THROUGHPUT = 3.0  # a sweep of 8 at >= 3x one run's throughput
ROW_SECONDS = 600.0  # the whole MNIST Table 1 DP row
EVAL_JOB_SECONDS = 15.0  # each evaluation job
EVAL_RULES = ("sample", "fid", "classify")


def options(entry: dict) -> tuple[bool, bool, str]:
    """(cuda_graphs, compile_solver, precision) of a bench line's ``ours``."""
    ours = entry.get("ours", {})
    return bool(ours.get("cuda_graphs")), bool(ours.get("compile_solver")), ours.get("precision")


def within_tolerance(entry: dict) -> bool:
    """fp32, or a reduced precision whose measured ``precision_error`` is within tolerance."""
    if options(entry)[2] == "fp32":
        return True
    return bool(entry.get("precision_error", {}).get("within_tolerance"))


def read_bench(path: Path) -> list[dict]:
    """The JSON lines of a bench.jsonl (other lines, e.g. progress, skipped)."""
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [json.loads(line) for line in lines if line.startswith("{")]


def loop_rate(path: Path, skip: float = 0.1) -> float | None:
    """Steps/s of a training log between its first row past ``skip`` of the steps (compile and
    capture done) and its last row, from the ``step`` and ``elapsed_s`` columns."""
    with open(path, newline="") as fh:
        rows = [(int(r["step"]), float(r["elapsed_s"])) for r in csv.DictReader(fh)]
    if len(rows) < 2:
        return None
    first = next(r for r in rows if r[0] >= skip * rows[-1][0])
    last = rows[-1]
    if last[0] <= first[0]:
        return None
    return (last[0] - first[0]) / (last[1] - first[1])


def job_seconds(folder: Path) -> dict[str, float]:
    """{job file stem: seconds} from Snakemake benchmark files (first column ``s``)."""
    out = {}
    for tsv in sorted(folder.glob("*.tsv")):
        rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
        if rows:
            out[tsv.stem] = float(rows[-1]["s"])
    return out


def evaluate(folder: Path) -> list[tuple[str, str, str]]:
    """(target, measurement, met: yes | no | not measured) rows."""
    rows = []
    bench = read_bench(folder / "bench.jsonl")
    single = [b for b in bench if "ours_steps_per_s" in b and not b.get("sweep_runs")]
    ok = [b for b in single if within_tolerance(b)]
    if ok:
        best = max(ok, key=lambda b: b["ours_steps_per_s"])
        rate = best["ours_steps_per_s"]
        rows.append(
            (
                f">= {STEPS_PER_S:,.0f} steps/s, one run, precision within tolerance",
                f"{rate:.1f} steps/s (graphs {options(best)[0]}, compiled solver "
                f"{options(best)[1]}, {options(best)[2]})",
                "yes" if rate >= STEPS_PER_S else "no",
            )
        )
    else:
        rows.append((f">= {STEPS_PER_S:,.0f} steps/s", "-", "not measured"))

    loops = sorted(folder.glob("loop_*.csv"))
    for path in loops:
        precision = path.stem.removeprefix("loop_")
        rate = loop_rate(path)
        same = [b for b in single if options(b) == (True, True, precision)]
        if rate is None or not same:
            rows.append((f"training loop within 10% of bench ({precision})", "-", "not measured"))
            continue
        reference = same[-1]["ours_steps_per_s"]
        rows.append(
            (
                f"training loop within 10% of bench ({precision}, graphs + compiled solver)",
                f"loop {rate:.1f} vs bench {reference:.1f} steps/s ({rate / reference:.2f})",
                "yes" if rate >= LOOP_SHARE * reference else "no",
            )
        )
    if not loops:
        rows.append(("training loop within 10% of bench", "-", "not measured"))

    sweeps = [b for b in bench if b.get("sweep_runs") == 8 and "sweep_per_run_ratio" in b]
    for b in sweeps:
        throughput = 8 * b["sweep_per_run_ratio"]
        graphs, compiled, precision = options(b)
        rows.append(
            (
                f"sweep of 8 >= {SWEEP_THROUGHPUT:.0f}x one run's throughput "
                f"(graphs {graphs}, compiled {compiled}, {precision})",
                f"{throughput:.2f}x ({b['sweep_steps_per_s']:.1f} sweep steps/s vs "
                f"{b['ours_steps_per_s']:.1f})",
                "yes" if throughput >= SWEEP_THROUGHPUT else "no",
            )
        )
    if not sweeps:
        rows.append(("sweep of 8 >= 3x one run", "-", "not measured"))

    seconds_file = folder / "row_seconds.txt"
    if seconds_file.exists():
        calls = [int(m) for m in re.findall(r"^(\d+) s", seconds_file.read_text(), re.M)]
        total = sum(calls)
        rows.append(
            (
                f"MNIST Table 1 DP row < {ROW_SECONDS:.0f} s wall",
                f"{total} s over {len(calls)} call(s)",
                "yes" if total < ROW_SECONDS else "no",
            )
        )
    else:
        rows.append(("MNIST Table 1 DP row < 600 s", "-", "not measured"))

    jobs = job_seconds(folder / "row_benchmarks")
    for rule in EVAL_RULES:
        times = {k: v for k, v in jobs.items() if k.split("_")[0] == rule}
        if not times:
            rows.append((f"each {rule} job < {EVAL_JOB_SECONDS:.0f} s", "-", "not measured"))
            continue
        worst = max(times, key=times.get)
        rows.append(
            (
                f"each {rule} job < {EVAL_JOB_SECONDS:.0f} s",
                f"max {times[worst]:.1f} s ({worst}; {len(times)} jobs, wall time of the job)",
                "yes" if times[worst] < EVAL_JOB_SECONDS else "no",
            )
        )
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: targets.py OUT_FOLDER (benchmarks/gpu/run.sh's output)", file=sys.stderr)
        return 2
    print("| target | measured | met |\n| --- | --- | --- |")
    for target, measured, met in evaluate(Path(argv[0])):
        print(f"| {target} | {measured} | {met} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
