"""The proofs of ``dpsinkhorn release``, one per kind of published file, each on bytes
already read: :func:`check_ledger`, :func:`check_recorded` (a finished training of the
record wrote it), :func:`load_verified_generator`, :func:`check_draw` (samples are the
redraw) and :func:`check_score` (a score names its inputs by sha256).
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np

from dpsinkhorn.evaluate import classify, fid
from dpsinkhorn.fileio import sha256_of, sha256_of_bytes
from dpsinkhorn.privacy import trainings
from dpsinkhorn.report.common import NO_GUARANTEE
from dpsinkhorn.report.privacy_summary import check_ledger_record

#: A real guarantee starts with this (``train.release.privacy_record``).
DP_GUARANTEE = "(epsilon, delta)-DP"
#: How ``dpsinkhorn release`` names the option that accepts a public-seed ledger.
ACCEPT_FLAG = "--accept-no-guarantee"
#: A sample file drawn on another device may differ from the redraw here by float rounding:
#: at most this many grey levels per pixel, in at most this fraction of the pixels.
SAMPLE_TOLERANCE = {"grey_levels": 1, "pixel_fraction": 1e-3}
#: What a score file may hold: the keys its writers write (each writer lists its own).
SCORE_KEYS = {"fid": fid.RECORD_KEYS, "acc": classify.RECORD_KEYS}
#: Score keys whose value must be a number (not a bool) or null, and the longest string a
#: score file may hold (a path, a method's name, the fast loop's one-line error of at most
#: 300 characters), so that no writer's slip or hand edit carries records or arrays out.
SCORE_NUMBERS = frozenset(
    "fid accuracy holdout_accuracy seconds seed epochs best_epoch num_images_a num_images_b "
    "num_holdout num_train num_test num_classes max_epochs patience batch_size iterations "
    "max_iter batched_seeds".split()
)
SCORE_MAX_STRING = 400
#: Which recorded hash names the scored samples and which the public data, per score kind.
SCORE_INPUTS = {"fid": ("a_sha256", "b_sha256"), "acc": ("train_sha256", "test_sha256")}


def _json_object(data: bytes, path: Path, what: str) -> dict:
    """``data`` parsed as a JSON object, or a one-line refusal naming ``path``."""
    try:
        record = json.loads(data)
    except ValueError as err:
        raise ValueError(f"{path}: not a JSON {what} ({err})") from err
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a {what} (a JSON object)")
    return record


def check_ledger(
    data: bytes, path: Path, experiment: str | None, accept_none: bool, flag: str = ACCEPT_FLAG
) -> dict:
    """A DP ledger's content, proven from its own bytes: ``private: true``; ε that of its
    (q, noise multiplier, steps, δ) (``report.privacy_summary.check_ledger_record``); a guarantee
    that states that ε and ``delta_total``, or ``none…`` (public seed: only with ``flag``),
    as ``reproducible`` requires; the config's ``experiment`` (None: any)."""
    record = check_ledger_record(_json_object(data, path, "ledger"), path)
    if experiment is not None and record.get("experiment") != experiment:
        raise ValueError(
            f"{path}: the ledger of {record.get('experiment')!r}, not of {experiment!r} "
            "(a ledger copied from another experiment)"
        )
    guarantee, epsilon = record["guarantee"], record["epsilon"]
    delta_total = record.get("delta_total")
    if not isinstance(guarantee, str):
        raise ValueError(f"{path}: no guarantee (guarantee is {guarantee!r}); refusing")
    if record.get("reproducible") is not False and not guarantee.startswith(NO_GUARANTEE):
        raise ValueError(
            f"{path}: reproducible is {record.get('reproducible')!r} (a public noise seed) but "
            f"its guarantee claims {guarantee[:40]!r}; refusing"
        )
    if guarantee.startswith(NO_GUARANTEE) and not accept_none:
        raise ValueError(f"{path}: guarantee is {guarantee!r}; pass {flag} to publish it anyway")
    if guarantee.startswith(NO_GUARANTEE):
        return record
    stated = re.fullmatch(
        re.escape(DP_GUARANTEE) + r" with epsilon = (\S+), delta = (\S+) for .*", guarantee
    )
    if stated is None or not isinstance(delta_total, int | float):
        raise ValueError(f"{path}: guarantee {guarantee[:60]!r} is not one dpsinkhorn states")
    try:
        said = float(stated.group(1)), float(stated.group(2))
    except ValueError as err:
        raise ValueError(f"{path}: guarantee {guarantee[:60]!r} states no number") from err
    if not (
        math.isclose(said[0], epsilon, rel_tol=1e-5)
        and math.isclose(said[1], delta_total, rel_tol=1e-5)
        and record["delta"] <= delta_total < 1
    ):
        raise ValueError(
            f"{path}: guarantee states epsilon {said[0]:g}, delta {said[1]:g}; the ledger's are "
            f"{epsilon:g}, {delta_total!r} (delta {record['delta']!r}); refusing"
        )
    return record


