"""Stopping a training run between steps: signals, ``stop_after`` and the exit codes.

SIGTERM / SIGUSR1 (a scheduler's stop; exit 75) and SIGINT (Ctrl-C; exit 130) set a flag
checked between steps: the step in flight completes and is checkpointed, then
:class:`Preempted`. ``dpsinkhorn train`` blocks SIGTERM / SIGUSR1 from its first line
(``cli.HOLDS_STOP_SIGNALS``) until :class:`StopSignal` unblocks them.
"""

from __future__ import annotations

import signal

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: checkpoint written, rerun to resume
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: checkpoint written; the workflow does not resubmit


class StopSignal:
    """The flag that SIGTERM, SIGUSR1 (SLURM's warning before a time limit) and SIGINT set."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None

    def __enter__(self):
        self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        # a signal held since the command started (cli.main) is delivered here, to _handle
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.SIGNALS)
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def should_stop(self, new_steps: int, stop_after: int | None) -> bool:
        """A signal arrived, or this process has taken ``stop_after`` new steps."""
        return self.received is not None or (stop_after is not None and new_steps >= stop_after)

    def preempted(self, stop_after: int | None, where: str) -> Preempted:
        """The ``Preempted`` to raise: why training stopped and ``where`` its checkpoints
        are; ``interrupted`` when the signal was SIGINT."""
        why = f"signal {self.received}" if self.received is not None else f"stop_after={stop_after}"
        interrupted = self.received == signal.SIGINT
        if interrupted:
            why = "interrupted (SIGINT)"
        return Preempted(f"{why}: {where}; rerun to resume", interrupted)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Preempted(Exception):
    """Training stopped early (signal or ``stop_after``) after writing a checkpoint;
    ``interrupted``: by SIGINT, a user's stop (not a scheduler's)."""

    def __init__(self, message: str, interrupted: bool = False):
        super().__init__(message)
        self.interrupted = interrupted
