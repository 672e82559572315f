"""The training record: every training that drew noise from a private data source.

One append-only file per private data source, ``<data_dir>/trainings/<fingerprint>.jsonl``
(:data:`RECORD_DIR`; the Python API on arrays: ``api.train``'s ``record_dir``), keyed by
the source's content (:func:`data_fingerprint` of the training split's arrays, first 16
hex digits), not by a dataset name: every config, run folder and name that trains on the
same records writes to the same file. It lives beside the prepared data, on the private
side (the fingerprint identifies the private data): never inside a run folder, never
published. Each line is one JSON event, written by ``train.workspace.RunFiles``:

Every event carries the training's id and its identity (:data:`IDENTITY`: experiment,
output folder, also relative to the record's folder, settings, the mechanism's public
parameters q, noise multiplier, δ, accountant, ``steps_planned``, ``retrain``), so one
event alone says which training it belongs to:

* ``started``: a training from step 0 (or from a checkpoint of an older version), with
  ``start_step``; ``retrain: true`` when it retrains a finished DP experiment on request
  (:func:`check_retrain`).
* ``resumed``: the same id, continued from its checkpoint (in another process, call or
  machine), with ``start_step``.
* ``finished``: the same id, its step count, ε, and the sha256 of the three files it
  released: ``content_sha256`` (generator.pt), ``ledger_sha256`` (privacy.json) and
  ``train_log_sha256`` (train_log.csv), which ``dpsinkhorn release`` proves a ledger by
  (:func:`finished_into`; records older than these two keys: the release copy the
  training kept, :func:`finished_copy_dir`).

A training that resumes from its checkpoint keeps its id (the checkpoint carries it, and
whether it retrains): one noise stream, one training. A training that never finished
counts at ``steps_planned`` (an upper bound on the steps whose noise it drew).
:func:`trainings` merges the events per id, whichever of them survive (a ``finished``
whose ``started`` was lost is still one finished training of its experiment);
:func:`composed` composes every DP training of a source
(``privacy.accounting.composed_epsilon``, add/remove-one adjacency, RDP) at the largest δ
any of them claims: the cost of every generator those trainings could have released.
A training's output folder is matched as recorded, relative to the record's folder and
relative to the working folder it trained in (:func:`output_folders`), so a working
folder moved, with its record or without it (a GPU window's next call, a copy), still
finds its finished trainings.

No training is dropped. A training none of whose surviving events names its experiment
(written before every event carried the identity: a ``finished`` event of those versions
held only the step count, ε and the generator's hash; or a lone ``republished``) is
*unattributed* (:func:`trainings`, ``attributed: false``). It counts as a DP training
unless its events show it was not one, :func:`composed` gives no composed ε while one
lacks what the composition needs (``unaccounted``), and :func:`check_retrain` refuses a
DP training from step 0 that it could be a retrain of (:func:`unattributed_finished`).
Everything recorded is a public setting or a step count, except the file's name.
Torch-free.
"""

from __future__ import annotations

import hashlib
import json
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
#: What every event carries besides ``event``, ``training`` and ``time``: the training's
#: identity (``train.workspace.RunFiles`` writes them; ``out_rel``: ``out`` relative to the
#: record's folder; ``out_cwd``: relative to the training's working folder, when inside it).
IDENTITY = (
    "experiment",
    "out",
    "out_rel",
    "out_cwd",
    "spec",
    "private",
    "reproducible",
    "q",
    "noise_multiplier",
    "delta",
    "accountant",
    "steps_planned",
    "retrain",
)
#: The events a record holds.
EVENTS = ("started", "resumed", "finished", "republished")
#: Under the record's folder: a copy of each output folder's last finished DP release
#: (:func:`finished_copy_dir`), from which a training whose outputs a scheduler removed
#: is published again instead of trained again (``train.workspace``).
FINISHED_DIR = "finished"


