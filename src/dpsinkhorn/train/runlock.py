"""One writer per output folder: an exclusive lock held while a run owns the folder.

A second process is refused with ``LockedError`` naming the folder and the holder. The lock
is ``flock`` on ``<out_dir>/.dpsinkhorn.lock``, dropped by the kernel however the holder
exits; the file itself stays (deleting it would let two holders lock two files).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = ".dpsinkhorn.lock"


class LockedError(ValueError):
    """The output folder is held by another live process (a ``ValueError``: the CLI
    prints it as one line and exits 2)."""


def _holder(fh) -> str | None:
    """The holder that the open lock file ``fh`` records, described; None if none."""
    fh.seek(0)
    try:
        holder = json.loads(fh.read() or "{}")
    except ValueError:
        return None
    if not holder:
        return None
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} "
        f"(`{holder.get('command', '?')}`, since {started})"
    )


class OutputLock:
    """Exclusive, non-blocking lock on an output folder. ``taken_over``: the description
    of a dead holder whose lock file was left behind, or None."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fh = None
        self.taken_over: str | None = None

    def acquire(self) -> OutputLock:
        """Take the lock or raise ``LockedError`` naming the folder and the holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 (kept open: the lock lives with it)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fh) or "an unknown process"
            fh.close()
            raise LockedError(
                f"output folder {self.folder} is in use by {holder}; wait for it "
                f"to finish or stop it, or choose another output folder"
            ) from None
        self.taken_over = _holder(fh)  # the lock is ours, so whoever wrote this is gone
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
            "started": time.time(),
        }
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(me) + "\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Clear the holder record and drop the lock (no-op when not held)."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            fh.seek(0)
            fh.truncate()
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def __del__(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file drops the flock