def check_recorded(
    ledger: dict,
    data: bytes,
    path: Path,
    trained: list[dict],
    records: list[Path],
    spec: dict | None = None,
) -> str:
    """Why ``ledger`` (bytes ``data`` at ``path``) is the one a DP training wrote, or a
    refusal: ``trained`` (the finished trainings into its folder in ``records``) holds one
    whose generator hash is the ledger's ``content_sha256`` and whose ``ledger_sha256``
    matches ``data``, trained with ``spec`` (None: not checked)."""
    sha = ledger.get("content_sha256")
    same = [t for t in trained if t.get("content_sha256") == sha]
    if not same:
        # Record files are named by folder only (trainings.shown): their names are computed
        # from the private data.
        found = [trainings.shown(r) for r in records if Path(r).is_file()]
        missing = ", ".join(sorted({str(Path(r).parent) for r in records if not Path(r).is_file()}))
        where = "; ".join(found) or "the training record (no record file" + (
            f" of this training data in {missing})" if missing else ")"
        )
        raise ValueError(
            f"{path}: no finished DP training in {where} wrote this "
            f"folder's generator (content_sha256 {str(sha)[:12]}...); refusing a ledger that "
            "no training wrote"
        )
    done = same[-1]
    if sha256_of_bytes(data) != done.get("ledger_sha256"):
        raise ValueError(
            f"{path}: not the ledger training {done['training']} wrote (its sha256 differs "
            "from the training record's ledger_sha256, or the record lacks it); refusing"
        )
    if spec is not None and done.get("spec") != spec:
        changed = trainings.changed_settings(done.get("spec") or {}, spec)
        raise ValueError(
            f"{path}: trained with other settings than the config's ({', '.join(changed)}); "
            "the config does not describe this generator, refusing"
        )
    return "the ledger its training wrote (the training record's ledger_sha256)"


def load_verified_generator(payload: bytes, where: Path, device: str):
    """The generator of generator.pt's ``payload`` (bytes already checked against the
    ledger), on ``device``, read safely (``evaluate.sample.read_generator_bytes``)."""
    from dpsinkhorn.devices import resolve_device
    from dpsinkhorn.evaluate.sample import load_generator, read_generator_bytes

    state = read_generator_bytes(payload, str(where))
    return load_generator(where, resolve_device(device), state=state)


def check_draw(path: Path, data: bytes, images, labels, seed: int) -> str:
    """Why the run's sample file ``data`` is the draw (images, labels) although its bytes
    differ, or a refusal."""
    not_draw = f"{path}: not the verified generator's draw (seed {seed}, {len(labels)} samples)"
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            names = sorted(npz.files)
            arrays = {k: npz[k] for k in names}
    except Exception as err:  # not an npz at all
        raise ValueError(f"{not_draw}: not a sample file ({type(err).__name__})") from err
    if names != ["images", "labels"]:
        raise ValueError(f"{not_draw}: it holds {names}; refusing to publish it")
    got, got_labels = arrays["images"], arrays["labels"]
    if got.shape != images.shape or got.dtype != images.dtype:
        raise ValueError(f"{not_draw}: images {got.dtype}{list(got.shape)}; refusing")
    if not np.array_equal(got_labels, labels):
        raise ValueError(f"{not_draw}: other labels; refusing to publish it")
    diff = np.abs(got.astype(np.int16) - images.astype(np.int16))
    changed = int(np.count_nonzero(diff))
    if changed == 0:
        return f"redrawn (seed {seed}, {len(labels)} samples): equal arrays (other file bytes)"
    limit = SAMPLE_TOLERANCE["pixel_fraction"] * diff.size
    if int(diff.max()) > SAMPLE_TOLERANCE["grey_levels"] or changed > limit:
        raise ValueError(
            f"{not_draw}: {changed} pixels differ, by up to {int(diff.max())} grey levels; "
            "refusing to publish it"
        )
    return (
        f"redrawn (seed {seed}, {len(labels)} samples): {changed} pixels of the run's file "
        "differ by one grey level (float rounding of another device); the redraw is published"
    )


