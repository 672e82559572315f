"""Time `dpsinkhorn classify` for K seeds: one process for all seeds vs one process per seed.

    python benchmarks/classify_seeds.py --mirror ../shared/data --model cnn --seeds 5 \
        --num-train 2000 --num-test 2000 --max-epochs 5 --patience 2 --device cpu

Training sets: K disjoint slices of the real MNIST training archive (the mirror's
MNIST/raw/*.gz), test set: the first --num-test test images. Prints one JSON line with
both wall times (each including process start, imports and data loading) and checks that
both ways give the same accuracies.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio


def read_idx(raw: Path, prefix: str, start: int, num: int) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [num,28,28] and labels int64 [num] from an MNIST idx pair."""
    with gzip.open(raw / f"{prefix}-images-idx3-ubyte.gz") as fh:
        images = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(raw / f"{prefix}-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
    return images[start : start + num], labels[start : start + num]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirror", required=True, type=Path)
    p.add_argument("--model", default="cnn")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--num-train", type=int, default=2000)
    p.add_argument("--num-test", type=int, default=2000)
    p.add_argument("--max-epochs", type=int, default=5)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batched", action="store_true", help="the one process trains seeds vmapped")
    args = p.parse_args()
    raw = args.mirror / "MNIST" / "raw"
    exe = [sys.executable, "-m", "dpsinkhorn", "classify", "--model", args.model]
    common = ["--max-epochs", str(args.max_epochs), "--patience", str(args.patience)]
    common += ["--device", args.device, "--dataset", "mnist"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fileio.save_samples(tmp / "test.npz", *read_idx(raw, "t10k", 0, args.num_test))
        trains = []
        for k in range(args.seeds):
            trains.append(tmp / f"samples_seed{k}.npz")
            fileio.save_samples(
                trains[-1], *read_idx(raw, "train", k * args.num_train, args.num_train)
            )
        seeds = [str(k) for k in range(args.seeds)]
        start = time.perf_counter()
        for k in range(args.seeds):
            out = tmp / f"alone_{k}.json"
            cmd = [*exe, "--train", str(trains[k]), "--test", str(tmp / "test.npz")]
            subprocess.run([*cmd, "--seed", seeds[k], "--out", str(out), *common], check=True)
        alone = time.perf_counter() - start
        outs = [str(tmp / f"together_{k}.json") for k in range(args.seeds)]
        start = time.perf_counter()
        cmd = [*exe, "--train", *map(str, trains), "--test", str(tmp / "test.npz")]
        batched = ["--batched"] if args.batched else []
        subprocess.run([*cmd, "--seed", *seeds, "--out", *outs, *common, *batched], check=True)
        together = time.perf_counter() - start
        acc_alone = [
            fileio.read_json(tmp / f"alone_{k}.json")["accuracy"] for k in range(args.seeds)
        ]
        acc_together = [fileio.read_json(o)["accuracy"] for o in outs]
    print(
        json.dumps(
            {
                **vars(args),
                "mirror": str(args.mirror),
                "one_process_per_seed_s": alone,
                "one_process_all_seeds_s": together,
                "speedup": alone / together,
                "accuracies": acc_together,
                "same_accuracies": acc_alone == acc_together,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