class RetrainRefused(ValueError):
    """A finished DP experiment would be trained again (CLI: exit 2, one line)."""


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 (hex) of the training data: shapes, dtypes and bytes of images and labels.

    Part of the checkpoint's ``spec_hash`` (a resume on other data is refused) and the key
    of the training record. Kept on the private side only (it identifies the private
    dataset): never in a published file."""
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
    """How a message (a log line, an error) names the record file ``path``: by its folder
    only. The file's name is 64 bits of the training data's sha256, with which someone who
    knows every record but one could test which the last one is."""
    return f"the training record in {Path(path).parent}"


def new_training_id() -> str:
    return uuid.uuid4().hex


def append(record_dir: str | os.PathLike, fingerprint: str, event: Mapping) -> Path:
    """Append one event (a JSON line, written and fsynced in one ``write``) to the record."""
    path = record_file(record_dir, fingerprint)
    _append_lines(path, [json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **event})])
    return path


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append ``lines`` to ``path`` in one ``write`` (O_APPEND), fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, "".join(f"{line}\n" for line in lines).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def merge_copy(record_dir: str | os.PathLike, copy: str | os.PathLike) -> Path:
    """Append to ``record_dir/<copy's name>`` the events of ``copy`` (a copy of that record
    file carried elsewhere, e.g. in a GPU window's archive) it does not hold yet, in the
    copy's order; returns the record file. A damaged copy is refused (:func:`read`)."""
    copy = Path(copy)
    path = Path(record_dir) / copy.name
    have = {_key(e) for e in read(path)} if path.is_file() else set()
    new = [json.dumps(e) for e in read(copy) if _key(e) not in have]
    if new:
        _append_lines(path, new)
    return path


def _key(event: Mapping) -> str:
    return json.dumps(event, sort_keys=True)


def read(path: str | os.PathLike) -> list[dict]:
    """The events of one record file (one-line ValueError naming a damaged line: not JSON,
    or not an event with its training's id)."""
    events = []
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
                    "(needs a training id "
                    f"and an event of {', '.join(EVENTS)})"
                )
            events.append(event)
    return events


#: What :func:`composed` needs of a DP training: its mechanism and its step count.
MECHANISM = ("q", "noise_multiplier", "delta", "steps")


def trainings(events: Iterable[Mapping]) -> list[dict]:
    """One dict per training id (in order of its first event): the identity its events
    carry (the latest value of each key), ``start_step`` (the earliest), ``finished``
    (bool), ``steps`` (the largest finished count, else ``steps_planned``, else None),
    ``retrain`` (any event says so), ``time`` (its latest event), ``attributed``.

    Every training is kept. ``attributed`` is false when none of its events names its
    experiment: a ``finished`` event of a version before every event carried the identity
    (it held ``steps``, ``epsilon`` and ``content_sha256`` only) whose ``started`` line is
    lost, or a lone ``republished`` event. Such a training's ``private`` is what its events
    show: recorded if they say; true after a ``republished`` (only a finished DP training
    is published again), or when a noise multiplier or a number ε is recorded; false when
    its ``finished`` event records ``epsilon: null`` (every writer of a ``finished`` event
    writes its ledger's ε, null only in a non-private ledger); else None, unknown, which
    every reader counts as a DP training (:func:`may_be_private`): dropping or guessing it
    could only understate what the data has paid. A ``republished`` event also says the
    training finished."""
    merged: dict[str, dict] = {}
    for event in events:
        tid = event["training"]
        entry = merged.setdefault(tid, {"finished": False, "retrain": False})
        for key, value in event.items():
            if key in ("event", "steps", "retrain") or value is None and key in entry:
                continue
            if key == "start_step" and "start_step" in entry:
                continue
            entry[key] = value
        entry["retrain"] = entry["retrain"] or bool(event.get("retrain"))
        if event["event"] == "finished":
            entry["finished"] = True
            if isinstance(event.get("steps"), int):
                entry["finished_steps"] = max(event["steps"], entry.get("finished_steps", 0))
            if "epsilon" in event:
                entry.setdefault("recorded_epsilons", []).append(event["epsilon"])
        elif event["event"] == "republished":
            entry["finished"] = entry["republished"] = True
    out = []
    for entry in merged.values():
        steps = entry.pop("finished_steps", None)
        entry["steps"] = entry.get("steps_planned") if steps is None else steps
        epsilons = entry.pop("recorded_epsilons", [])
        republished = entry.pop("republished", False)
        entry["attributed"] = "experiment" in entry
        if not entry["attributed"] and "private" not in entry:
            if republished or _number(entry.get("noise_multiplier")) or any(map(_number, epsilons)):
                entry["private"] = True
            elif epsilons and all(e is None for e in epsilons):
                entry["private"] = False
            else:
                entry["private"] = None
        out.append(entry)
    return out


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def may_be_private(training: Mapping) -> bool:
    """Whether a recorded training counts as a DP training: ``private`` true, or unknown
    (None or absent: an unattributed training whose events do not say)."""
    return training.get("private") is not False


