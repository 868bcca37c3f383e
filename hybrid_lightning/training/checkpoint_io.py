"""Checkpoint files that are never half written, also on cluster filesystems.

Lightning's own writer serialises into memory, writes a temporary file in ``$TMPDIR`` and moves it
onto the target: where ``$TMPDIR`` is node-local and the run directory shared, the move is a copy in
place, and nothing is fsynced. ``AtomicCheckpointIO`` writes a temporary beside the target instead
(the same filesystem), checks it, fsyncs it, renames it onto the target and fsyncs the folder. The
serialisation and the check happen at the save; the rename waits for ``commit`` (the trainer
calls it once the step's logs are out), and the fsyncs and the rename, which only wait on the
disk, run in order on one background thread so that a checkpoint costs the training loop no more
than before. Any failure ends the run: the error names the path and the errno, the previous file
stays as it was and the temporary is removed.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from hybrid_lightning.fileio import IOFailure, fsync_dir, temporary_beside
from hybrid_lightning.rundir.checkpoints import checkpoint_is_complete
from hybrid_lightning.training.branch import publish


class CheckpointWriteError(IOFailure):
    """A checkpoint could not be written; the message names the file, the errno and what to do."""

    def __init__(self, path: Path, cause: BaseException):
        os_error = _os_error(cause)
        code = os_error.errno if os_error is not None else errno.EIO
        reason = os_error.strerror if os_error is not None else f"{type(cause).__name__}: {cause}"
        super().__init__(code, path, f"cannot write this checkpoint: {reason}")


def _os_error(e: BaseException | None) -> OSError | None:
    """The ``OSError`` behind ``e`` (torch reports a full disk as a ``RuntimeError`` whose context is one)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno is not None:
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves with ``torch.save`` into ``.<name>.<random>.tmp`` beside ``path`` and checks that the
    zip's directory (written last) reads back and the size is the bytes written. ``commit`` then
    hands the saved files to a background thread which, in order, fsyncs each, renames it onto its
    name with ``os.replace`` and fsyncs the folder; removals of old checkpoints wait their turn in
    the same queue, so an older checkpoint is never deleted before a newer one has its name.
    ``teardown`` drops what was never committed (a run that failed before its step was logged).

    A background failure is raised by the next ``save_checkpoint``, ``remove_checkpoint``,
    ``check`` (called at every step) or ``wait``. ``halt`` stops the writer for a process about to end at once.
    """

    def __init__(self) -> None:
        # (job, cleanup): cleanup runs instead of job once an earlier job has failed
        self._jobs: queue.Queue[tuple[Callable[[], None], Callable[[], None]] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._worker: threading.Thread | None = None
        self._busy = threading.Lock()  # held by the writer thread for each job; ``halt`` takes it for good
        self._halted = False
        self._temporaries: set[Path] = set()  # written or being written, not renamed yet
        self.pending: list[tuple[Callable[[], None], Callable[[], None]]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        self.check()
        path = Path(path)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = temporary_beside(path)
            self._temporaries.add(tmp)
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                written = f.tell()
            if os.path.getsize(tmp) != written or not checkpoint_is_complete(tmp):
                raise OSError(errno.EIO, f"{tmp} does not read back as written")
        except BaseException as e:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
                self._temporaries.discard(tmp)
            if isinstance(e, Exception):
                raise CheckpointWriteError(path, e) from e
            raise  # an interrupt: the temporary is gone, the previous checkpoint untouched
        self.pending.append((lambda: self._rename(tmp, path), lambda: self._drop(tmp)))

    def _drop(self, tmp: Path) -> None:
        tmp.unlink(missing_ok=True)
        self._temporaries.discard(tmp)

    def _rename(self, tmp: Path, path: Path) -> None:
        try:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            self._temporaries.discard(tmp)
            fsync_dir(path.parent)
        except BaseException as e:
            self._drop(tmp)
            raise CheckpointWriteError(path, e) from e

    def remove_checkpoint(self, path) -> None:
        self.check()
        self.pending.append((lambda: Path(path).unlink(missing_ok=True), lambda: None))

    def publish_checkpoint(self, path, folder: Path) -> None:
        """Hard-links ``path`` into ``folder`` once it has its name (``branch.publish``), queued after the checkpoints
        saved before it and before any removal queued after."""
        self.check()
        self.pending.append((lambda: publish(Path(path), folder), lambda: None))

    def commit(self) -> None:
        """Gives the checkpoints saved so far their names (in the background, in order)."""
        for job, cleanup in self.pending:
            self.later(job, cleanup)
        self.pending = []

    def later(self, job: Callable[[], None], cleanup: Callable[[], None] = lambda: None) -> None:
        """Runs ``job`` on the writer thread after the committed checkpoints (e.g. a status update),
        or ``cleanup`` instead if one of them failed: after a failure nothing is renamed or deleted."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="checkpoint-writer", daemon=True)
            self._worker.start()
        self._jobs.put((job, cleanup))

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            try:
                if item is None:  # teardown's
                    return
                job, cleanup = item
                with self._busy:
                    (job if self._error is None and not self._halted else cleanup)()
            except BaseException as e:
                self._error = self._error or e
            finally:
                self._jobs.task_done()

    def halt(self, timeout: float = 30.0) -> None:
        """Stops the writer for good, for a process about to end at once (a second signal): the file operation under
        way finishes (waited for up to ``timeout`` seconds), no other starts, and the temporaries not renamed yet,
        the one being serialised included, are removed. The checkpoints on disk are then the ones a rerun finds.
        Safe from a signal handler on the main thread: the lock it takes is only ever held by the writer thread."""
        self._busy.acquire(timeout=timeout)  # never released: the writer thread waits for the process's end
        self._halted = True
        for tmp in list(self._temporaries):
            tmp.unlink(missing_ok=True)

    def check(self) -> None:
        """Raises the background failure, if there was one."""
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Commits, then waits until every checkpoint has its name and is on disk; raises a failure."""
        self.commit()
        if self._worker is not None:
            self._jobs.join()
        self.check()

    def teardown(self) -> None:
        """Drops the uncommitted checkpoints and stops the writer thread once its queue is done."""
        for _, cleanup in self.pending:
            cleanup()
        self.pending = []
        if self._worker is not None:
            self._jobs.join()
            self._jobs.put(None)
            self._worker.join()
            self._worker = None
