"""The run-directory contract that training writes and the grid, callbacks and analysis read:

    <run_dir>/config.yaml          resolved config + provenance (git revision, package version, time,
                                   the layer plan and the parameter counts)
    <run_dir>/status.json          {"state": running|done|failed|interrupted, "step", "max_steps", "host", "pid",
                                    "slurm_job_id", "error"?}
    <run_dir>/.lock                the one writer of the directory (host, pid, SLURM job id) while it trains
    <run_dir>/checkpoints/last.ckpt and step_<N>.ckpt (periodic); a checkpoint's step is the one stored in it
    <run_dir>/events.out.tfevents.*  TensorBoard scalars and images (read_events)
    <run_dir>/eval/step_<k>.json   long-context evaluation records (EVAL_KINDS, write_eval_record)
    <run_dir>/eval/heads_step_<k>.json  retrieval-head scores and ablations

A grid keeps its own state in ``<root>/.grid/`` (GRID_DIR), beside its cells' run directories.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, dump_config, read_yaml, validate_config

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
CKPT_DIR = "checkpoints"
LAST_CKPT = "last.ckpt"
EVAL_DIR = "eval"
GRID_DIR = ".grid"  # a grid's state (job records, lock, logs, cell configs) under its root; not a run
# Evaluation record kind -> file name prefix in EVAL_DIR: <prefix><step>.json.
EVAL_KINDS = {"longctx": "step_", "heads": "heads_step_"}
_EVAL_RE = re.compile(rf"^({'|'.join(map(re.escape, EVAL_KINDS.values()))})(\d+)\.json$")
# What training adds to config.yaml's provenance besides git revision, version and time: the layer
# plan (one entry per layer with LAYER_FIELDS) and the parameter counts (PARAM_FIELDS).
LAYERS_KEY, LAYER_FIELDS = "layers", ("layer", "kind", "letter", "window", "pos")
PARAMS_KEY, PARAM_FIELDS = "params", ("embedding", "non_embedding", "total")
LOCK_FILE = ".lock"
DATA_FINGERPRINT = "data_fingerprint"  # a checkpoint's key: the fingerprint of the data it was trained on
CKPT_SUFFIX = ".ckpt"
TMP_SUFFIX = ".tmp"  # temporaries are hidden: .<target name>.<random>.tmp, beside their target
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def temporary_beside(path: Path) -> tuple[int, Path]:
    """A new, uniquely named temporary file in ``path``'s own folder (so that ``os.replace`` onto
    ``path`` is a rename on one filesystem, never a copy): (open descriptor, its path)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.fchmod(fd, 0o666 & ~_UMASK)  # the mode of a plain new file, not mkstemp's 0600
    return fd, Path(tmp)


def fsync_dir(folder: Path) -> None:
    """Makes a rename or a new file in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replaces ``path`` with ``text`` (or bytes) all at once: a unique temporary beside it, fsynced, renamed onto
    it, the folder fsynced. On any failure (or interruption) the temporary is removed and ``path``
    is untouched."""
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
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


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Deletes the temporaries a killed writer left in the run directory (call it holding the lock)."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CKPT_DIR, run_dir / EVAL_DIR):
        if folder.is_dir():
            for path in folder.glob(f".*{TMP_SUFFIX}"):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def read_config_dict(run_dir: Path) -> dict | None:
    """``config.yaml`` as plain data; None without one, a ``ValueError`` naming it when it does not read."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    raw = read_yaml(path.read_text(), path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a YAML mapping; the file is damaged")
    return raw


def write_config(run_dir: Path, cfg: RunConfig, provenance: Mapping) -> None:
    """Writes ``config.yaml``: the resolved config and its ``provenance`` section."""
    write_atomic(Path(run_dir) / CONFIG_FILE, dump_config(cfg, {PROVENANCE_KEY: dict(provenance)}))


def read_run_config(run_dir: Path) -> RunConfig:
    """The run's config as written by ``train`` (provenance dropped)."""
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: no {CONFIG_FILE}; is this a run directory?")
    raw.pop(PROVENANCE_KEY, None)
    return validate_config(raw)


