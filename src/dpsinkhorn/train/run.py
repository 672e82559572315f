"""One training run's files and the ``dpsinkhorn train`` command.

Release and workspace. ``<out>/`` receives only what depends on the private data
through the sanitised gradient: generator.pt, privacy.json and train_log.csv (step,
ε spent, steps/s, elapsed time). Checkpoints (with the secret RNG state) and the
optional private-loss log live in ``<out>/private_workspace/`` (:data:`WORKSPACE`),
which is deleted when the run completes unless ``keep_private_workspace: true``.

A checkpoint (model, optimiser, RNG, privacy ledger, log) is written atomically every
``checkpoint_every`` steps and on SIGTERM / SIGUSR1 (exit 75, resubmit) / SIGINT (exit
130, stop; ``train.signals``); rerunning resumes from it, bit-identical on CPU to an
uninterrupted run at the same number of threads (``torch.get_num_threads()``, in
privacy.json). The step itself: ``train.trainer``; K runs in one process:
``train.sweep``, which writes the same files through :class:`RunFiles`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.fileio import (
    NoSpaceError,
    check_samples,
    remove_stale_temps,
    torch_bytes,
    write_all,
    write_bytes,
    write_text,
)
from dpsinkhorn.models import PRECISIONS
from dpsinkhorn.train import memory
from dpsinkhorn.train.runlock import OutputLock
from dpsinkhorn.train.signals import (
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    Preempted,
    StopSignal,
)
from dpsinkhorn.train.trainer import Trainer, spec_hash

# A stop that retrying cannot fix (SIGINT, bad input) leaves this note in the output
# folder; a workflow retry (``--attempt`` > 1) finds it and ends at once.
STOPPED_NAME = ".dpsinkhorn.stopped"
#: train_log.csv (released): nothing computed on the private data.
LOG_COLUMNS = ["step", "epsilon", "steps_per_s", "elapsed_s"]
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
            run.release()
        raise


def _save_checkpoint(
    path: Path, trainer: Trainer, log_rows: list[dict], private_rows: list[dict], digest: str
) -> None:
    state = {
        **trainer.state_dict(),
        "log": log_rows,
        "private_log": private_rows,
        "spec_hash": digest,
    }
    # Serialised in memory, then written: a full disk is an OSError naming the file
    # (io.NoSpaceError), not torch's "basic_ios::clear: iostream error".
    write_bytes(path, torch_bytes(state))


class CheckpointError(ValueError):
    """checkpoint.pt cannot be read (truncated, corrupt, not ours); the message names it."""


def _load_checkpoint(path: Path, device: torch.device) -> dict:
    """Read a checkpoint, or raise ``CheckpointError`` naming the file and what to do."""
    try:
        state = torch.load(path, map_location=device, weights_only=False)
        if not isinstance(state, dict) or not {"step", "model", "spec_hash"} <= set(state):
            raise ValueError("not a dpsinkhorn training checkpoint")
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"checkpoint {path} is damaged and cannot be resumed ({type(err).__name__}: "
            f"{reason}); delete it to train this run again from step 0, or put back a "
            "good copy"
        ) from err
    return state


def _write_log(path: Path, rows: list[dict], columns: list[str] = LOG_COLUMNS) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())


OUTPUT_FILES = ("generator.pt", "privacy.json", "train_log.csv")


class RunFiles:
    """One run's files: the release in ``out_dir``, checkpoints in its private workspace.

    ``out_dir`` gets generator.pt, privacy.json and train_log.csv (no private-data value
    outside the mechanism). ``out_dir/private_workspace/`` (:data:`WORKSPACE`) holds
    checkpoint.pt (model, optimiser, secret RNG state, ledger, logs, ``spec_hash`` with the
    data fingerprint) and, with ``log_private_loss``, private_loss.csv; it is deleted by
    :meth:`finish` unless ``keep_private_workspace``. Shared by :func:`train` (one run)
    and ``dpsinkhorn.train.sweep`` (K runs in one process), so a run writes the same files, and
    resumes from the same checkpoint, either way.
    """

    def __init__(self, trainer: Trainer, out_dir: Path):
        self.trainer, self.spec, self.settings = trainer, trainer.spec, trainer.settings
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # One writer per output folder (runlock): refused here, before anything is read.
        self.lock = OutputLock(self.out_dir).acquire()
        if self.lock.taken_over:
            print(f"{self.out_dir}: taking over the lock of {self.lock.taken_over}, gone")
        self.workspace = self.out_dir / WORKSPACE
        self.workspace.mkdir(parents=True, exist_ok=True)
        readme = self.workspace / "README.txt"
        if not readme.exists():
            write_text(readme, WORKSPACE_README)
        legacy = self.out_dir / "checkpoint.pt"  # where versions before the workspace kept it
        if legacy.exists():  # holds the RNG state: out of the release folder, deleted at the end
            legacy.replace(self.workspace / "legacy_checkpoint.pt")
            print(f"moved {legacy} (not resumable: older format) into {self.workspace}")
        self.ckpt_path = self.workspace / "checkpoint.pt"
        self.digest = spec_hash(self.spec, trainer.fingerprint)
        self.log_private_loss = self.settings.log_private_loss
        # A private-loss log is only useful if kept: log_private_loss keeps the workspace.
        self.keep_workspace = self.log_private_loss or self.settings.keep_private_workspace
        # Temporary files of a writer killed mid-write (SIGKILL); no one else writes here.
        for name in (self.ckpt_path, *(self.out_dir / f for f in OUTPUT_FILES)):
            remove_stale_temps(name)
        self.log_rows: list[dict] = []
        self.private_rows: list[dict] = []
        if self.ckpt_path.exists():
            # On the CPU: model and optimiser state are copied to the trainer's device by
            # load_state_dict; the RNG state must stay a CPU ByteTensor (set_state).
            state = _load_checkpoint(self.ckpt_path, torch.device("cpu"))
            if state.get("spec_hash") == self.digest:
                trainer.load_state_dict(state)
                self.log_rows = state["log"]
                self.private_rows = state.get("private_log", [])
            else:
                # Not printed: job logs are released, and whether the data changed since the
                # checkpoint is a fact about the private data. Noted in the workspace only.
                write_text(
                    self.workspace / "ignored_checkpoint.txt",
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}: ignored the checkpoint at step "
                    f"{state.get('step')}: it belongs to other settings or other training "
                    "data; started afresh\n",
                )
        self.start_step, self.t0 = trainer.step_count, time.perf_counter()

    @property
    def done(self) -> bool:
        return self.trainer.step_count >= self.trainer.total_steps

    def after_step(self, loss: torch.Tensor) -> dict | None:
        """Log every ``log_every`` steps (and the last), checkpoint every ``checkpoint_every``.

        Returns the new (public) log row, if one was written. The private loss is read
        (a device sync) only with ``log_private_loss``, into the workspace.
        """
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
            if self.log_private_loss:
                self.private_rows.append({"step": step, "loss": float(loss)})
        if step % self.settings.checkpoint_every == 0:
            self.checkpoint()
        return row

    def checkpoint(self) -> None:
        self._save()
        _write_log(self.out_dir / "train_log.csv", self.log_rows)

    def _save(self) -> None:
        _save_checkpoint(
            self.ckpt_path, self.trainer, self.log_rows, self.private_rows, self.digest
        )
        if self.log_private_loss:
            _write_log(self.workspace / "private_loss.csv", self.private_rows, PRIVATE_LOG_COLUMNS)

    def release(self) -> None:
        """Give up the output folder's lock (``finish`` does it; also on errors)."""
        self.lock.release()

    def finish(self, remove_workspace: bool = True) -> dict:
        """Write generator.pt, privacy.json, train_log.csv; returns the privacy record.

        Then deletes the private workspace (:meth:`remove_workspace`), unless
        ``remove_workspace`` is false (a sweep removes its members' workspaces when all
        have finished, so a preempted sweep knows which members are done). A workspace
        that stays gets the final checkpoint: a rerun finds every step done and only
        rewrites the outputs.
        """
        try:
            return self._finish(remove_workspace)
        finally:
            self.release()

    def _finish(self, remove_workspace: bool) -> dict:
        trainer = self.trainer
        stays = self.keep_workspace or not remove_workspace
        if stays and (trainer.step_count != self.start_step or not self.ckpt_path.exists()):
            self._save()
        generator = {
            "state_dict": trainer.model.state_dict(),
            "model_config": trainer.model_config.to_dict(),
            "dataset": self.settings.dataset,
            "num_classes": trainer.num_classes,
            "image_shape": list(trainer.image_shape),
            "experiment": self.settings.name,
            "steps": trainer.step_count,
        }
        payload = torch_bytes(generator)  # deterministic bytes (no file name inside)
        record = {
            **trainer.privacy_record(),
            # identifies the released generator; bit-identical reruns need equal threads
            "content_sha256": hashlib.sha256(payload).hexdigest(),
            "threads": torch.get_num_threads(),
        }
        _write_log(self.out_dir / "train_log.csv", self.log_rows)
        commit_release(
            self.out_dir / "generator.pt",
            payload,
            self.out_dir / "privacy.json",
            (json.dumps(record, indent=2) + "\n").encode(),
        )
        if remove_workspace:
            self.remove_workspace()
        return record

    def remove_workspace(self) -> None:
        """Delete the private workspace, unless the config keeps it."""
        if not self.keep_workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)