def accounted(training: Mapping) -> bool:
    """Whether the record holds what :func:`composed` needs of it (:data:`MECHANISM`)."""
    return all(_number(training.get(k)) for k in MECHANISM)


def output_folders(training: Mapping, record_dir: str | os.PathLike) -> set[str]:
    """Where a recorded training wrote, as any folder it may have moved to: its absolute
    ``out``; ``out_rel`` resolved against ``record_dir`` as it lies now (the run and its
    record moved together); ``out_cwd`` resolved against the current working folder (the
    run's working folder moved without its record, as a GPU window's next call whose data
    folder is elsewhere). Matching any of them refuses more, never less."""
    found = {str(training["out"])} if training.get("out") else set()
    if training.get("out_rel"):
        found.add(os.path.normpath(Path(record_dir).resolve() / training["out_rel"]))
    if training.get("out_cwd"):
        found.add(os.path.normpath(Path.cwd().resolve() / training["out_cwd"]))
    return found


def finished_into(record_files: Iterable[str | os.PathLike], out: str | os.PathLike) -> list[dict]:
    """Every finished DP training that the record files ``record_files`` hold and that
    wrote into the folder ``out`` (any of its :func:`output_folders`), oldest first, each
    with its record's folder as ``record_dir``: what a ledger in ``out`` must have been
    written by. A missing record file holds none."""
    out = os.path.normpath(Path(out).resolve())
    found = []
    for path in map(Path, record_files):
        if not path.is_file():
            continue
        for t in trainings(read(path)):
            if t["finished"] and t.get("private") and out in output_folders(t, path.parent):
                found.append({**t, "record_dir": str(path.parent)})
    return sorted(found, key=lambda t: t["time"])


def output_folder(training: Mapping, record_dir: str | os.PathLike) -> str:
    """The folder a recorded training wrote, as it lies now (``out_rel`` resolved against
    ``record_dir``, else ``out``)."""
    if training.get("out_rel"):
        return os.path.normpath(Path(record_dir).resolve() / training["out_rel"])
    return str(training["out"])


def source_trainings(record_dir: str | os.PathLike, fingerprint: str) -> list[dict]:
    """The trainings recorded for one data source (none if it has no record yet)."""
    path = record_file(record_dir, fingerprint)
    return trainings(read(path)) if path.is_file() else []


def composed(records: list[Mapping]) -> dict:
    """ε of every DP training in ``records`` (:func:`may_be_private`) composed at the
    largest δ any of them claims (unfinished ones at their planned steps); None values
    when there is none.

    ``unattributed``: how many of them no event attributes to an experiment;
    ``unaccounted``: the ids of those whose mechanism or step count the record lacks
    (:func:`accounted`; events of a version before every event carried it). With any of
    those, ``epsilon_composed`` is None: ε unknown, never a composition that leaves a
    training out (their recorded ε, each at a δ the record does not hold, cannot be
    composed with the others), and the summary says so."""
    private = [t for t in records if may_be_private(t)]
    unaccounted = [str(t.get("training")) for t in private if not accounted(t)]
    delta = max((float(t["delta"]) for t in private if accounted(t)), default=None)
    eps = None
    if private and not unaccounted:
        # at use, not at the top: every Snakemake start imports this module (common.smk),
        # and dp-accounting (scipy) would cost it seconds
        from dpsinkhorn.privacy.accounting import composed_epsilon

        mechanisms = [
            (float(t["q"]), float(t["noise_multiplier"]), int(t["steps"])) for t in private
        ]
        eps = composed_epsilon(mechanisms, delta)
    return {
        "trainings": len(private),
        "finished": sum(bool(t["finished"]) for t in private),
        "unfinished": sum(not t["finished"] for t in private),
        "retrained": sum(bool(t.get("retrain")) for t in private),
        "unattributed": sum(not t.get("attributed", True) for t in private),
        "unaccounted": unaccounted,
        "delta": delta,
        "epsilon_composed": eps,
    }