def read_status(run_dir: Path) -> dict | None:
    """``status.json``, or None while it cannot be read. A ``running`` status whose process is gone
    (on this host) reads ``interrupted``: that process was killed without a chance to write."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid, host = int(status.get("pid") or 0), status.get("host")
    if status.get("state") == "running" and host == socket.gethostname() and not _pid_alive(pid):
        status.update(state="interrupted", error=f"killed: its process (pid {pid} on {host}) ended without a word")
    return status


def write_status(run_dir: Path, **fields) -> None:
    write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(fields, indent=1))


def eval_path(run_dir: Path, kind: str, step: int) -> Path:
    """The file of the ``kind`` (``EVAL_KINDS``) evaluation record at ``step``."""
    return Path(run_dir) / EVAL_DIR / f"{EVAL_KINDS[kind]}{step}.json"


def eval_files(run_dir: Path) -> list[tuple[str, int, Path]]:
    """The run's evaluation records as (kind, step, path), sorted by file name; other files skipped."""
    folder = Path(run_dir) / EVAL_DIR
    kinds = {prefix: kind for kind, prefix in EVAL_KINDS.items()}
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _EVAL_RE.match(path.name)
        if match is not None:
            found.append((kinds[match[1]], int(match[2]), path))
    return found


def read_eval_record(path: Path) -> dict | None:
    """An evaluation record, or None while it cannot be read (being written elsewhere: read it next time)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_eval_record(run_dir: Path, kind: str, record: dict, merge: Mapping[str, Sequence[str]] | None = None,
                      derived: Callable[[dict], dict] | None = None) -> Path:
    """Writes (or merges into) the ``kind`` record at ``record["step"]``; returns its path.

    Args:
        run_dir: the run directory.
        kind: a key of ``EVAL_KINDS``.
        record: the new record.
        merge: list field -> the row fields that identify a row: rows of the existing file whose key
            the new record's rows lack are kept, before the new rows. Other fields are replaced.
        derived: fields computed from the merged record (e.g. a score over all rows), set last.
    """
    path = eval_path(run_dir, kind, record["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    merged, merge = dict(record), merge or {}
    old = (read_eval_record(path) or {}) if merge else {}
    for name, keys in merge.items():
        def key(row: dict) -> tuple:
            return tuple(json.dumps(row.get(k)) for k in keys)  # JSON: fields may hold lists; a row may lack some

        new = record.get(name, [])
        replaced = {key(r) for r in new}
        merged[name] = [r for r in old.get(name, []) if key(r) not in replaced] + new
    if derived is not None:
        merged.update(derived(merged))
    write_atomic(path, json.dumps(merged, indent=1))
    return path


def read_events(run_dir: Path, scalars: int = 0):
    """The run's TensorBoard events, loaded: an ``EventAccumulator`` keeping up to ``scalars`` values per
    scalar tag (0 = all; the newest is always kept) and one of every other kind, or None without event
    files. Steps that a resume purged are excluded."""
    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": scalars, "tensors": 1, "images": 1, "histograms": 1,
                                                        "audio": 1, "compressedHistograms": 1})
    tb_log = logging.getLogger("tensorboard")
    level = tb_log.level
    tb_log.setLevel(logging.ERROR)  # a resumed run's purge is expected, not worth a warning here
    try:
        acc.Reload()
    finally:
        tb_log.setLevel(level)
    return acc


def checkpoint_is_complete(path: Path) -> bool:
    """A torch zip checkpoint whose directory (written last) is readable: catches truncation cheaply."""
    try:
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def checkpoint_is_valid(path: Path) -> bool:
    """A torch zip checkpoint whose every member passes its CRC (catches truncation and corruption)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def read_checkpoint_meta(path: Path) -> dict:
    """``{"step", "config", "data"}`` of a checkpoint: its stored global step, the resolved run config
    it was trained with and the fingerprint of its data (None where it has none). Tensors are
    memory-mapped, not read."""
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return {"step": int(ckpt["global_step"]), "config": (ckpt.get("hyper_parameters") or {}).get("config"),
            "data": ckpt.get(DATA_FINGERPRINT)}