def commit_release(generator: Path, payload: bytes, ledger: Path, ledger_bytes: bytes) -> None:
    """Write a generator and its privacy ledger so that the generator never exists alone.

    Both are written in full to temporary files first (a full disk fails there, with
    ``fileio.NoSpaceError`` naming the file, and changes nothing); then an older generator
    is removed, the ledger moved into place, and the generator last (``fileio.write_all``).
    """
    write_all([(ledger, ledger_bytes), (generator, payload)], remove_first=[generator])


def train(
    spec: dict,
    out_dir: Path,
    data_dir: Path | None = None,
    device: str = "auto",
    stop_after: int | None = None,
    progress: bool = True,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    precision: str = "fp32",
) -> dict:
    """Train one experiment into ``out_dir``; returns the privacy record.

    The private data is ``<data_dir>/<dataset>/train.npz``, or ``train_data`` =
    (images uint8 [N,28,28] or [N,28,28,C], labels int64 [N]) for your own data.
    Writes generator.pt, privacy.json and train_log.csv; checkpoints go to
    ``out_dir/private_workspace/``, deleted on completion unless ``keep_private_workspace``
    (then the final checkpoint lets a finished run rerun in seconds). ``stop_after`` ends
    this process after that many new steps (with a checkpoint), as a preemption would; it raises
    ``Preempted``. ``cuda_graphs`` replays the step from a CUDA graph (CUDA devices only,
    see ``GraphedStep``); ``compile_solver`` runs the Sinkhorn iterations through
    ``torch.compile`` (``ot._compiled_iterations``); ``precision`` is the generator's
    arithmetic (``models.GeneratorPrecision``: fp32, tf32, bf16).
    """
    images, labels = load_train_data(spec, data_dir, train_data)
    device = resolve_device(device)
    trainer = Trainer(spec, images, labels, device, cuda_graphs, compile_solver, precision)
    run = RunFiles(trainer, out_dir)
    bar = tqdm(
        total=trainer.total_steps,
        initial=run.start_step,
        desc=spec["name"],
        disable=not progress,
        mininterval=1.0,
    )
    with StopSignal() as stop, released_on_error([run]):
        while not run.done:
            loss = trainer.step()
            bar.update(1)
            row = run.after_step(loss)
            if row is not None:  # ε only: nothing computed on the private data
                bar.set_postfix(eps=f"{row['epsilon']:.3g}")
            new_steps = trainer.step_count - run.start_step
            if not run.done and stop.should_stop(new_steps, stop_after):
                run.checkpoint()
                bar.close()
                where = f"checkpoint at step {trainer.step_count} in {run.ckpt_path}"
                raise stop.preempted(stop_after, where)
    bar.close()
    return run.finish()


