"""File I/O that the run directory, the grid, the token store, the checkpoints and every output option share: a
write that replaces its target all at once (``write_atomic``), errors that say what to do (``IOFailure``), the
one-writer lock of a run directory (``RunLock``), and the files the package owns in a folder it shares with a
user (``owned``, ``own``, ``publish``): it writes over, or deletes, only files that its marker there lists."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import psutil

LOCK_FILE = ".lock"  # a run directory's writer lock (RunLock) and a token store's build lock
TMP_SUFFIX = ".tmp"  # temporaries are hidden: .<target name>.<writer's pid>-<random>.tmp, beside their target
# the name of a temporary of ours; the random part is tempfile.mkstemp's (8 of [a-z0-9_])
_TEMPORARY = re.compile(rf"^\.(?P<target>.+)\.(?P<pid>\d+)-[a-z0-9_]{{8}}{re.escape(TMP_SUFFIX)}$")


def temporary_beside(path: Path) -> tuple[int, Path]:
    """A new, uniquely named temporary file in ``path``'s own folder (so that ``os.replace`` onto
    ``path`` is a rename on one filesystem, never a copy): (open descriptor, its path). Its name says
    whose it is: ``.<name>.<pid>-<random>.tmp`` (``stale_temporary``)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}-", suffix=TMP_SUFFIX)
    umask = os.umask(0o022)  # read (and put back) the process's umask now: it may have changed since the import
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # the mode of a plain new file, not mkstemp's 0600
    return fd, Path(tmp)


def stale_temporary(path: Path) -> bool:
    """Whether ``path`` is provably a temporary that a writer of this package left: named as ``temporary_beside``
    names them, by a process no longer alive on this host (a file of any other name, a user's ``.notes.tmp``
    included, is never one). Call it where no writer on another host can be at work (holding a run's lock)."""
    m = _TEMPORARY.match(Path(path).name)
    return m is not None and Path(path).is_file() and not pid_alive(int(m["pid"]))


def refuse_file_for_folder(path: Path, flag: str) -> None:
    """A ``ValueError`` naming ``flag`` when ``path``, or a folder above it, exists as something else than a folder,
    or when no folder can be made in the nearest that exists (tried: a folder made there and removed, the folder's
    times then put back, so that a run directory checked keeps them), before anything is written there."""
    for p in (Path(path), *Path(path).parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise ValueError(f"{flag} {p} is a file where a folder is expected; move it away or give another "
                                 "folder")
            times = p.stat()
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".hybrid-lightning-", dir=p))
            except OSError as e:
                raise ValueError(f"{flag} {path}: nothing can be written in {p} ({e.strerror or e}); give a folder "
                                 "you can write to") from None
            with contextlib.suppress(OSError):  # not the folder's owner: its times move, nothing else
                os.utime(p, ns=(times.st_atime_ns, times.st_mtime_ns))
            return


def fsync_dir(folder: Path) -> None:
    """Makes a rename or a new file in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def overlap(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` are one, or one lies inside the other (after resolving links)."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or a in b.parents or b in a.parents


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replaces ``path`` with ``text`` (or bytes) all at once (``write_atomic_with``)."""
    write_atomic_with(path, lambda f: f.write(text.encode() if isinstance(text, str) else text))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replaces ``path`` all at once with what ``write(f)`` writes to a binary file: a unique temporary beside it,
    fsynced, renamed onto it, the folder fsynced. On any failure (or interruption) the temporary is removed
    and ``path`` is untouched."""
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.filename is None:  # a write's error names no file: name the one written
            raise IOFailure(e.errno, path, e.strerror or str(e)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def owned(folder: Path, marker: str) -> set[str]:
    """The names (paths under ``folder``) the package wrote there, as its ``marker`` file lists them; none without
    one. A ``ValueError`` naming the marker when it does not read: nothing of the folder is then taken for the
    package's."""
    path = Path(folder) / marker
    if not path.is_file():
        return set()
    try:
        names = json.loads(path.read_text())["files"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("not a list of file names")
        return set(names)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} does not read ({type(e).__name__}: {e}); the files in {folder} are left as they are: "
                         "move that folder away (or restore the file) and run again") from None


def own(folder: Path, marker: str, names: set[str]) -> None:
    """Lists ``names`` in ``folder``'s ``marker`` as the package's (before they are written)."""
    write_atomic(Path(folder) / marker, json.dumps({"files": sorted(names)}))


