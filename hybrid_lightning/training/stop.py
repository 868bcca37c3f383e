"""How a run stopped by a signal ends: the exception ``train`` raises and the command turns into an exit
code, and the immediate end a second signal asks for. Apart from the callbacks so that the command line can
catch it without importing Lightning."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from hybrid_lightning.rundir import RANK_SIGNAL, STATUS_FILE
from hybrid_lightning.rundir.checkpoints import resume_step
from hybrid_lightning.rundir.status import process_status, read_status, write_status

if TYPE_CHECKING:
    from hybrid_lightning.fileio import RunLock
    from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO


class Stopped(BaseException):
    """Training stopped by a signal (SIGTERM, SIGINT); a command exits with 128 + ``signum``."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step = signum, step


def stop_message(signum: int, step: int | None) -> str:
    """The console's line for a run stopped by ``signum``; ``step`` is where a rerun resumes (None: unknown)."""
    where = f" at step {step}" if step is not None else ""
    name = signal.Signals(signum).name
    return f"hybrid-lightning train: stopped by {name}{where}; run the same command again to resume"


class EndAtOnce:
    """What a second signal does: ends the process at once with ``os._exit(128 + signum)``. Raising into whatever
    the first signal's stop is doing instead (a checkpoint being serialised, a lock being taken, the status being
    written) surfaces as a disk error, or leaves a lock held and the process hung.

    Before it exits it halts the checkpoint writer (``AtomicCheckpointIO.halt``: the rename under way finishes,
    nothing else is renamed or removed, the temporaries go), reads the resume point from the checkpoints left on
    disk, writes it to ``status.json`` (rank 0, once the run has a status), says it on stderr and releases the
    run lock; another rank leaves its signal in the run directory, where rank 0 reads it once the collectives
    break (``rank_signal``). Every step only waits on this process's own writer thread, never on a lock the main
    thread could hold, so it is safe inside a signal handler.

    Args:
        run_dir: the run directory.
        max_steps: the run's ``train.max_steps``, for the status.
        lock: the run lock rank 0 holds (None on the other ranks).
    """

    def __init__(self, run_dir: Path, max_steps: int, lock: RunLock | None):
        self.run_dir, self.max_steps, self.lock = Path(run_dir), max_steps, lock
        self.io: AtomicCheckpointIO | None = None  # the trainer's, once it exists

    def __call__(self, signum: int) -> NoReturn:
        try:
            if self.io is not None:
                self.io.halt()
            if self.lock is None:  # another rank: rank 0 learns why it is gone from this file
                with contextlib.suppress(OSError):
                    (self.run_dir / f"{RANK_SIGNAL}{os.getpid()}").write_text(str(signum))
                said = (f"hybrid-lightning train: a rank's process ({os.getpid()}) ended by "
                        f"{signal.Signals(signum).name}")
            else:
                step = resume_step(self.run_dir)
                # a run that wrote nothing yet gets no status, a finished one keeps its own; once the lock is
                # released (the stop already recorded, the process ending) the status is no longer this process's
                if (self.lock.held and (self.run_dir / STATUS_FILE).exists()
                        and (read_status(self.run_dir) or {}).get("state") != "done"):
                    status = process_status("interrupted", step, self.max_steps, error=signal.Signals(signum).name)
                    write_status(self.run_dir, **status)
                said = stop_message(signum, step)
            for stream in (sys.stdout, sys.stderr):  # what the run printed (a log file's buffer) goes out first
                with contextlib.suppress(Exception):  # interrupted inside a write to it: a reentrant call
                    stream.flush()
            os.write(2, f"\n{said}\n".encode())
            if self.lock is not None:
                self.lock.release()
        finally:
            os._exit(128 + signum)


def rank_signal(run_dir: Path, wait: float = 2.0) -> int | None:
    """The signal that ended another rank of the run at once (``EndAtOnce``), None where none did; looked for up to
    ``wait`` seconds (the rank writes it just before it exits). The marks read are removed."""
    deadline = time.monotonic() + wait
    while True:
        marks = sorted(Path(run_dir).glob(f"{RANK_SIGNAL}*"))
        if marks or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    signums = []
    for mark in marks:
        with contextlib.suppress(OSError, ValueError):
            signums.append(int(mark.read_text()))
        mark.unlink(missing_ok=True)
    return max(signums, default=None)


def clear_rank_signals(run_dir: Path) -> None:
    """Removes the marks of ranks of an earlier process (call it holding the run lock, before training starts)."""
    for mark in Path(run_dir).glob(f"{RANK_SIGNAL}*"):
        mark.unlink(missing_ok=True)