def find_resume_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """The newest valid checkpoint of the run as (path, global step), or None when the run has none.

    Every ``*.ckpt`` file of ``checkpoints/`` counts, whatever its name (``last.ckpt``, ``step_*``,
    a ``-vN`` copy of an older version): the newest is the one whose stored step is highest (on a tie
    ``last.ckpt`` first, as it holds the newest callback state). Each is checked (CRC of every member)
    from the newest down; a damaged one is skipped with a warning naming it. When checkpoints exist
    but none is valid, a ``ValueError`` names them rather than let a rerun silently start again.
    """
    folder = Path(run_dir) / CKPT_DIR
    if not folder.is_dir():
        return None
    files = [p for p in folder.iterdir() if p.suffix == CKPT_SUFFIX and not p.name.startswith(".") and p.is_file()]
    steps, damaged = [], []
    for path in files:
        try:
            steps.append((read_checkpoint_meta(path)["step"], path.name == LAST_CKPT, path))
        except Exception:  # any unreadable file: a damaged checkpoint, whatever torch raises
            damaged.append(path)
    for step, _, path in sorted(steps, key=lambda t: (t[0], t[1]), reverse=True):
        if checkpoint_is_valid(path):
            for bad in damaged:
                warnings.warn(f"skipping damaged checkpoint {bad}", stacklevel=2)
            return path, step
        damaged.append(path)
    if damaged:
        names = ", ".join(sorted(p.name for p in damaged))
        raise ValueError(f"{folder}: every checkpoint is damaged ({names}); move them out of the way to train "
                         "this run again from step 0")
    return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _describe_holder(holder: dict) -> str:
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}, since {holder.get('since')}"


class RunLock:
    """One writer per run directory: an exclusive ``flock`` on ``<run_dir>/.lock`` held for the
    whole run, the file naming its holder (host, pid, SLURM job id).

    A second command on a locked directory is refused with a ``ValueError`` naming the holder. A
    holder that is gone is taken over with a message: the OS releases the lock of a dead process, so
    a lock found free is stale whatever its record says; a lock still held by an earlier run of this
    same SLURM job (a requeue whose old node has not released it yet) is taken over too. On a
    filesystem without locks the record alone decides: a dead pid on this host or this
    SLURM job id is stale, anything else refuses. ``acquire`` creates the directory; ``release``
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
        me = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                held = self._try_lock(fd)
                if held and not self._is_current(fd):
                    continue  # the file was replaced meanwhile (a takeover or a release): lock the new one
                holder = self._read_record(fd)
                stale = self._stale(holder, me, held)
                if held is False and stale:
                    print(f"{self.run_dir}: taking over the lock of an earlier run of this job ({_describe_holder(holder)})")
                    self.path.unlink(missing_ok=True)  # it holds a lock on the old file; ours is a new one
                    continue
                if not stale:
                    raise ValueError(f"{self.run_dir} is in use by another command ({_describe_holder(holder)}); "
                                     f"wait for it to end, or use another --run-dir (if that process is gone, delete {self.path})")
                if holder:
                    print(f"{self.run_dir}: taking over a stale lock ({_describe_holder(holder)}; that process is gone)")
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
        if me["slurm_job_id"] and holder.get("slurm_job_id") == me["slurm_job_id"]:
            return True  # an earlier start of this job: SLURM has ended it
        if held is not None:
            return held
        return not holder or (holder.get("host") == me["host"] and not _pid_alive(int(holder.get("pid") or 0)))

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