def load_train_data(
    spec: dict, data_dir: Path | None, train_data: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The experiment's private training split (prepared npz or given arrays), checked."""
    if train_data is None:
        if data_dir is None:
            raise ValueError("give data_dir (prepared datasets) or train_data (arrays)")
        train_data = data.load_split(Path(data_dir), spec["dataset"], "train")
    images, labels = train_data
    check_samples(np.asarray(images), np.asarray(labels), "train_data")
    return images, labels


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train one experiment of a config")
    p.add_argument("--experiment", required=True)
    p.add_argument("--out", required=True, help="output folder (results/<run>/<experiment>)")
    add_training_arguments(p)
    p.set_defaults(handler=_cli)


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``dpsinkhorn train`` and ``dpsinkhorn train-sweep``."""
    p.add_argument("--config", nargs="+", required=True, help="config YAML file(s)")
    p.add_argument("--device", help="override the config's device (auto, cpu, cuda, cuda:N)")
    p.add_argument("--data-dir", help="override the config's data_dir")
    p.add_argument("--stop-after", type=int, help="checkpoint and exit after this many steps")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="replay the training step from a CUDA graph (CUDA only; default: config key "
        "cuda_graphs)",
    )
    p.add_argument(
        "--compile-solver",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the Sinkhorn iterations (default: config key compile_solver)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the generator's arithmetic while training (config key precision)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--attempt",
        type=int,
        default=1,
        help="Snakemake's attempt number: a retry (> 1) after a stop that a retry cannot "
        "fix (SIGINT, exit 130; bad input, exit 2) ends at once with the same code",
    )


#: How a command trains: ``(specs, out_dirs, data_dir, **options) -> privacy records``,
#: :func:`train_runs` (``dpsinkhorn train``) or ``sweep.train_sweep`` (``train-sweep``).
TrainFn = Callable[..., list[dict]]


def train_runs(
    specs: Sequence[dict], out_dirs: Sequence[Path], data_dir: Path | None = None, **options
) -> list[dict]:
    """:func:`train` each of ``specs`` into ``out_dirs[k]``, one after another; returns
    their privacy records (``options``: those of :func:`train`)."""
    if len(specs) != len(out_dirs):
        raise ValueError(f"{len(specs)} experiments but {len(out_dirs)} output folders")
    return [
        train(spec, out, data_dir, **options) for spec, out in zip(specs, out_dirs, strict=True)
    ]


def run_training_cli(
    command: str,
    args: argparse.Namespace,
    cfg: dict,
    train_fn: TrainFn,
    specs: Sequence[dict],
    outs: Sequence[Path],
) -> int:
    """Call ``train_fn(specs, outs, data_dir, ...)`` with the CLI options over the loaded
    config ``cfg``; print each privacy record. The one path of both training commands.

    Returns 0, or PREEMPTED_EXIT_CODE (75) after a signal or ``--stop-after`` checkpoint,
    INTERRUPTED_EXIT_CODE (130) after SIGINT (checkpoint written too).
    """
    markers = [Path(d) / STOPPED_NAME for d in outs]
    if args.attempt > 1:  # a workflow retry: repeat a final stop instead of running again
        for marker in markers:
            if marker.is_file():
                note = json.loads(marker.read_text())
                print(f"dpsinkhorn {command}: not retried: {note['message']}", file=sys.stderr)
                return int(note["exit_code"])
    for marker in markers:
        marker.unlink(missing_ok=True)
    try:
        records = train_fn(
            specs,
            outs,
            Path(args.data_dir or cfg["data_dir"]),
            device=args.device or cfg["device"],
            stop_after=args.stop_after,
            progress=not args.no_progress,
            cuda_graphs=config_lib.cli_or_config(args.cuda_graphs, cfg, "cuda_graphs"),
            compile_solver=config_lib.cli_or_config(args.compile_solver, cfg, "compile_solver"),
            precision=config_lib.cli_or_config(args.precision, cfg, "precision"),
        )
    except Preempted as stop:
        print(f"dpsinkhorn {command}: {stop}")
        if not stop.interrupted:
            return PREEMPTED_EXIT_CODE  # a scheduler's stop: resubmit and resume
        _final_stop(markers, INTERRUPTED_EXIT_CODE, f"stopped by the user ({stop})")
        return INTERRUPTED_EXIT_CODE
    except (ValueError, FileNotFoundError, KeyError, NoSpaceError) as err:
        if isinstance(err, memory.TooLargeError):  # name the file that set the key
            names = [s["name"] for s in specs]
            where = config_lib.setting_source(args.config, names, err.key)
            err = memory.TooLargeError(err.key, f"{where}: {err}")
        _final_stop(markers, 2, str(err))  # cli.main prints it as one line, exit 2
        raise err
    for record in records:
        print(json.dumps({k: record.get(k) for k in ("experiment", "steps", "epsilon")}))
    return 0


def _final_stop(markers: list[Path], exit_code: int, message: str) -> None:
    """Note in each output folder that this run ended in a way a retry cannot fix."""
    for marker in markers:
        write_text(marker, json.dumps({"exit_code": exit_code, "message": message}) + "\n")


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)  # loaded and validated once per command
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to train")
    return run_training_cli("train", args, cfg, train_runs, [spec], [Path(args.out)])