def publish(staging: Path, out: Path, marker: str, flag: str) -> None:
    """Moves the files written into ``staging`` (a folder beside ``out``) into ``out``, each replacing a file of that
    name only if ``out``'s ``marker`` lists it as the package's; files of an earlier publication that this one does
    not hold are removed, other files are left. A name that exists unlisted (or as a link) refuses the whole
    publication first (``ValueError`` naming ``flag`` and the file): nothing is moved then."""
    out = Path(out).resolve()  # a link to a folder: the folder it names, under the same rule
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is a file, not a folder; give a folder")
    new = {p.relative_to(staging).as_posix() for p in Path(staging).rglob("*") if p.is_file()}
    mine = owned(out, marker)
    for name in sorted(new):
        target = out / name
        if target.is_symlink() or (target.exists() and (name not in mine or not target.is_file())):
            raise ValueError(f"{flag} {out}: {name} is there and was not written by hybrid-lightning; give another "
                             "folder (the package never writes over a file it did not write)")
    out.mkdir(parents=True, exist_ok=True)
    own(out, marker, mine | new)
    for name in sorted(new):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(Path(staging) / name, out / name)
    for name in sorted(mine - new):  # an earlier publication's file this one does not have
        (out / name).unlink(missing_ok=True)
    own(out, marker, new)
    fsync_dir(out)


def write_owned(folder: Path, marker: str, name: str, text: str | bytes, flag: str) -> None:
    """Writes ``folder/name`` (``write_atomic``) where it is new or ``folder``'s ``marker`` lists it as the package's;
    a ``ValueError`` naming ``flag`` and the file otherwise."""
    folder = Path(folder)
    mine, target = owned(folder, marker), folder / name
    if target.is_symlink() or (target.exists() and name not in mine):
        raise ValueError(f"{flag} {folder}: {name} is there and was not written by hybrid-lightning; give another "
                         "folder")
    folder.mkdir(parents=True, exist_ok=True)
    if name not in mine:
        own(folder, marker, mine | {name})
    write_atomic(target, text)


def refuse_existing(path: Path, flag: str) -> None:
    """A ``ValueError`` naming ``flag`` when ``path`` exists (or is a link): a file output never replaces one."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise ValueError(f"{flag} {path} exists; give a new path (the package never writes over a file it did not "
                         "write)")


def io_error_hint(code: int | None, path: Path | str | None = None) -> str:
    """What to do about a failed write of ``path`` with errno ``code``."""
    where = f" {path}" if path else ""
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"free space (or quota) on the filesystem of{where}, then rerun the same command to resume"
    if code in (errno.EACCES, errno.EPERM):
        return f"make{where} writable for this user (or use another --run-dir), then rerun the same command"
    if code == errno.EROFS:
        return f"the filesystem of{where} is read-only: use another --run-dir"
    return "check the filesystem, then rerun the same command to resume from the last checkpoint"


class IOFailure(OSError):
    """An ``OSError`` whose message is complete: the path, the reason, the errno and what to do."""

    def __init__(self, code: int, path: Path | str, reason: str):
        name = errno.errorcode.get(code, str(code))
        super().__init__(code, f"{path}: {reason} (errno {code} {name}); {io_error_hint(code, path)}")
        self.filename = str(path)

    def __str__(self) -> str:
        return self.strerror

    @classmethod
    def of(cls, e: OSError) -> IOFailure:
        return e if isinstance(e, IOFailure) else cls(e.errno, e.filename or "?", e.strerror or str(e))


def process_start(pid: int) -> str | None:
    """The process's start time (``psutil``'s creation time, as text), None for a zombie or a process that is gone."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else repr(proc.create_time())
    except psutil.Error:
        return None


def pid_alive(pid: int | None, started: str | None = None) -> bool:
    """Whether process ``pid`` runs on this host and, where its recorded start time ``started`` is given, is the
    same process (a new one reusing the number is not)."""
    now = process_start(pid) if pid and pid > 0 else None
    return now is not None and (started is None or now == started)


# The identity of this process's scheduler job (e.g. ``{"slurm_job_id": "12"}``), set by the executor that started it
# (``set_job_identity``); empty outside a scheduler's job. Recorded in the lock and the run's status.
_JOB_IDENTITY: dict[str, str] = {}


