"""The training record: every training that drew noise from a private data source.

One append-only JSON-lines file of events (:data:`EVENTS`, written by
``train.workspace.RunFiles``) per source, ``<data_dir>/trainings/<fingerprint>.jsonl``, keyed
by the training arrays' content; private side only. :func:`composed` composes every DP
training of a source (RDP, add/remove-one adjacency) at the largest δ any claims. Events,
retrain refusals: docs/PRIVACY.md ("The training record"). Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

#: The record's folder under a data_dir.
RECORD_DIR = "trainings"
#: Environment variable naming experiments (comma-separated, or ``all``) that may retrain.
RETRAIN_ENV = "DPSINKHORN_RETRAIN"
#: The events a record holds.
EVENTS = ("started", "resumed", "finished", "republished")


class RetrainRefused(ValueError):
    """A finished DP experiment would be trained again (CLI: exit 2, one line)."""


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 (hex) of the shapes, dtypes and bytes of images and labels: part of the
    checkpoint's ``spec_hash`` and the record's key. Private side only, never published."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(images), np.ascontiguousarray(labels)):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def record_file(record_dir: str | os.PathLike, fingerprint: str) -> Path:
    """``<record_dir>/<first 16 hex digits of the fingerprint>.jsonl``. Its name is computed
    from the private data: messages name :func:`shown` instead."""
    return Path(record_dir) / f"{fingerprint[:16]}.jsonl"


def shown(path: str | os.PathLike) -> str:
    """How a message names the record file ``path``: by its folder only (its name is 64
    bits of the data's sha256, which would let one test which record is in it)."""
    return f"the training record in {Path(path).parent}"


def new_training_id() -> str:
    return uuid.uuid4().hex


def append(record_dir: str | os.PathLike, fingerprint: str, event: Mapping) -> Path:
    """Append one event (a JSON line, written with O_APPEND and fsynced in one ``write``)
    to the record."""
    path = record_file(record_dir, fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **event}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


#: What :func:`composed` needs of a DP training: its mechanism and its step count.
MECHANISM = ("q", "noise_multiplier", "delta", "steps")


def read(path: str | os.PathLike) -> list[dict]:
    """The events of one record file (one-line ValueError naming a damaged line: not JSON,
    not an event with its training's id, or a training whose events name no experiment, say
    not whether it is private or, for a DP training, lack its :data:`MECHANISM`)."""
    events, first_line = [], {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{shown(path)}: line {number} of a record file is not JSON ({err.msg})"
                ) from None
            if not (
                isinstance(event, dict)
                and isinstance(event.get("training"), str)
                and event.get("event") in EVENTS
            ):
                raise ValueError(
                    f"{shown(path)}: line {number} of a record file is not a training event "
                    f"(needs a training id and an event of {', '.join(EVENTS)})"
                )
            first_line.setdefault(event["training"], number)
            events.append(event)
    for t in trainings(events):  # never skipped: its epsilon would go uncounted
        if not isinstance(t.get("experiment"), str):
            lacks = "names its experiment"
        elif not isinstance(t.get("private"), bool):
            lacks = "says whether it is private"
        elif t["private"] and not accounted(t):
            lacks = f"records its mechanism ({', '.join(MECHANISM)})"
        else:
            continue
        raise ValueError(
            f"{shown(path)}: line {first_line[t['training']]}: no event of training "
            f"{t['training']} {lacks} (every writer records it in each event): the record "
            "is damaged or older; restore it from a copy"
        )
    return events


def trainings(events: Iterable[Mapping]) -> list[dict]:
    """One dict per training id, in order of first event: its identity (latest value of
    each key), ``start_step`` (earliest), ``finished``, ``steps`` (largest finished count,
    else ``steps_planned``), ``retrain`` (any event), ``time`` (latest)."""
    merged: dict[str, dict] = {}
    for event in events:
        entry = merged.setdefault(event["training"], {"finished": False, "retrain": False})
        for key, value in event.items():
            kept = key in entry and (value is None or key == "start_step")
            if key not in ("event", "steps", "retrain") and not kept:
                entry[key] = value
        entry["retrain"] = entry["retrain"] or bool(event.get("retrain"))
        entry["finished"] = entry["finished"] or event["event"] in ("finished", "republished")
        if event["event"] == "finished" and isinstance(event.get("steps"), int):
            entry["finished_steps"] = max(event["steps"], entry.get("finished_steps", 0))
    for entry in merged.values():
        steps = entry.pop("finished_steps", None)
        entry["steps"] = entry.get("steps_planned") if steps is None else steps
    return list(merged.values())


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def mechanisms(trainings: Iterable[Mapping]) -> list[tuple[float, float, int]]:
    """(q, noise multiplier, steps) of each accounted training, as ``composed_epsilon`` takes."""
    return [(float(t["q"]), float(t["noise_multiplier"]), int(t["steps"])) for t in trainings]


def overflow_delta(terms: Iterable[tuple[int, float | None]], epsilon: float) -> float | None:
    """The Poisson overflow's charge to δ of trainings composed at ``epsilon``:
    (1 + e^ε)·Σ T_i·p_i over ``terms`` (steps T_i, per-step overflow probability p_i: the
    ledger's, for its data plus one record, a bound for every neighbour that removes records
    it held). The coupling of ``privacy.sampler.PoissonSampler`` over all steps of all
    trainings (a union bound); None when a p_i is unknown."""
    total = 0.0
    for steps, p in terms:
        if not _number(p):
            return None
        total += int(steps) * float(p)
    return (1 + math.exp(min(epsilon, 700))) * total


def overflow_terms(trainings: Iterable[Mapping]) -> list[tuple[int, float | None]]:
    """(steps, ``overflow_probability``) of each training of the record or the store."""
    return [(t["steps"], t.get("overflow_probability")) for t in trainings]


def accounted(training: Mapping) -> bool:
    """Whether the record holds what :func:`composed` needs of it (:data:`MECHANISM`)."""
    return all(_number(training.get(k)) for k in MECHANISM)


def output_folders(training: Mapping, record_dir: str | os.PathLike) -> set[str]:
    """Every folder a recorded training's output may lie in now: ``out``, ``out_rel``
    against ``record_dir``, ``out_cwd`` against the working folder."""
    found = {str(training["out"])} if training.get("out") else set()
    if training.get("out_rel"):
        found.add(os.path.normpath(Path(record_dir).resolve() / training["out_rel"]))
    if training.get("out_cwd"):
        found.add(os.path.normpath(Path.cwd().resolve() / training["out_cwd"]))
    return found


def output_folder(training: Mapping, record_dir: str | os.PathLike) -> str:
    """The folder a recorded training wrote, as it lies now (``out_rel`` resolved against
    ``record_dir``, else ``out``)."""
    if training.get("out_rel"):
        return os.path.normpath(Path(record_dir).resolve() / training["out_rel"])
    return str(training["out"])


def finished_into(record_files: Iterable[str | os.PathLike], out: str | os.PathLike) -> list[dict]:
    """The finished DP trainings in ``record_files`` that wrote into ``out``
    (:func:`output_folders`), oldest first."""
    out = os.path.normpath(Path(out).resolve())
    found = [
        t
        for path in map(Path, record_files)
        if path.is_file()
        for t in trainings(read(path))
        if t["finished"] and t.get("private") and out in output_folders(t, path.parent)
    ]
    return sorted(found, key=lambda t: t["time"])


def _events(record_dir: str | os.PathLike, fingerprint: str) -> list[dict]:
    path = record_file(record_dir, fingerprint)
    return read(path) if path.is_file() else []


def source_trainings(record_dir: str | os.PathLike, fingerprint: str) -> list[dict]:
    """The trainings recorded for one data source (none if it has no record yet)."""
    return trainings(_events(record_dir, fingerprint))


def started_ids(record_dir: str | os.PathLike, fingerprint: str) -> set[str]:
    """The ids of the trainings whose ``started`` event the source's record holds."""
    return {e["training"] for e in _events(record_dir, fingerprint) if e["event"] == "started"}


def composed(records: list[Mapping], delta: float | None = None) -> dict:
    """ε of every DP training in ``records`` (``private``, each with its :data:`MECHANISM`,
    as :func:`read` ensures; unfinished ones at their planned steps), RDP-composed at the
    largest δ any claims, or ``delta`` if larger (None when there is none); ``delta_total``
    adds the Poisson overflow's charge (:func:`overflow_delta`)."""
    private = [t for t in records if t["private"]]
    delta = max([float(t["delta"]) for t in private] + [delta or 0.0]) if private else None
    eps = None
    if private:
        # at use: every Snakemake start imports this module (common.smk); scipy costs seconds
        from dpsinkhorn.privacy.accounting import composed_epsilon

        eps = composed_epsilon(mechanisms(private), delta)
    return {
        "trainings": len(private),
        "finished": sum(bool(t["finished"]) for t in private),
        "unfinished": sum(not t["finished"] for t in private),
        "retrained": sum(bool(t.get("retrain")) for t in private),
        "delta": delta,
        "epsilon_composed": eps,
        "delta_total": None
        if eps is None
        else _plus(delta, overflow_delta(overflow_terms(private), eps)),
    }


def _plus(delta: float, charge: float | None) -> float | None:
    return None if charge is None else delta + charge


def _latest(found: list[dict]) -> dict | None:
    """The last of ``found`` by time (of equal times, the last listed), or None."""
    return sorted(found, key=lambda t: t["time"])[-1] if found else None


def _secret_dp_into(record_dir: str | os.PathLike) -> list[dict]:
    """Every finished secret-key DP training under ``record_dir``."""
    return [
        t
        for path in sorted(Path(record_dir).glob("*.jsonl"))
        for t in trainings(read(path))
        if t["finished"] and t.get("private") and not t.get("reproducible")
    ]


def finished_copy_dir(record_dir: str | os.PathLike, out: str) -> Path:
    """Where the last finished DP release into ``out`` (absolute) is kept, to publish it
    again when a scheduler removed the outputs: private side,
    ``<record_dir>/finished/<first 16 hex digits of sha256(out)>/``."""
    return Path(record_dir) / "finished" / hashlib.sha256(out.encode()).hexdigest()[:16]


def last_finished(
    record_dir: str | os.PathLike, out: str, fingerprint: str, spec: Mapping
) -> dict | None:
    """The last finished DP training (reproducible or not) into ``out`` on this data source,
    if its settings equal ``spec``; else None. What a lost release is recovered from."""
    last = _latest(
        [
            t
            for t in source_trainings(record_dir, fingerprint)
            if t["finished"] and t.get("private") and t.get("out") == out
        ]
    )
    return None if last is None or changed_settings(last["spec"], spec) else last


def changed_settings(before: Mapping, now: Mapping) -> list[str]:
    """The keys whose values differ between two settings dicts, sorted."""
    return sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))


