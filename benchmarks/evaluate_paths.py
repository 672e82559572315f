"""Time one generator's evaluation two ways, as the workflow would run each: the per-step
commands (one process per seed for ``sample`` and ``fid``, one per classifier for
``classify``, as the workflow ran them) against one ``dpsinkhorn evaluate`` process.
Alternates the two ``--reps`` times; prints one JSON line per run and the means.

    python benchmarks/evaluate_paths.py --mirror ../shared/data \\
        --weights ../shared/weights/pt_inception-2015-12-05-6726825d.pth \\
        --num 100 --seeds 0 --reps 3 --device cpu          # config/smoke.yaml's sizes

The generator is a randomly initialised paper-sized MNIST DCGAN (what is timed does not
depend on its training: the sizes, epochs and iteration caps are fixed by the arguments).
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
    p.add_argument("--num", type=int, default=100)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--fid-reference-size", type=int, default=100)
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--max-iter", type=int, default=200)
    args = p.parse_args()

    import torch

    from dpsinkhorn.models import GeneratorConfig, build_generator

    root = Path(tempfile.mkdtemp(prefix="evaluate-paths-"))
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
    torch.manual_seed(0)
    config = GeneratorConfig()
    gen = root / "generator.pt"
    state = {"state_dict": build_generator(config).state_dict(), "dataset": "mnist"}
    torch.save({**state, "model_config": config.to_dict()}, gen)
    seeds = [str(s) for s in args.seeds]
    device = ["--device", args.device]
    fit = [
        "--max-epochs",
        str(args.max_epochs),
        "--patience",
        str(args.patience),
        "--max-iter",
        str(args.max_iter),
        "--dataset",
        "mnist",
    ]

    def per_step(out: Path) -> None:
        for seed in seeds:
            samples = out / f"samples_seed{seed}.npz"
            run(
                [
                    "sample",
                    "--generator",
                    str(gen),
                    "--num",
                    str(args.num),
                    "--seed",
                    seed,
                    "--out",
                    str(samples),
                    *device,
                ]
            )
            run(
                [
                    "fid",
                    "--a",
                    str(samples),
                    "--b",
                    str(ref),
                    "--out",
                    str(out / f"fid_seed{seed}.json"),
                    "--sqrtm",
                    "eigh",
                    "--weights",
                    args.weights,
                    *device,
                ]
            )
        for model in ("logreg", "mlp", "cnn"):
            run(
                [
                    "classify",
                    "--model",
                    model,
                    "--train",
                    *[str(out / f"samples_seed{s}.npz") for s in seeds],
                    "--test",
                    str(test),
                    "--seed",
                    *seeds,
                    "--out",
                    *[str(out / f"acc_{model}_seed{s}.json") for s in seeds],
                    *fit,
                    *device,
                ]
            )

    def one_job(out: Path) -> None:
        run(
            [
                "evaluate",
                "--generator",
                str(gen),
                "--test",
                str(test),
                "--reference",
                str(ref),
                "--seed",
                *seeds,
                "--num",
                str(args.num),
                "--samples-dir",
                str(out),
                "--scores-dir",
                str(out),
                "--sqrtm",
                "eigh",
                "--weights",
                args.weights,
                *fit,
                *device,
            ]
        )

    times: dict[str, list[float]] = {"per_step": [], "one_job": []}
    for rep in range(args.reps):
        for name, fn in (("per_step", per_step), ("one_job", one_job)):
            out = root / f"{name}{rep}"
            out.mkdir()
            begin = time.perf_counter()
            fn(out)
            times[name].append(time.perf_counter() - begin)
            print(json.dumps({"path": name, "rep": rep, "seconds": times[name][-1]}), flush=True)
    means = {k: sum(v) / len(v) for k, v in times.items()}
    print(
        json.dumps(
            {
                "seeds": len(seeds),
                "num": args.num,
                "mean_seconds": means,
                "speed_up": means["per_step"] / means["one_job"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
