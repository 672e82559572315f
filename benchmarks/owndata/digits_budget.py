"""What budget gives recognisable samples on your own data: scikit-learn's 1,797 digits
(8x8, upscaled to 28x28 as in docs/OWN_DATA.md's example), trained on the CPU with
``dpsinkhorn.api`` at a few step counts and ε, and non-private runs for comparison.

    python benchmarks/owndata/digits_budget.py OUT_DIR [--steps 300 1000] \
        [--epsilons 10 50] [--nonprivate-steps 1000]

Writes ``OUT_DIR/<run>/`` (the release; a run whose generator.pt exists is reused),
``OUT_DIR/budgets.png`` (10 samples per class of each run, one panel per run) and
``OUT_DIR/budgets.json``: per run its steps, ε, σ, training seconds, and how often a
logistic regression trained on the real digits (a recognisability check, not a DP
release) gives a sample its conditioning label.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from dpsinkhorn import api
from dpsinkhorn.report.grids import save_grid_figure


def digits_28() -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 [1797, 28, 28] and their labels [1797]."""
    digits = load_digits()
    images = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    return (images * 255 / 16).astype(np.uint8), digits.target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[10.0])
    parser.add_argument("--nonprivate-steps", type=int, nargs="*", default=[1000])
    parser.add_argument("--batch-size", type=int, default=50)
    args = parser.parse_args()
    images, labels = digits_28()
    classes = [str(d) for d in range(10)]
    judge = LogisticRegression(max_iter=2000).fit(images.reshape(len(images), -1) / 255, labels)
    runs = [(s, e) for s in args.steps for e in args.epsilons]
    runs += [(s, None) for s in args.nonprivate_steps]
    results, panels = [], []
    for steps, eps in runs:
        name = f"nonprivate_{steps}" if eps is None else f"eps{eps:g}_{steps}"
        settings = {"steps": steps, "batch_size": args.batch_size, "delta": 1e-5}
        if eps is None:
            settings["method"] = "sinkhorn"
        else:
            settings.update({"target_epsilon": eps, "sigma": None})
        if (args.out / name / "generator.pt").exists():  # trained by an earlier call: reuse
            record = json.loads((args.out / name / "privacy.json").read_text())
            log = (args.out / name / "train_log.csv").read_text().splitlines()
            seconds = float(log[-1].split(",")[log[0].split(",").index("elapsed_s")])
        else:
            start = time.perf_counter()
            record = api.train(
                settings, args.out / name, train_data=(images, labels), classes=classes
            )
            seconds = time.perf_counter() - start
        samples, sample_labels = api.sample(args.out / name / "generator.pt", num=1000, seed=0)
        hits = judge.predict(samples.reshape(len(samples), -1) / 255) == sample_labels
        results.append(
            {
                "run": name,
                "steps": steps,
                "target_epsilon": eps,
                "epsilon": record.get("epsilon"),
                "sigma": record.get("sigma"),
                "train_seconds": round(seconds, 1),
                "real_data_classifier_agreement": round(float(hits.mean()), 3),
            }
        )
        panels.append((samples, sample_labels, name))
        print(json.dumps(results[-1]), flush=True)
    (args.out / "budgets.json").write_text(json.dumps(results, indent=1) + "\n")
    save_grid_figure(panels, classes, args.out / "budgets.png", "sklearn digits, 28 px, CPU")


if __name__ == "__main__":
    main()