def _refusal(
    record_dir, out: str, experiment: str, done: Mapping, changed: list[str]
) -> RetrainRefused:
    # Whether the training data changed is not said (its record's key against the
    # fingerprint): a bit computed from the private data, and this message goes to a log.
    what = (
        f"settings {', '.join(changed)}"
        if changed
        else "not its settings: its release was removed, its inputs rewritten (e.g. the "
        "prepared data prepared again) or its training data changed"
    )
    return RetrainRefused(
        f"{out}: experiment {experiment} finished a DP training on {done['time']} "
        f"(epsilon {done.get('epsilon', float('nan')):.4g}); since then changed: "
        f"{what}. Training again draws new noise from the same private data: "
        f"pass --retrain (CLI), {RETRAIN_ENV}={experiment} (workflow) or "
        "retrain=True (api.train) to do it; the training record in "
        f"{record_dir} counts it"
    )


def refuse_changed_settings(
    record_dir: str | os.PathLike, planned: Iterable[tuple[str, str, Mapping]]
) -> None:
    """Refuse (:class:`RetrainRefused`) a workflow before it runs when one of ``planned``
    (experiment, absolute output folder, settings now) finished a secret-key DP training
    with other settings, unless ``DPSINKHORN_RETRAIN`` names it (Snakemake would remove
    the finished outputs before the job's :func:`check_retrain` refused)."""
    finished = _secret_dp_into(record_dir)
    for experiment, out, spec in planned:
        done = _latest([t for t in finished if out in output_folders(t, record_dir)])
        if done is None or retrain_allowed(experiment):
            continue
        changed = changed_settings(done["spec"], spec)
        if changed:
            raise _refusal(record_dir, out, experiment, done, changed)


def retrain_allowed(experiment: str) -> bool:
    """Whether ``DPSINKHORN_RETRAIN`` (``all`` or a comma-separated list) names it."""
    names = {n.strip() for n in os.environ.get(RETRAIN_ENV, "").split(",")}
    return "all" in names or experiment in names


def check_retrain(
    record_dir: str | os.PathLike, out: str, experiment: str, spec: Mapping, retrain: bool
) -> bool:
    """Refuse (:class:`RetrainRefused`) a training from step 0 into ``out`` when the record
    holds a finished secret-key DP training into it, unless ``retrain``. Returns whether
    this training retrains a finished one."""
    done = _latest([t for t in _secret_dp_into(record_dir) if out in output_folders(t, record_dir)])
    if done is None or retrain:
        return done is not None
    raise _refusal(record_dir, out, experiment, done, changed_settings(done["spec"], spec))
