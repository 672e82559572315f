"""Time ``dpsinkhorn evaluate`` with and without ``--fast`` on one generator, each in its own
process, alternating ``--reps`` times; prints one JSON line per run (its phase seconds from
``--timings``, its FIDs and accuracies) and, at the end, the means and each path's results.

    python benchmarks/evaluate_fast.py --mirror ../shared/data \\
        --weights ../shared/weights/pt_inception-2015-12-05-6726825d.pth \\
        --generator ../shared/measurements/h100-83ae335/block_sigma1.5/generator.pt \\
        --num 1000 --max-epochs 30 --patience 5 --max-iter 5000 --device cpu   # quick.yaml

config/smoke.yaml's sizes: ``--num 50 --max-epochs 3 --patience 2 --max-iter 200``.
The reference statistics (``--fid-reference-size`` real test images, the reference path)
are computed once, outside the timed runs, as the workflow caches them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(argv: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "dpsinkhorn", *argv], check=True, capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirror", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--generator", required=True)
    p.add_argument("--num", type=int, default=50)
    p.add_argument("--seeds", nargs="+", default=["0"])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--fid-reference-size", type=int, default=50)
    p.add_argument("--sqrtm", default="eigh")
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--max-iter", type=int, default=200)
    args = p.parse_args()

    root = Path(tempfile.mkdtemp(prefix="evaluate-fast-"))
    run(["data", "--dataset", "mnist", "--root", str(root / "data"), "--mirror", args.mirror])
    test = root / "data" / "mnist" / "test.npz"
    ref = root / "fid_ref.npz"
    run(
        [
            "fid-stats",
            "--samples",
            str(test),
            "--out",
            str(ref),
            "--num",
            str(args.fid_reference_size),
            "--seed",
            "0",
            "--weights",
            args.weights,
            "--device",
            args.device,
        ]
    )
    common = [
        "--generator",
        args.generator,
        "--test",
        str(test),
        "--reference",
        str(ref),
        "--seed",
        *args.seeds,
        "--num",
        str(args.num),
        "--sqrtm",
        args.sqrtm,
        "--weights",
        args.weights,
        "--max-epochs",
        str(args.max_epochs),
        "--patience",
        str(args.patience),
        "--max-iter",
        str(args.max_iter),
        "--dataset",
        "mnist",
        "--device",
        args.device,
    ]
    runs: dict[str, list[dict]] = {"reference": [], "fast": []}
    for rep in range(args.reps):
        for path in runs:
            out = root / f"{path}{rep}"
            out.mkdir()
            begin = time.perf_counter()
            extra = ["--fast"] if path == "fast" else []
            run(
                [
                    "evaluate",
                    *common,
                    "--samples-dir",
                    str(out),
                    "--scores-dir",
                    str(out),
                    "--timings",
                    str(out / "timings.json"),
                    *extra,
                ]
            )
            wall = time.perf_counter() - begin
            phases = json.loads((out / "timings.json").read_text())["seconds"]
            scores = {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*_seed*.json"))}
            results = {k: v.get("fid", v.get("accuracy")) for k, v in scores.items()}
            row = {"path": path, "rep": rep, "process_s": wall, "phases": phases, **results}
            runs[path].append(row)
            print(json.dumps(row), flush=True)
    means = {
        path: {k: sum(r["phases"][k] for r in rows) / len(rows) for k in rows[0]["phases"]}
        for path, rows in runs.items()
    }
    print(json.dumps({"num": args.num, "seeds": args.seeds, "mean_phase_s": means}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