def _finished(record_dir: Path) -> list[tuple[dict, str]]:
    """Every finished secret-key DP training recorded under ``record_dir`` and attributed
    to its experiment, with its record file's key."""
    found = []
    for path in _record_files(record_dir):
        for t in trainings(read(path)):
            if t["finished"] and t["attributed"] and t.get("private") and not t.get("reproducible"):
                found.append((t, path.stem))
    return found


def _record_files(record_dir: Path) -> list[Path]:
    return sorted(record_dir.glob("*.jsonl")) if record_dir.is_dir() else []


def unattributed_finished(record_dir: str | os.PathLike, out: str) -> list[tuple[dict, Path]]:
    """The finished trainings under ``record_dir`` that no event attributes to an
    experiment and that may have been secret-key DP trainings into ``out`` (absolute),
    with their record files: their events do not show them non-private or public-seed,
    and name no output folder, or one that matches ``out`` (:func:`output_folders`).

    Any record file counts, not only that of the data now trained: an attributed
    training into ``out`` on other data is refused too (:func:`check_retrain`), and
    nothing tells on what folder an unattributed one trained."""
    found = []
    for path in _record_files(Path(record_dir)):
        for t in trainings(read(path)):
            if t["attributed"] or not t["finished"] or not may_be_private(t):
                continue
            if t.get("reproducible"):
                continue
            folders = output_folders(t, path.parent)
            if not folders or out in folders:
                found.append((t, path))
    return found


def _last_into(
    finished: list[tuple[dict, str]], record_dir: Path, out: str
) -> tuple[dict, str] | None:
    """The last of ``finished`` that wrote into ``out`` (:func:`output_folders`), or None."""
    last = None
    for found in finished:
        if out in output_folders(found[0], record_dir) and (
            last is None or found[0]["time"] >= last[0]["time"]
        ):
            last = found
    return last


def _finished_into(record_dir: Path, out: str) -> tuple[dict, str] | None:
    """The last finished secret-key DP training into ``out``, and its record's key, or None."""
    return _last_into(_finished(record_dir), record_dir, out)


def finished_copy_dir(record_dir: str | os.PathLike, out: str) -> Path:
    """Where the last finished DP release into ``out`` (absolute) is kept: private side,
    ``<record_dir>/finished/<first 16 hex digits of sha256(out)>/``."""
    return Path(record_dir) / FINISHED_DIR / hashlib.sha256(out.encode()).hexdigest()[:16]


def last_finished(
    record_dir: str | os.PathLike, out: str, fingerprint: str, spec: Mapping
) -> dict | None:
    """The last finished DP training (reproducible or not) into ``out`` on this data source,
    if its settings equal ``spec``; else None. What a lost release is recovered from."""
    last = None
    for t in source_trainings(record_dir, fingerprint):
        if t["finished"] and t["attributed"] and t.get("private") and t.get("out") == out:
            last = t if last is None or t["time"] >= last["time"] else last
    if last is None or _changed_settings(last["spec"], spec):
        return None
    return last


def started_ids(record_dir: str | os.PathLike, fingerprint: str) -> set[str]:
    """The ids of the trainings whose ``started`` event the source's record holds."""
    path = record_file(record_dir, fingerprint)
    events = read(path) if path.is_file() else []
    return {e["training"] for e in events if e.get("event") == "started"}


