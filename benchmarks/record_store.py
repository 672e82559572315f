"""Size of the record store and time of the overlap with every earlier training.

For N records (60,000: MNIST's training split, 28x28 grey; 162,770: CelebA's, 64x64 RGB),
random uint8 images of that shape (a fingerprint's cost and size depend on the shape, not
the pixels): the time to fingerprint them (HMAC-SHA256 per image), the bytes of one stored
training, and the time of ``privacy.record_store.individual`` (read every stored training,
find which of the N records each held, compose the worst-off record's trainings) against a
store of ``--trainings`` trainings, each holding a random 3/4 of the records (every record
in its own set of trainings: the most sets to compose), or with ``--ranges`` a random
contiguous range of them (splits and subsets of one dataset, as curators train).

    PYTHONPATH=src python benchmarks/record_store.py [--trainings 10] [--ranges]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import dpsinkhorn.privacy.accounting  # noqa: F401  (imported before timing: ~1 s of scipy)
from dpsinkhorn.privacy.record_store import RecordStore, fingerprints, individual

SHAPES = {60_000: (28, 28), 162_770: (64, 64, 3)}


def measure(n: int, shape: tuple[int, ...], trainings: int, ranges: bool, root: str) -> dict:
    store = RecordStore(root)
    key, rng = store.key(), np.random.default_rng(0)
    parts, hashed = [], 0.0
    for i in range(0, n, 10_000):  # in chunks: CelebA's images are 2 GB
        images = rng.integers(0, 256, (min(10_000, n - i), *shape), dtype=np.uint8)
        start = time.perf_counter()
        parts.append(fingerprints(key, images))
        hashed += time.perf_counter() - start
    keys = np.unique(np.concatenate(parts))
    for k in range(trainings):
        if ranges:
            lo, hi = np.sort(rng.integers(0, n, 2))
            held = np.sort(rng.permutation(keys)[lo : max(hi, lo + 1)]) if k else keys
        else:
            held = np.sort(rng.choice(keys, size=3 * n // 4, replace=False))
        meta = {"training": f"t{k}", "experiment": f"e{k}", "out": f"/runs/r{k}/e{k}"}
        meta |= {"q": 50 / n, "noise_multiplier": 1.0, "delta": 1e-5, "steps": 1000}
        store.put({**meta, "private": True, "finished": True}, held)
    size = store.path("t0").stat().st_size
    start = time.perf_counter()
    person = individual(store, keys, 1e-5)
    overlap = time.perf_counter() - start
    return {
        "records": n,
        "fingerprint_s": round(hashed, 2),
        "bytes_per_training": size,
        "bytes_per_record": round(size / len(store.get("t0").fingerprints), 2),
        "overlap_s": round(overlap, 3),
        "trainings": trainings,
        "worst_off_in": len(person["worst_off"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainings", type=int, default=10)
    parser.add_argument("--ranges", action="store_true", help="contiguous ranges, not 3/4")
    args = parser.parse_args()
    for n, shape in SHAPES.items():
        with tempfile.TemporaryDirectory() as root:
            print(measure(n, shape, args.trainings, args.ranges, root))


if __name__ == "__main__":
    main()
