"""One generator's whole evaluation in one process: ``dpsinkhorn evaluate``.

For every seed: draw the synthetic dataset (a trained generator's balanced samples, or a
real-data row's seeded subset of the training set), its FID against cached reference
statistics, and the classifiers trained on it and tested on the real test set. Writes
exactly the files the per-step commands write (``sample``/``sample-real``, ``fid``,
``classify``), with the same names and fields:

- ``<samples-dir>/samples_seed<s>.npz``,
- ``<scores-dir>/fid_seed<s>.json``, ``<scores-dir>/acc_<model>_seed<s>.json``.

Resumable: a job stopped after some phases (FID, a classifier) resumes after them
(:class:`Progress`), where the code that computed them is this code. Each phase's wall
seconds are printed as it ends; a completed job writes ``<scores-dir>/evaluate_phases.json``:
per phase, the commit (``$DPSINKHORN_COMMIT``, which ``gpu-window`` sets) and the code
(:func:`dpsinkhorn.evaluate.phases.phase_code_sha256`) that computed it.

What one process saves: the generator, the Inception network, the reference statistics
and the test set are loaded once; the samples never go to disk and back; each classifier
trains all seeds together on the device (``batched``: vmapped MLP/CNN, Log-Reg by torch's
L-BFGS, :mod:`dpsinkhorn.evaluate.classifiers`). A seed's samples and FID equal the
per-step path's exactly (same generator stream, same features); its accuracies agree
within the seed-to-seed spread (the CNN's dropout masks and the Log-Reg solver differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from dpsinkhorn import fileio
from dpsinkhorn.config.targets import (
    EVALUATION_PHASES,
    EVALUATION_PROGRESS,
    sample_name,
    score_name,
)
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.classifiers import MODELS
from dpsinkhorn.evaluate.classify import (
    resolve_num_classes,
    train_and_evaluate_seeds,
    write_results,
)
from dpsinkhorn.evaluate.fid import (
    SQRTM_METHODS,
    check_same_inputs,
    fid_against_reference,
    reference_statistics,
    statistics_metadata,
)
from dpsinkhorn.evaluate.inception import FID_PRECISIONS, network_sha256
from dpsinkhorn.evaluate.phases import COMMIT_ENV, phase_code_sha256, resumable
from dpsinkhorn.evaluate.sample import load_generator, sample_generator, sample_real


def sample_files(samples_dir: str | Path, seeds: list[int]) -> list[Path]:
    """``<samples_dir>/samples_seed<s>.npz`` for each seed."""
    return [Path(samples_dir) / sample_name(s) for s in seeds]


def score_files(scores_dir: str | Path, seeds: list[int], classifiers: list[str]) -> list[Path]:
    """FID then classifier result files of every seed, in the order they are written."""
    scores = Path(scores_dir)
    return [scores / score_name("fid", s) for s in seeds] + [
        scores / score_name(f"acc_{m}", s) for m in classifiers for s in seeds
    ]


def evaluate(
    *,
    seeds: list[int],
    num: int,
    test: str | Path,
    reference: str | Path,
    samples_dir: str | Path,
    scores_dir: str | Path,
    generator: str | Path | None = None,
    real_data: str | Path | None = None,
    classifiers: tuple[str, ...] | list[str] = MODELS,
    dataset: str | None = None,
    weights: str | Path | None = None,
    device: str = "auto",
    sqrtm: str = "pytorch_fid",
    fid_batch_size: int | None = None,
    max_epochs: int = 1000,
    patience: int = 30,
    batch_size: int = 128,
    max_iter: int = 5000,
    fid: bool = True,
    fast: bool = False,
    fid_precision: str = "fp32",
) -> dict[str, float]:
    """Evaluate one generator (``generator``) or real-data row (``real_data``: its
    ``train.npz``) for ``seeds``; writes the files listed in the module docstring and
    returns wall seconds per phase (``sample``, ``fid``, ``classify_<model>``, ``total``).
    ``fid`` False leaves FID out (only the classifiers' files are written).

    ``num`` samples per seed; ``test`` the real test split (sample file); ``reference``
    its FID statistics (``dpsinkhorn fid-stats``). Every argument is checked before any
    work: unknown classifiers, a missing file, an unconditional generator with
    classifiers, a bad ``sqrtm``, a count below 1 (epochs, patience, batch sizes,
    iterations), a ``reference`` that is no statistics file, a ``dataset`` whose class count
    cannot be found; before the samples are saved, reference statistics of another image
    shape than the samples' and (with classifiers) a test split whose images differ in
    shape from the samples or whose labels exceed the class count.

    ``fast``: the fast paths (FID: :func:`fid.statistics` ``fast``, in ``fid_precision``;
    MLP / CNN: :mod:`dpsinkhorn.evaluate.fastfit`); today's reference path otherwise. FID
    agrees to about 1e-6 relative in fp32, accuracies are identical on a CPU.
    """
    start = time.perf_counter()
    if (generator is None) == (real_data is None):
        raise ValueError("give exactly one of --generator and --real-data")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seed needs distinct seeds, got {seeds}")
    if num < 2:
        raise ValueError(f"--num must be at least 2 (FID needs 2 images), got {num}")
    unknown = [m for m in classifiers if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown classifier {unknown[0]!r}; choose from {', '.join(MODELS)}")
    if sqrtm not in SQRTM_METHODS:
        raise ValueError(f"unknown FID sqrtm method {sqrtm!r}; choose from {SQRTM_METHODS}")
    if fid_precision not in FID_PRECISIONS or (fid_precision != "fp32" and not fast):
        raise ValueError(
            f"FID precision {fid_precision!r}: one of {FID_PRECISIONS}, not fp32 only with --fast"
        )
    counts = {
        "--max-epochs": max_epochs,
        "--patience": patience,
        "--batch-size": batch_size,
        "--max-iter": max_iter,
        "--fid-batch-size": fid_batch_size,
    }
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for path in [test, reference, generator, real_data]:
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: file not found")
    if fid:
        reference_statistics(reference)  # a sample file or a broken one: refused before the work
    # the class count (--dataset, an own dataset's dataset.json) before the work, not after FID
    num_classes = resolve_num_classes(None, dataset, str(test)) if classifiers else None
    timings: dict[str, float] = {}
    settings = {
        "seeds": seeds,
        "num": num,
        "sqrtm": sqrtm,
        "max_epochs": max_epochs,
        "patience": patience,
        "batch_size": batch_size,
        "max_iter": max_iter,
        "weights": None if weights is None else network_sha256(weights),
        "num_classes": num_classes,
    }
    if fast:  # its results may differ in the last digits: not resumed from the reference's
        settings["fast"] = fid_precision
    progress = Progress(Path(scores_dir), [generator or real_data, test, reference], settings)

    begin = time.perf_counter()
    if generator is not None:
        model = load_generator(Path(generator), resolve_device(device))
        if not model.conditional and classifiers:
            raise ValueError(
                f"{generator} is unconditional: its samples have no labels, so no classifier "
                f"({', '.join(classifiers)}) can be trained on them"
            )
        draws = [sample_generator(model, num, seed) for seed in seeds]
        del model
    else:
        draws = [sample_real(Path(real_data), num, seed) for seed in seeds]
    shape = [int(v) for v in fileio.channels_last(draws[0][0], "samples").shape[1:]]
    if fid:  # as the FID phase would, before the samples are saved
        sides = [{"image_shape": shape, "weights_sha256": None}, statistics_metadata(reference)]
        check_same_inputs([Path("the samples"), Path(reference)], sides, None)
    if classifiers:
        test_images, test_labels = fileio.load_samples(test)
        _check_test_split(shape, draws, test_images, test_labels, num_classes, test)
    files = sample_files(samples_dir, seeds)
    for path, (images, labels) in zip(files, draws, strict=True):
        fileio.save_samples(path, images, labels)
    progress.bind([fileio.sha256_of(path) for path in files])
    timings["sample"] = _done("sample", begin)

    if fid:
        begin = time.perf_counter()
        records = progress.get("fid") or [
            fid_against_reference(
                images,
                reference,
                str(path),
                weights,
                device,
                fid_batch_size,
                sqrtm,
                fast,
                fid_precision,
            )
            for path, (images, _) in zip(files, draws, strict=True)
        ]
        progress.put("fid", records)
        for seed, record in zip(seeds, records, strict=True):
            fileio.write_json(Path(scores_dir) / score_name("fid", seed), record)
            print(f"FID {record['fid']:.3f} (seed {seed})", flush=True)
        timings["fid"] = _done("fid", begin)

    if classifiers:
        for model_name in classifiers:
            begin = time.perf_counter()
            results = progress.get(model_name) or train_and_evaluate_seeds(
                model_name,
                draws,
                test_images,
                test_labels,
                seeds,
                num_classes=num_classes,
                device=device,
                max_epochs=max_epochs,
                patience=patience,
                batch_size=batch_size,
                max_iter=max_iter,
                batched=True,
                fast=fast,
            )
            progress.put(model_name, results)
            outs = [Path(scores_dir) / score_name(f"acc_{model_name}", s) for s in seeds]
            write_results(results, files, test, dataset, outs)
            timings[f"classify_{model_name}"] = _done(f"classify_{model_name}", begin)
    progress.finish(Path(scores_dir))
    timings["total"] = time.perf_counter() - start
    return timings


def _check_test_split(
    shape: list[int],
    draws: list,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int | None,
    test: str | Path,
) -> None:
    """Refuse, before the samples are saved and scored, what the classifiers would refuse
    only after FID: test images [H,W,C] of another shape than the samples' (``shape``; uint8
    [N,H,W(,C)], labels [N]), a label outside ``num_classes``."""
    test_shape = [int(v) for v in fileio.channels_last(test_images, str(test)).shape[1:]]
    if shape != test_shape:
        raise ValueError(
            f"{test}: test images [H,W,C]={list(test_shape)} differ from the samples' {list(shape)}"
        )
    if len(test_labels) == 0:
        raise ValueError(f"{test}: the test set must not be empty")
    largest = max(int(labels.max()) for labels in [test_labels, *(y for _, y in draws)])
    if num_classes is not None and largest >= num_classes:
        raise ValueError(
            f"labels go up to {largest}, outside the {num_classes} classes ({test}, samples)"
        )


def _done(phase: str, begin: float) -> float:
    """Print a phase's wall seconds as it ends (the job's log shows where time went)."""
    seconds = time.perf_counter() - begin
    print(f"[{time.strftime('%H:%M:%S')}] {phase}: {seconds:.1f} s", flush=True)
    return seconds


class Progress:
    """Finished phases of an interrupted evaluation, so a rerun resumes after them.

    A stopped job (a window's deadline, a cluster's time limit) loses its declared outputs:
    Snakemake deletes them. Each phase's records (FID, one classifier, all seeds) are also
    kept in ``<scores>/evaluate_progress.json`` (not an output, so kept), keyed by the
    SHA-256 of the inputs and the settings (the class count among them): a rerun with the
    same key reuses them, any other key starts afresh. Each phase also records the code
    that computed it (:func:`dpsinkhorn.evaluate.phases.phase_code_sha256`) and the commit
    (``$DPSINKHORN_COMMIT``, or null): a phase whose code differs from this code (another
    commit, an older archive) is computed again, and so is one computed on other samples
    (:meth:`bind`). Removed when the job completes, when
    :data:`EVALUATION_PHASES` takes each phase's commit and code. Only scores are kept
    there, never images (samples are drawn again: seeded, the same).
    """

    NAME = EVALUATION_PROGRESS

    def __init__(self, scores_dir: Path, inputs: list, settings: dict) -> None:
        self.path = scores_dir / self.NAME
        digests = [fileio.sha256_of(p) for p in inputs]
        text = json.dumps([digests, settings], sort_keys=True)
        self.key = hashlib.sha256(text.encode()).hexdigest()
        found = fileio.read_json(self.path) if self.path.is_file() else {}
        saved = found.get("done", {}) if found.get("key") == self.key else {}
        self.done = resumable(saved)
        for phase in sorted(set(saved) - set(self.done)):
            commit = saved[phase].get("commit") if isinstance(saved[phase], dict) else None
            print(
                f"rerunning {phase}: saved by other evaluation code (commit {commit or 'unknown'})",
                flush=True,
            )
        self.samples: list[str] = []

    def bind(self, samples_sha256: list[str]) -> None:
        """Keep only the phases computed on these samples (SHA-256 of each seed's sample
        file): samples drawn by other code (a generator architecture another commit changed,
        outside :data:`phases.PHASE_MODULES`) are scored again; new phases record them."""
        self.samples = list(samples_sha256)
        for phase in [p for p, e in self.done.items() if e.get("samples_sha256") != self.samples]:
            print(f"rerunning {phase}: saved for other samples", flush=True)
            del self.done[phase]
        if self.done:
            print(f"resuming: {', '.join(self.done)} already done ({self.path})", flush=True)

    def get(self, phase: str) -> list[dict] | None:
        return [dict(r) for r in self.done[phase]["records"]] if phase in self.done else None

    def put(self, phase: str, records: list[dict]) -> None:
        """Save ``phase``'s records; a phase resumed keeps the commit that computed it."""
        entry = self.done.get(phase) or {
            "code_sha256": phase_code_sha256(phase),
            "commit": os.environ.get(COMMIT_ENV),
            "samples_sha256": self.samples,
        }
        self.done[phase] = {**entry, "records": [dict(r) for r in records]}
        fileio.write_json(self.path, {"key": self.key, "done": self.done})

    def finish(self, scores_dir: Path) -> None:
        """Write :data:`EVALUATION_PHASES` (each phase's commit and code) and drop the progress."""
        phases = {p: {k: e[k] for k in ("commit", "code_sha256")} for p, e in self.done.items()}
        fileio.write_json(scores_dir / EVALUATION_PHASES, phases)
        self.path.unlink(missing_ok=True)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    timings = evaluate(
        seeds=args.seed,
        num=args.num,
        test=args.test,
        reference=args.reference,
        samples_dir=args.samples_dir,
        scores_dir=args.scores_dir,
        generator=args.generator,
        real_data=args.real_data,
        classifiers=args.classifiers,
        dataset=args.dataset,
        weights=args.weights,
        device=args.device,
        sqrtm=args.sqrtm,
        fid_batch_size=args.fid_batch_size,
        max_epochs=args.max_epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        max_iter=args.max_iter,
        fid=not args.no_fid,
        fast=args.fast,
        fid_precision=args.fid_precision,
    )
    line = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"evaluation of {len(args.seed)} seeds: {line}")
    if args.timings:
        fileio.write_json(args.timings, {"seeds": args.seed, "num": args.num, "seconds": timings})
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``evaluate``."""
    p = subparsers.add_parser(
        "evaluate",
        help="one generator's whole evaluation in one process: samples, FID and the "
        "classifiers of every seed",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--generator", help="generator.pt of a trained experiment")
    source.add_argument("--real-data", help="train.npz: a real-data row (seeded subsets)")
    p.add_argument("--test", required=True, help="the real test split (test.npz)")
    p.add_argument("--reference", required=True, help="its FID statistics (fid-stats)")
    p.add_argument("--seed", type=int, nargs="+", required=True, help="evaluation seeds")
    p.add_argument("--num", type=int, required=True, help="samples per seed")
    p.add_argument("--samples-dir", required=True, help="where samples_seed<s>.npz go")
    p.add_argument("--scores-dir", required=True, help="where fid_/acc_*_seed<s>.json go")
    p.add_argument(
        "--classifiers", nargs="*", default=list(MODELS), help="of logreg, mlp, cnn (none: FID)"
    )
    p.add_argument("--dataset", default=None, help="dataset whose class count applies")
    p.add_argument("--weights", default=None, help="pytorch-fid's Inception weights file")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    p.add_argument("--sqrtm", choices=SQRTM_METHODS, default="pytorch_fid")
    p.add_argument("--fid-batch-size", type=int, default=None, help="Inception batch")
    p.add_argument("--max-epochs", type=int, default=1000, help="mlp/cnn epoch cap")
    p.add_argument("--patience", type=int, default=30, help="mlp/cnn early-stopping epochs")
    p.add_argument("--batch-size", type=int, default=128, help="mlp/cnn batch size")
    p.add_argument("--max-iter", type=int, default=5000, help="logreg L-BFGS iterations")
    p.add_argument("--no-fid", action="store_true", help="classifiers only (no FID files)")
    p.add_argument("--timings", default=None, help="also write the phase times (JSON)")
    p.add_argument(
        "--fast",
        action="store_true",
        help="fast paths: Inception with batch norm folded, channels-last, statistics on the "
        "device; MLP/CNN with early stopping on the device and CUDA graphs on CUDA (default: "
        "today's reference path)",
    )
    p.add_argument(
        "--fid-precision",
        choices=FID_PRECISIONS,
        default="fp32",
        help="with --fast: the Inception convolutions' arithmetic (fp32: IEEE; tf32: cuDNN "
        "TF32 on CUDA; bf16/fp16: autocast)",
    )
    p.set_defaults(handler=_cmd_evaluate)
