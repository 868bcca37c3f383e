"""A token store's folder, and which of its files are the package's.

A folder becomes a store when the package creates it or finds it empty: it then holds ``MARKER``, a
JSON list of every file name the package writes there, each name added before its file is written.
Only the files so listed (and their temporaries, ``fileio.temporary_beside``) are ever removed. A non-empty
folder without the marker is not a store and is refused, so the user's files there (a corpus, notes) stay; a
marker that does not read is refused too, naming it, and nothing in the folder is touched.

Many processes may claim, prepare, fail on and discard one store at once (every cell of a grid starts against
one ``data.store``). Each decision is taken under the store's lock (``claimed``): whether the folder is a store,
someone else's folder, or empty and to be adopted; and a discard, which removes the lock file while holding
it. A process waiting on a lock file that was removed meanwhile finds, once it holds it, that it is no longer
the file at the lock's path, and locks the new one (the folder created again where it was removed too).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hybrid_lightning import fileio
from hybrid_lightning.fileio import LOCK_FILE, TMP_SUFFIX

MARKER = ".hybrid-lightning-store"  # {"files": [names the package wrote in this folder]}
LOCK = LOCK_FILE  # the build lock (an flock), inside the store; the package's, like the marker


def is_store(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    return [p for p in [folder, *folder.parents] if not p.exists()]


def refuse_foreign(folder: Path) -> None:
    """A ``ValueError`` when ``folder`` is a file, a folder that holds files and is not a store, or a store whose
    marker does not read. Its listing is read before its marker, and the marker is created before any other file
    of the package, so a store being claimed meanwhile is never taken for another folder; a store being discarded
    meanwhile may be (``claimed`` decides under the lock)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"data.store: {folder} is a file, not a folder")
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if is_store(folder):
        owned(folder)  # raises, naming the marker, before anything is locked or written
    elif names - {MARKER, LOCK}:
        raise ValueError(f"data.store: {folder} is not empty and is not a token store (it has no {MARKER}); "
                         "give a new or empty folder: the package never writes among files it did not write")


def _lock(folder: Path) -> tuple[int, bool, list[Path]]:
    """(descriptor holding the store's lock, whether this call created the lock file, the folders it created): the
    folder created as needed, the lock file locked and checked to be still the one at its path (a discard removes
    it while holding it)."""
    made: list[Path] = []
    while True:
        made += [p for p in missing_folders(folder) if p not in made]
        folder.mkdir(parents=True, exist_ok=True)
        opened = _open_lock(folder / LOCK)
        if opened is None:  # the folder was discarded meanwhile
            continue
        fd, created = opened
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(folder / LOCK).st_ino == os.fstat(fd).st_ino:
                return fd, created, made
        except FileNotFoundError:
            pass
        os.close(fd)  # a discarded lock file: lock the new one


def _open_lock(path: Path) -> tuple[int, bool] | None:
    """(descriptor, whether it was created now) of the lock file ``path``; None when its folder is gone."""
    for flags in (os.O_CREAT | os.O_EXCL, 0):
        try:
            return os.open(path, os.O_RDWR | flags, 0o644), bool(flags)
        except FileExistsError:
            continue
        except FileNotFoundError:  # its folder, or the lock file between the two tries
            return None
    return None


@contextmanager
def claimed(folder: Path) -> Iterator[list[Path]]:
    """Holds the store's lock with ``folder`` a store: created when absent, adopted when empty (but for the lock),
    refused otherwise (``refuse_foreign``: the lock file and folders this call created are removed first, so that
    someone else's folder is left as it was). Yields the folders this call created, for ``discard``."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"data.store: {folder} is a file, not a folder")
    fd, created, made = _lock(folder)
    try:
        try:
            refuse_foreign(folder)
        except ValueError:
            if created:  # the refusal holds for every process: nobody needs the lock file
                _remove_lock(folder, made)
            raise
        if not is_store(folder):
            fileio.write_atomic(folder / MARKER, json.dumps({"files": []}))
        yield made
    finally:
        os.close(fd)


def _remove_lock(folder: Path, made: list[Path]) -> None:
    """Removes the lock file (held by this process), then the folders in ``made`` that are left empty."""
    (folder / LOCK).unlink(missing_ok=True)
    for path in made:
        try:
            path.rmdir()
        except OSError:  # not empty: something else lives there
            break


def owned(folder: Path) -> set[str]:
    """The names the package wrote in ``folder`` (none for a folder that is not a store); a ``ValueError`` naming
    the marker when it does not read (``fileio.owned``)."""
    return fileio.owned(folder, MARKER)


def own(folder: Path, *names: str) -> None:
    """Lists ``names`` as the package's, before they are written (call it holding the build lock)."""
    have = owned(folder)
    if not set(names) <= have:
        fileio.own(folder, MARKER, have | set(names))


def remove(folder: Path, names) -> None:
    """Deletes those of ``names`` that the package wrote (and their temporaries); others are left."""
    have = owned(folder)
    gone = have & set(names)
    for name in gone:
        (folder / name).unlink(missing_ok=True)
        for tmp in folder.glob(f".{name}.*{TMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)
    if gone:
        fileio.own(folder, MARKER, have - gone)


def discard(folder: Path, made: list[Path]) -> None:
    """Removes the store in ``folder`` (call it inside ``claimed``, before anyone reads it): every file the package
    wrote, its marker, its lock file, then the folders in ``made`` that are left empty."""
    remove(folder, owned(folder))
    (folder / MARKER).unlink(missing_ok=True)
    _remove_lock(folder, made)
