"""One run's files while it trains (:class:`RunFiles`): the output folder's lock, and
checkpoints (model, optimiser, the secret RNG state, ledger, logs) and the optional
private-loss log in ``<out>/private_workspace/`` (:data:`WORKSPACE`), deleted when the run
completes unless ``keep_private_workspace: true``. A rerun resumes from the last
checkpoint, bit-identical on CPU at the same number of threads. docs/CONTRACTS.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from dpsinkhorn.config.identity import experiment_spec_of
from dpsinkhorn.fileio import (
    relative_inside,
    remove_stale_temps,
    sha256_of,
    torch_bytes,
    write_bytes,
    write_text,
)
from dpsinkhorn.privacy import record_store, trainings
from dpsinkhorn.train.release import OUTPUT_FILES, commit_release, publish, write_log
from dpsinkhorn.train.runlock import OutputLock
from dpsinkhorn.train.trainer import Trainer, spec_hash

#: private_workspace/private_loss.csv (``log_private_loss: true``): the un-noised loss S.
PRIVATE_LOG_COLUMNS = ["step", "loss"]
#: The folder, inside a run's output folder, that must never be shared.
WORKSPACE = "private_workspace"
WORKSPACE_README = """PRIVATE: DO NOT SHARE OR PUBLISH THIS FOLDER.

It holds training checkpoints (with the secret state of the random generator that drew
the privacy noise and the Poisson samples) and, with log_private_loss, the un-noised
loss on private data. None of it is covered by the (epsilon, delta) guarantee in
../privacy.json. dpsinkhorn deletes it when training completes, unless the config sets
keep_private_workspace: true.
"""


@contextlib.contextmanager
def released_on_error(runs: list[RunFiles]):
    """Release the runs' output-folder locks if the block raises (``finish`` releases
    them otherwise), so a stopped run in this process does not block the next one."""
    try:
        yield
    except BaseException:
        for run in runs:
            run.lock.release()
        raise


def _load_checkpoint(path: Path) -> dict:
    """Read a checkpoint onto the CPU (its RNG state stays a CPU ByteTensor), or raise
    ValueError naming the file (truncated, corrupt, not ours) and what to do."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(state, dict) or not {"step", "model", "spec_hash"} <= set(state):
            raise ValueError("not a dpsinkhorn training checkpoint")
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"checkpoint {path} is damaged and cannot be resumed ({type(err).__name__}: "
            f"{reason}); delete it to train this run again from step 0, or put back a "
            "good copy"
        ) from err
    return state


class WorkspaceRemovalError(ValueError):
    """The private workspace could not be deleted; the message names it (CLI: exit 2)."""


def _intact_release(copy: Path, content_sha256: str | None) -> bool:
    """Whether ``copy`` holds a release whose generator and log match its ledger and whose
    generator is the one the record finished with (``content_sha256``)."""
    try:
        ledger = json.loads((copy / "privacy.json").read_text())
        return (
            content_sha256 is not None
            and ledger.get("content_sha256") == content_sha256
            and sha256_of(copy / "generator.pt") == content_sha256
            and sha256_of(copy / "train_log.csv") == ledger.get("train_log_sha256")
        )
    except (OSError, ValueError):
        return False