def _changed_settings(before: Mapping, now: Mapping) -> list[str]:
    return sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))


def _refusal(record_dir, out: str, experiment: str, done: Mapping, what: list[str]) -> str:
    return (
        f"{out}: experiment {experiment} finished a DP training on {done['time']} "
        f"(epsilon {done.get('epsilon', float('nan')):.4g}); since then changed: "
        f"{'; '.join(what)}. Training again draws new noise from the same private data: "
        f"pass --retrain (CLI), {RETRAIN_ENV}={experiment} (workflow) or "
        "retrain=True (api.train) to do it; the training record in "
        f"{record_dir} counts it"
    )


def refuse_changed_settings(
    record_dir: str | os.PathLike, planned: Iterable[tuple[str, str, Mapping]]
) -> None:
    """Refuse (:class:`RetrainRefused`) a workflow before it runs anything when one of
    ``planned`` (experiment, absolute output folder, its settings now) finished a
    secret-key DP training whose settings differ from these, unless ``DPSINKHORN_RETRAIN``
    names it. Snakemake would rerun its job (its params changed) and remove the finished
    outputs before the job's own :func:`check_retrain` refused it. (Other reruns, e.g. of
    rewritten data, are refused by the job: the train rule's outputs are update(), put
    back when the job fails.)"""
    finished = _finished(Path(record_dir))
    for experiment, out, spec in planned:
        found = _last_into(finished, Path(record_dir), out)
        if found is None or retrain_allowed(experiment):
            continue
        done, _ = found
        changed = _changed_settings(done["spec"], spec)
        if changed:
            what = [f"settings {', '.join(changed)}"]
            raise RetrainRefused(_refusal(record_dir, out, experiment, done, what))


def retrain_allowed(experiment: str) -> bool:
    """Whether ``DPSINKHORN_RETRAIN`` (``all`` or a comma-separated list) names it."""
    names = {n.strip() for n in os.environ.get(RETRAIN_ENV, "").split(",")}
    return "all" in names or experiment in names


def check_retrain(
    record_dir: str | os.PathLike,
    out: str,
    experiment: str,
    spec: Mapping,
    fingerprint: str,
    retrain: bool,
) -> bool:
    """Refuse (:class:`RetrainRefused`) a training from step 0 into ``out`` when the record
    holds a finished secret-key DP training into it, unless ``retrain``. Returns whether
    this training retrains a finished one (recorded as ``retrain: true``).

    A finished training that no event attributes (:func:`unattributed_finished`) may be
    this experiment's: the training is refused, and with ``retrain`` it is recorded as a
    retrain. Conservative on purpose: a record that lost who trained cannot show that
    this training is not a second draw of noise for the same release."""
    found = _finished_into(Path(record_dir), out)
    if found is None:
        unknown = unattributed_finished(record_dir, out)
        if not unknown or retrain:
            return bool(unknown)
        done, path = unknown[0]
        raise RetrainRefused(
            f"{out}: experiment {experiment}: {shown(path)} holds "
            f"{len(unknown)} finished training(s) that may have been DP and whose events "
            f"do not say which experiment or folder trained them (training {done['training']}"
            f", finished {done.get('time', 'at an unknown time')}; a version before every "
            "event carried its training's identity); this training could retrain one of "
            f"them, drawing new noise from the same private data: pass --retrain (CLI), "
            f"{RETRAIN_ENV}={experiment} (workflow) or retrain=True (api.train) to train "
            "it as a retrain, counted in the record"
        )
    done, key = found
    if retrain:
        return True
    changed = _changed_settings(done["spec"], spec)
    what = []
    if changed:
        what.append(f"settings {', '.join(changed)}")
    # Whether the training data changed is not said (key != fingerprint[:16]): a bit
    # computed from the private data, and this message goes to a job's log.
    if not what:
        what.append(
            "not its settings: its release was removed, its inputs rewritten (e.g. the "
            "prepared data prepared again) or its training data changed"
        )
    raise RetrainRefused(_refusal(record_dir, out, experiment, done, what))
