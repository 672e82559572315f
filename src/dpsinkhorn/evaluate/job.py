"""One generator's whole evaluation in one process: ``dpsinkhorn evaluate``.

:func:`evaluate` checks the inputs of an :class:`EvaluationSpec`, draws every seed's samples
(``samples_seed<s>.npz``) and scores them (``fid_seed<s>.json``, ``acc_<model>_seed<s>.json``),
resuming a stopped job after its finished phases (:class:`Progress`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

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
    check_sets,
    resolve_num_classes,
    train_and_evaluate_seeds,
    write_results,
)
from dpsinkhorn.evaluate.fid import (
    SQRTM_METHODS,
    check_same_inputs,
    fid_against_reference,
    load_statistics,
    statistics_metadata,
)
from dpsinkhorn.evaluate.inception import FID_PRECISIONS, leaves_tf32_switch, network_sha256
from dpsinkhorn.evaluate.sample import channels_last, generate, load_generator, sample_real


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    """Everything one evaluation depends on, checked when built (one-line ``ValueError``);
    the fields are ``dpsinkhorn evaluate``'s flags. One source: ``generator`` or
    ``real_data`` (a train.npz, seeded subsets); ``reference``: the test split's statistics."""

    seeds: tuple[int, ...]
    num: int
    test: Path
    reference: Path
    samples_dir: Path
    scores_dir: Path
    generator: Path | None = None
    real_data: Path | None = None
    classifiers: tuple[str, ...] = MODELS
    dataset: str | None = None
    weights: Path | None = None
    device: str = "auto"
    fid: bool = True
    sqrtm: str = "pytorch_fid"
    fid_precision: str = "fp32"
    fid_batch_size: int | None = None
    max_epochs: int = 1000
    patience: int = 30
    batch_size: int = 128
    max_iter: int = 5000

    def __post_init__(self) -> None:
        paths = ("test", "reference", "samples_dir", "scores_dir", "generator", "real_data")
        for name in paths + ("weights",):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "classifiers", tuple(self.classifiers))
        if (self.generator is None) == (self.real_data is None):
            raise ValueError("give exactly one of --generator and --real-data")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seed needs distinct seeds, got {list(self.seeds)}")
        if self.num < 2:
            raise ValueError(f"--num must be at least 2 (FID needs 2 images), got {self.num}")
        choices = {
            "classifier": (self.classifiers, MODELS),
            "FID sqrtm method": ((self.sqrtm,), SQRTM_METHODS),
            "FID precision": ((self.fid_precision,), FID_PRECISIONS),
        }
        for what, (values, allowed) in choices.items():
            for value in set(values) - set(allowed):
                raise ValueError(f"unknown {what} {value!r}; choose from {', '.join(allowed)}")
        for name in ("max_epochs", "patience", "batch_size", "max_iter", "fid_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


#: The modules of :mod:`dpsinkhorn.evaluate` whose code computes each phase's records (FID;
#: every classifier): a phase saved by other code is computed again, not resumed.
PHASE_MODULES = {
    "fid": ("sample", "inception", "fid"),
    "classifier": ("sample", "classifiers", "classify"),
}
#: The commit a job runs at, when its caller knows it (a copied tree may have no .git).
COMMIT_ENV = "DPSINKHORN_COMMIT"


def phase_code_sha256(phase: str) -> str:
    """SHA-256 of the source files that compute ``phase`` (``fid``, or a classifier's name):
    :data:`PHASE_MODULES`, each as its name, a NUL and its bytes."""
    here = Path(__file__).parent
    modules = PHASE_MODULES["fid" if phase == "fid" else "classifier"]
    return fileio.sha256_of_bytes(
        b"".join(m.encode() + b"\0" + (here / f"{m}.py").read_bytes() for m in modules)
    )


#: The spec's fields (besides seeds, weights and class count) a saved phase is keyed by.
KEYED_SETTINGS = "num sqrtm fid_precision max_epochs patience batch_size max_iter".split()
#: The spec's fields :func:`classify.train_and_evaluate_seeds` takes.
TRAINING_SETTINGS = ("device", "max_epochs", "patience", "batch_size", "max_iter")


@dataclasses.dataclass
class Draws:
    """Every seed's samples (images uint8 [N,H,W(,C)], a generator's on its device; labels
    [N]) as saved in ``files``, and the test split (None without classifiers)."""

    files: list[Path]
    samples: list[tuple[np.ndarray, np.ndarray]]
    test_images: np.ndarray | None
    test_labels: np.ndarray | None


def evaluate(spec: EvaluationSpec) -> dict[str, float]:
    """Check the inputs, draw the samples, score them; returns wall seconds per phase
    (``sample``, ``fid``, ``classify_<model>``, ``total``)."""
    start = time.perf_counter()
    num_classes = check_inputs(spec)
    settings = {key: getattr(spec, key) for key in KEYED_SETTINGS} | {
        "seeds": list(spec.seeds),
        "weights": None if spec.weights is None else network_sha256(spec.weights),
        "num_classes": num_classes,
    }
    source = spec.generator or spec.real_data
    progress = Progress(spec.scores_dir, [source, spec.test, spec.reference], settings)
    begin = time.perf_counter()
    draws = draw(spec, num_classes)
    progress.bind([fileio.sha256_of(path) for path in draws.files])
    timings = {"sample": _done("sample", begin)}
    timings |= score(spec, draws, num_classes, progress)
    progress.finish(spec.scores_dir)
    timings["total"] = time.perf_counter() - start
    return timings


def check_inputs(spec: EvaluationSpec) -> int | None:
    """Refuse, before any work, a missing file, a ``reference`` that is no statistics file
    and a ``dataset`` whose class count cannot be found; returns the class count (None
    without classifiers, or without ``dataset``: the labels' largest + 1)."""
    for path in [spec.test, spec.reference, spec.generator, spec.real_data]:
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{path}: file not found")
    if spec.fid:
        load_statistics(spec.reference)
    if not spec.classifiers:
        return None
    return resolve_num_classes(spec.dataset, str(spec.test))


def draw(spec: EvaluationSpec, num_classes: int | None) -> Draws:
    """Every seed's samples, saved; before saving, refuses an unconditional generator with
    classifiers, reference statistics of another image shape than the samples', and (with
    classifiers) a test split of another image shape or with labels beyond the class count."""
    if spec.generator is not None:
        model = load_generator(spec.generator, resolve_device(spec.device))
        if not model.conditional and spec.classifiers:
            raise ValueError(
                f"{spec.generator} is unconditional: its samples have no labels, so no "
                f"classifier ({', '.join(spec.classifiers)}) can be trained on them"
            )
        samples = [generate(model, spec.num, seed) for seed in spec.seeds]  # on its device
        del model
    else:
        samples = [sample_real(spec.real_data, spec.num, seed) for seed in spec.seeds]
    shape = [int(v) for v in channels_last(samples[0][0], "samples").shape[1:]]
    if spec.fid:
        sides = [{"image_shape": shape, "weights_sha256": None}]
        sides.append(statistics_metadata(spec.reference))
        check_same_inputs([Path("the samples"), spec.reference], sides, None)
    test_images = test_labels = None
    if spec.classifiers:
        test_images, test_labels = fileio.load_samples(spec.test)
        check_sets(samples, test_images, test_labels, num_classes, str(spec.test))
    files = [spec.samples_dir / sample_name(s) for s in spec.seeds]
    for path, (images, labels) in zip(files, samples, strict=True):
        fileio.save_samples(
            path, images.cpu().numpy() if torch.is_tensor(images) else images, labels
        )
    return Draws(files, samples, test_images, test_labels)


def score(
    spec: EvaluationSpec, draws: Draws, num_classes: int | None, progress: Progress
) -> dict[str, float]:
    """FID of every seed and each classifier (all seeds together); writes their files and
    returns each phase's wall seconds. A phase ``progress`` holds is not computed again. On
    CUDA the FID runs beside the classifiers (:func:`run_phases`) when
    :func:`inception.leaves_tf32_switch`: neither then changes the other's arithmetic."""
    phases = [lambda: _score_classifiers(spec, draws, num_classes, progress)]
    if spec.fid:
        phases.insert(0, lambda: _score_fid(spec, draws, progress))
    device = resolve_device(spec.device)
    beside = device.type == "cuda" and leaves_tf32_switch(spec.fid_precision)
    return {key: s for timings in run_phases(phases, beside, device) for key, s in timings.items()}


def run_phases(
    phases: list[Callable[[], dict]], concurrent: bool, device: torch.device
) -> list[dict]:
    """Each phase's result, in order. ``concurrent``: every phase in a thread of its own,
    on CUDA each on a stream of its own that starts after the work queued so far and is
    synchronised at the phase's end; else one after the other. An exception is raised
    after every phase has ended."""
    if not concurrent or len(phases) < 2:
        return [phase() for phase in phases]

    def on_stream(phase: Callable[[], dict]) -> dict:
        if device.type != "cuda":
            return phase()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            result = phase()
        stream.synchronize()
        return result

    with ThreadPoolExecutor(len(phases)) as pool:
        futures = [pool.submit(on_stream, phase) for phase in phases]
    return [future.result() for future in futures]


def _score_fid(spec: EvaluationSpec, draws: Draws, progress: Progress) -> dict[str, float]:
    """Every seed's FID record and file; the phase's wall seconds."""
    begin = time.perf_counter()
    options = (spec.weights, spec.device, spec.fid_batch_size, spec.sqrtm, spec.fid_precision)
    records = progress.get("fid") or [
        fid_against_reference(images, spec.reference, str(path), *options)
        for path, (images, _) in zip(draws.files, draws.samples, strict=True)
    ]
    progress.put("fid", records)
    for seed, record in zip(spec.seeds, records, strict=True):
        fileio.write_json(spec.scores_dir / score_name("fid", seed), record)
        print(f"FID {record['fid']:.3f} (seed {seed})", flush=True)
    return {"fid": _done("fid", begin)}


def _score_classifiers(
    spec: EvaluationSpec, draws: Draws, num_classes: int | None, progress: Progress
) -> dict[str, float]:
    """Each classifier's records and files, one after the other; their wall seconds."""
    timings = {}
    for model_name in spec.classifiers:
        begin = time.perf_counter()
        training = {k: getattr(spec, k) for k in TRAINING_SETTINGS}
        data = (draws.samples, draws.test_images, draws.test_labels, list(spec.seeds))
        results = progress.get(model_name) or train_and_evaluate_seeds(
            model_name, *data, num_classes=num_classes, **training
        )
        progress.put(model_name, results)
        outs = [spec.scores_dir / score_name(f"acc_{model_name}", s) for s in spec.seeds]
        write_results(results, draws.files, spec.test, spec.dataset, outs)
        timings[f"classify_{model_name}"] = _done(f"classify_{model_name}", begin)
    return timings


def _done(phase: str, begin: float) -> float:
    """Print a phase's wall seconds as it ends (the job's log shows where time went)."""
    seconds = time.perf_counter() - begin
    print(f"[{time.strftime('%H:%M:%S')}] {phase}: {seconds:.1f} s", flush=True)
    return seconds


class Progress:
    """Finished phases of an interrupted evaluation (scores only, never images) in
    ``<scores>/evaluate_progress.json``, keyed by the SHA-256 of inputs and settings, with
    the phase's code hash (:func:`phase_code_sha256`) and ``$DPSINKHORN_COMMIT``:
    a rerun reuses a phase only with the same key, code and samples (:meth:`bind`).
    Removed when the job completes (docs/CONTRACTS.md)."""

    NAME = EVALUATION_PROGRESS

    def __init__(self, scores_dir: Path, inputs: list, settings: dict) -> None:
        self.path = scores_dir / self.NAME
        digests = [fileio.sha256_of(p) for p in inputs]
        text = json.dumps([digests, settings], sort_keys=True)
        self.key = hashlib.sha256(text.encode()).hexdigest()
        found = fileio.read_json(self.path) if self.path.is_file() else {}
        saved = found.get("done", {}) if found.get("key") == self.key else {}
        self.done = {p: e for p, e in saved.items() if e["code_sha256"] == phase_code_sha256(p)}
        for phase in sorted(set(saved) - set(self.done)):
            commit = saved[phase]["commit"] or "unknown"
            print(
                f"rerunning {phase}: saved by other evaluation code (commit {commit})", flush=True
            )
        self.samples: list[str] = []
        self.lock = threading.Lock()  # phases may finish in threads of their own

    def bind(self, samples_sha256: list[str]) -> None:
        """Keep only the phases computed on these samples (SHA-256 of each seed's sample
        file): samples drawn by other code (a generator architecture changed outside
        :data:`PHASE_MODULES`) are scored again; new phases record them."""
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
        with self.lock:
            self.done[phase] = {**entry, "records": [dict(r) for r in records]}
            fileio.write_json(self.path, {"key": self.key, "done": self.done})

    def finish(self, scores_dir: Path) -> None:
        """Write :data:`EVALUATION_PHASES` (each phase's commit and code) and drop the progress."""
        phases = {p: {k: e[k] for k in ("commit", "code_sha256")} for p, e in self.done.items()}
        fileio.write_json(scores_dir / EVALUATION_PHASES, phases)
        self.path.unlink(missing_ok=True)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    fields = dataclasses.fields(EvaluationSpec)  # each flag's dest is a field
    timings = evaluate(EvaluationSpec(**{f.name: getattr(args, f.name) for f in fields}))
    line = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"evaluation of {len(args.seeds)} seeds: {line}")
    if args.timings:
        fileio.write_json(args.timings, {"seeds": args.seeds, "num": args.num, "seconds": timings})
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
    p.add_argument("--seed", dest="seeds", type=int, nargs="+", required=True, help="seeds")
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
    p.add_argument(
        "--fid-precision",
        choices=FID_PRECISIONS,
        default="fp32",
        help="the Inception convolutions' arithmetic (fp32: IEEE; tf32: cuDNN TF32 on CUDA; "
        "bf16/fp16: the network cast to that type once)",
    )
    p.add_argument("--fid-batch-size", type=int, default=None, help="Inception batch")
    p.add_argument("--max-epochs", type=int, default=1000, help="mlp/cnn epoch cap")
    p.add_argument("--patience", type=int, default=30, help="mlp/cnn early-stopping epochs")
    p.add_argument("--batch-size", type=int, default=128, help="mlp/cnn batch size")
    p.add_argument("--max-iter", type=int, default=5000, help="logreg L-BFGS iterations")
    p.add_argument(
        "--no-fid", dest="fid", action="store_false", help="classifiers only (no FID files)"
    )
    p.add_argument("--timings", default=None, help="also write the phase times (JSON)")
    p.set_defaults(handler=_cmd_evaluate)