class RunFiles:
    """One run's files: the release in ``out_dir`` (``train.release``), and checkpoint.pt
    and, with ``log_private_loss``, private_loss.csv in its private workspace
    (:data:`WORKSPACE`) until :meth:`finish`."""

    def __init__(
        self,
        trainer: Trainer,
        out_dir: Path,
        record_dir: Path | None = None,
        retrain: bool = False,
        store: record_store.RecordStore | None = None,
        images: np.ndarray | None = None,
    ):
        self.trainer, self.settings = trainer, trainer.settings
        # The record store (privacy.record_store) and the images whose fingerprints it keeps.
        self.store, self._images = store, images
        self.out_dir = Path(out_dir)
        self.out = str(self.out_dir.resolve())  # as the training record names it
        self.spec = json.loads(experiment_spec_of(trainer.experiment))
        # One writer per output folder (runlock, creating it): refused before anything is read.
        self.lock = OutputLock(self.out_dir).acquire()
        if self.lock.taken_over:
            print(f"{self.out_dir}: taking over the lock of {self.lock.taken_over}, gone")
        self.workspace = self.out_dir / WORKSPACE
        self.ckpt_path = self.workspace / "checkpoint.pt"
        self.digest = spec_hash(trainer.experiment, trainer.fingerprint)
        self.record_dir = None if record_dir is None else Path(record_dir)
        self.recovered: dict | None = None
        # A private-loss log is only useful if kept: log_private_loss keeps the workspace.
        self.keep_workspace = self.settings.log_private_loss or self.settings.keep_private_workspace
        with released_on_error([self]):
            state = None
            if self.ckpt_path.exists():
                state = _load_checkpoint(self.ckpt_path)
            resumes = state is not None and state.get("spec_hash") == self.digest
            self.training_id = state["training"] if resumes else None
            if resumes:  # it keeps what its checkpoint says
                self.retrain = bool(state["retrain"])
            elif self.record_dir is not None and trainer.sanitizer is not None:
                asked = retrain or trainings.retrain_allowed(self.settings.name)
                # A finished DP training whose outputs were removed (a scheduler's cancel
                # as Snakemake stored them): published again from its copy, not retrained.
                self.recovered = self._recoverable(asked)
                # A training from step 0 into a folder whose DP training finished: refused
                # unless asked for (privacy.trainings), before the workspace is created.
                record = (self.record_dir, self.out, self.settings.name, self.spec, asked)
                self.retrain = self.recovered is None and trainings.check_retrain(*record)
            else:
                self.retrain = False
        self.log_rows: list[dict] = []
        self.private_rows: list[dict] = []
        if self.recovered is not None:
            self.start_step, self.t0 = trainer.step_count, time.perf_counter()
            return
        self.workspace.mkdir(parents=True, exist_ok=True)
        readme = self.workspace / "README.txt"
        if not readme.exists():
            write_text(readme, WORKSPACE_README)
        # Temporary files of a writer killed mid-write (SIGKILL); no one else writes here.
        for name in (self.ckpt_path, *(self.out_dir / f for f in OUTPUT_FILES)):
            remove_stale_temps(name)
        if resumes:
            trainer.load_state_dict(state)
            self.log_rows = state["log"]
            self.private_rows = state["private_log"]
        elif state is not None:
            # Not printed: job logs are released, and whether the data changed since the
            # checkpoint is a fact about the private data. Noted in the workspace only.
            write_text(
                self.workspace / "ignored_checkpoint.txt",
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: ignored the checkpoint at step "
                f"{state.get('step')}: it belongs to other settings or other training "
                "data; started afresh\n",
            )
        self.start_step, self.t0 = trainer.step_count, time.perf_counter()
        if self.record_dir is None:
            return
        if self.training_id is None:
            # The id (and the secret RNG state) reach a checkpoint before the record and
            # before any noise is drawn: a kill from here on resumes this one training.
            self.training_id = trainings.new_training_id()
            self._save()
            self._record("started")
        elif self.training_id not in trainings.started_ids(self.record_dir, trainer.fingerprint):
            self._record("started")  # killed between its first checkpoint and the record
        else:  # every call that draws noise for it says so, in case others are lost
            self._record("resumed")
        self._to_store(finished=False)

    def _identity(self) -> dict:
        """What every record event carries (``privacy.trainings.IDENTITY``)."""
        t, s = self.trainer, self.trainer.sanitizer
        return {
            "experiment": self.settings.name,
            "out": self.out,
            "out_rel": os.path.relpath(self.out, self.record_dir.resolve()),
            "out_cwd": relative_inside(self.out, Path.cwd()),
            "spec": self.spec,
            "private": s is not None,
            "reproducible": t.settings.reproducible,
            "q": t.q,
            "noise_multiplier": None if s is None else s.noise_multiplier,
            "delta": None if t.accountant is None else t.accountant.delta,
            "accountant": None if t.accountant is None else t.accountant.kind,
            "steps_planned": t.releases_planned,  # ledger steps (DP-MERF: its one release)
            # the ledger's poisson_overflow_probability_per_step (DP-MERF: no sampling)
            "overflow_probability": 0.0 if t.sampler is None else t.sampler.overflow_probability,
            "retrain": bool(self.retrain),
        }

    def _recoverable(self, retrain: bool) -> dict | None:
        """The record of the last finished DP training into this folder, on the same data
        and settings, whose release copy (kept by :meth:`finish`) is intact; None if there
        is none, or if a retrain was asked for and the folder holds that release."""
        fingerprint = self.trainer.fingerprint
        done = trainings.last_finished(self.record_dir, self.out, fingerprint, self.spec)
        copy = trainings.finished_copy_dir(self.record_dir, self.out)
        if done is None or not _intact_release(copy, done.get("content_sha256")):
            return None
        held = self.out_dir / "generator.pt"
        if retrain and held.is_file() and sha256_of(held) == done["content_sha256"]:
            return None  # the folder holds it: the retrain asked for is a new one
        return done

    def _record(self, event: str, record: dict | None = None) -> None:
        """Append this training's ``event`` (started, resumed, finished), with its id and
        identity, to the data source's training record."""
        t, record = self.trainer, record or {}
        if event == "finished":
            fields = {
                # the ledger's steps (a DP-MERF run: its one release)
                "steps": t.step_count if t.accountant is None else t.accountant.steps,
                "epsilon": record.get("epsilon"),
                "content_sha256": record.get("content_sha256"),
                # the release's other two files, as written: `dpsinkhorn release` publishes
                # a ledger and a log only if these hashes say its training wrote them
                "train_log_sha256": record.get("train_log_sha256"),
                "ledger_sha256": sha256_of(self.out_dir / "privacy.json"),
            }
        else:
            fields = {"start_step": t.step_count}
        trainings.append(
            self.record_dir,
            t.fingerprint,
            {"event": event, "training": self.training_id, **self._identity(), **fields},
        )

    def _to_store(self, finished: bool) -> None:
        """Put this DP training into the record store (its fingerprints and public
        settings; unfinished: at its planned steps), and the earlier trainings of the same
        data that the event record holds and the store lacks."""
        if self.store is None or self._images is None or self.trainer.sanitizer is None:
            return
        t = self.trainer
        steps = t.accountant.steps if finished else t.releases_planned
        meta = {**self._identity(), "training": self.training_id, "steps": steps}
        meta = record_store.stored_meta({**meta, "finished": finished})
        keys = functools.partial(self.store.fingerprints_of, self._images)  # hashed once
        self.store.put(meta, keys)
        if not finished:
            earlier = trainings.source_trainings(self.record_dir, t.fingerprint)
            record_store.import_record(self.store, earlier, keys)

    @property
    def done(self) -> bool:
        return self.recovered is not None or self.trainer.step_count >= self.trainer.total_steps

    def after_step(self, loss: torch.Tensor) -> dict | None:
        """Log every ``log_every`` steps (and the last), checkpoint every ``checkpoint_every``;
        returns the new (public) log row, if any. The private loss is read (a device sync)
        only with ``log_private_loss``, into the workspace."""
        step, row = self.trainer.step_count, None
        if step % self.settings.log_every == 0 or self.done:
            elapsed = time.perf_counter() - self.t0
            row = {
                "step": step,
                "epsilon": self.trainer.epsilon(),
                "steps_per_s": (step - self.start_step) / max(elapsed, 1e-9),
                "elapsed_s": elapsed,
            }
            self.log_rows.append(row)
            if self.settings.log_private_loss:
                self.private_rows.append({"step": step, "loss": float(loss)})
        if step % self.settings.checkpoint_every == 0:
            self.checkpoint()
        return row

    def checkpoint(self) -> None:
        self._save()
        write_log(self.out_dir / "train_log.csv", self.log_rows)

    def _save(self) -> None:
        state = {
            **self.trainer.state_dict(),
            "log": self.log_rows,
            "private_log": self.private_rows,
            "spec_hash": self.digest,
            "training": self.training_id,  # the training record's id (privacy.trainings)
            "retrain": self.retrain,  # whether it retrains a finished DP experiment
        }
        # Serialised in memory, then written: a full disk is an OSError naming the file
        # (fileio.NoSpaceError), not torch's "basic_ios::clear: iostream error".
        write_bytes(self.ckpt_path, torch_bytes(state))
        if self.settings.log_private_loss:
            write_log(self.workspace / "private_loss.csv", self.private_rows, PRIVATE_LOG_COLUMNS)

    def finish(self, remove_workspace: bool = True) -> dict:
        """Write generator.pt, privacy.json, train_log.csv; returns the privacy record.
        Then deletes the private workspace unless ``remove_workspace`` is false (a sweep
        removes them when all members finished); one that stays gets the final checkpoint."""
        try:
            if self.recovered is not None:
                return self._republish()
            stays = self.keep_workspace or not remove_workspace
            if stays and (
                self.trainer.step_count != self.start_step or not self.ckpt_path.exists()
            ):
                self._save()
            record = publish(self.trainer, self.out_dir, self.log_rows)
            if self.record_dir is not None:
                if self.trainer.sanitizer is not None:  # before the record says finished
                    # The copy kept per output folder (of the last finished), each file
                    # atomically, the ledger last; _republish writes it back.
                    copy = trainings.finished_copy_dir(self.record_dir, self.out)
                    for name in ("train_log.csv", "generator.pt", "privacy.json"):
                        write_bytes(copy / name, (self.out_dir / name).read_bytes())
                self._record("finished", record)
                self._to_store(finished=True)
            if remove_workspace:
                self.remove_workspace()
            return record
        finally:
            self.lock.release()

    def _republish(self) -> dict:
        """Write the kept copy of the finished release into the folder (same bytes, same
        order as ``release.publish``); no step taken, no noise drawn, no new training."""
        copy = trainings.finished_copy_dir(self.record_dir, self.out)
        ledger = (copy / "privacy.json").read_bytes()
        write_bytes(self.out_dir / "train_log.csv", (copy / "train_log.csv").read_bytes())
        commit_release(self.out_dir, (copy / "generator.pt").read_bytes(), ledger)
        done = self.recovered
        print(
            f"{self.out_dir}: published again the finished training {done['training']} of "
            f"{done['time']} (its outputs had been removed); no new training"
        )
        trainings.append(
            self.record_dir,
            self.trainer.fingerprint,
            {"event": "republished", "training": done["training"], "out": self.out},
        )
        return json.loads(ledger)

    def remove_workspace(self) -> None:
        """Delete the private workspace, unless the config keeps it, or raise
        :class:`WorkspaceRemovalError` naming it: it holds the secret noise state,
        uncovered by the guarantee, inside the release folder."""
        if self.keep_workspace or not self.workspace.exists():
            return
        error: OSError | None = None
        try:
            shutil.rmtree(self.workspace)
        except OSError as err:
            error = err
        if error is not None or self.workspace.exists():
            why = f" ({type(error).__name__}: {error})" if error is not None else ""
            raise WorkspaceRemovalError(
                f"could not delete the private workspace {self.workspace}{why}; it holds "
                "private state (checkpoints with the secret noise RNG state) and must be "
                "deleted before the run folder is published"
            ) from error