def _small_value(value, depth: int = 0) -> bool:
    """A JSON value a score writer writes: null, a bool, a finite number, a one-line string
    of at most :data:`SCORE_MAX_STRING` characters, or (one level deep) a list or object of
    at most 4 such values (an image shape, the fast loop's options)."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= SCORE_MAX_STRING and value.isprintable()
    if depth == 0 and isinstance(value, list):
        return len(value) <= 4 and all(_small_value(v, 1) for v in value)
    if depth == 0 and isinstance(value, dict):
        return len(value) <= 4 and all(
            isinstance(k, str) and len(k) <= 40 and _small_value(v, 1) for k, v in value.items()
        )
    return False


def check_score(
    path: Path,
    data: bytes,
    metric: str,
    seed: int,
    samples_sha: str,
    public: Path | None,
    test: Path | None = None,
) -> str:
    """Why the score file ``data`` (of ``metric``, ``seed``) may be published, or a
    refusal: its writer's keys only, computed from the sample file whose sha256 is
    ``samples_sha`` and scored against the public file ``public`` (FID: statistics of the
    test split, which must name the public ``test`` split as their source; classifiers:
    the test split)."""
    kind = "fid" if metric == "fid" else "acc"
    record = _json_object(data, path, "score file")
    extra = sorted(set(record) - SCORE_KEYS[kind])
    if extra:
        raise ValueError(f"{path}: holds {extra[0]!r}, not a key a score file has; refusing")
    if kind == "acc" and (f"acc_{record.get('model')}", record.get("seed")) != (metric, seed):
        raise ValueError(
            f"{path}: the score of {record.get('model')!r}, seed {record.get('seed')!r}; refusing"
        )
    for key, value in record.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        digest = re.fullmatch(r"[0-9a-f]{64}", str(value)) is not None
        if (
            not _small_value(value)
            or (key in SCORE_NUMBERS and value is not None and not number)
            or (key.endswith("_sha256") and value is not None and not digest)
        ):
            raise ValueError(
                f"{path}: its {key!r} is not a value its writer writes ({type(value).__name__}"
                f"{f' of {len(value)}' if isinstance(value, list | dict | str) else ''}); refusing"
            )
    samples_key, public_key = SCORE_INPUTS[kind]
    if record.get(samples_key) != samples_sha:
        raise ValueError(
            f"{path}: not computed from the run's samples of seed {seed} ({samples_key} "
            "differs or is missing); rerun its evaluation"
        )
    if public is None or not public.is_file():
        raise FileNotFoundError(f"{public}: missing (the public data {path.name} is scored on)")
    if record.get(public_key) != sha256_of(public):
        raise ValueError(
            f"{path}: not scored against the public {public} ({public_key} differs or is "
            "missing); refusing to publish it"
        )
    if kind == "fid":
        source = fid.statistics_metadata(public)["source_sha256"]
        if test is None or not test.is_file() or source != sha256_of(test):
            raise ValueError(
                f"{public}: not the statistics of the public test split {test} (its "
                f"source_sha256 differs or is missing), so {path.name} is not published; "
                f"recompute them: dpsinkhorn fid-stats --samples {test} --out {public}"
            )
        return (
            f"inputs by sha256: the samples of seed {seed} and {public.name}, the statistics "
            f"of the public {test.name}"
        )
    return f"inputs by sha256: the samples of seed {seed} and the public {public.name}"