def set_job_identity(identity: Mapping[str, str]) -> None:
    """Records the scheduler job this process runs in (the executor's fields and values, e.g. its job id): a lock
    held under the same identity is an earlier start of this job, which the scheduler has ended (``RunLock``)."""
    _JOB_IDENTITY.clear()
    _JOB_IDENTITY.update(identity)


def owner_identity() -> dict[str, str]:
    """The scheduler job this process runs in (``set_job_identity``), ``{}`` outside one."""
    return dict(_JOB_IDENTITY)


def _same_job(holder: Mapping, me: Mapping) -> bool:
    """Whether the lock's recorded ``holder`` ran in this process's scheduler job."""
    job = {k: v for k, v in me.items() if k in _JOB_IDENTITY}
    return bool(job) and all(holder.get(k) == v for k, v in job.items())


def _describe_holder(holder: dict) -> str:
    job = "".join(f", {k} {v}" for k, v in holder.items() if v and k not in ("host", "pid", "started", "since"))
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}, since {holder.get('since')}"


class RunLock:
    """One writer per run directory: an exclusive ``flock`` on ``<run_dir>/.lock`` held for the
    whole run, the file naming its holder (host, pid, its scheduler job: ``owner_identity``).

    A second command on a locked directory is refused with a ``ValueError`` naming the holder. A
    holder that is gone is taken over with a message: the OS releases the lock of a dead process, so
    a lock found free is stale whatever its record says; a lock still held by an earlier run of this
    same scheduler job (a requeue whose old node has not released it yet) is taken over too. On a
    filesystem without locks the record alone decides: a dead pid on this host or this
    scheduler job is stale, anything else refuses. ``acquire`` creates the directory; ``release``
    removes the directory again when it holds nothing but the lock (a run that failed to start).
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._created = False

    def _is_current(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at the lock's path."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    @staticmethod
    def _read_record(fd: int) -> dict:
        try:
            return json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        self._created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid()),
              **owner_identity()}
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                held = self._try_lock(fd)
                if held and not self._is_current(fd):
                    continue  # the file was replaced meanwhile (a takeover or a release): lock the new one
                holder = self._read_record(fd)
                stale = self._stale(holder, me, held)
                if held is False and stale:
                    print(f"{self.run_dir}: taking over the lock of an earlier run of this job "
                          f"({_describe_holder(holder)})")
                    self.path.unlink(missing_ok=True)  # it holds a lock on the old file; ours is a new one
                    continue
                if not stale:
                    raise self._in_use(holder)
                if holder:
                    print(f"{self.run_dir}: taking over a stale lock ({_describe_holder(holder)}; that process is "
                          "gone)")
                since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                record = json.dumps({**me, "since": since}).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, record, 0)
                os.fsync(fd)
                self._fd, fd = fd, None
                return
            finally:
                if fd is not None:
                    os.close(fd)

    def refuse_live_holder(self) -> None:
        """A preview's check, read without locking (``acquire`` decides under the lock): the refusal of a directory
        in use when its lock names a live process of this host other than this one."""
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return
        if (holder.get("host") == socket.gethostname() and holder.get("pid") != os.getpid()
                and pid_alive(holder.get("pid"), holder.get("started"))):
            raise self._in_use(holder)

    def _in_use(self, holder: dict) -> ValueError:
        return ValueError(f"{self.run_dir} is in use by another command ({_describe_holder(holder)}); wait for it to "
                          f"end, or use another --run-dir (if that process is gone, delete {self.path})")

    @staticmethod
    def _try_lock(fd: int) -> bool | None:
        """True: locked; False: another process holds it; None: this filesystem has no locks."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return False
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise

    @staticmethod
    def _stale(holder: dict, me: dict, held: bool | None) -> bool:
        """Whether the recorded holder is gone (``held`` as from ``_try_lock``)."""
        if _same_job(holder, me):
            return True  # an earlier start of this job: its scheduler has ended it
        if held is not None:
            return held
        return not holder or (holder.get("host") == me["host"]
                              and not pid_alive(int(holder.get("pid") or 0), holder.get("started")))

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (acquired, not yet released)."""
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self._is_current(self._fd):
                self.path.unlink()
        finally:
            os.close(self._fd)  # closing drops the lock
            self._fd = None
        if self._created:
            try:
                self.run_dir.rmdir()  # only if nothing but the lock was ever written
            except OSError:
                pass

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
