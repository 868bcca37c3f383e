"""A token store's folder, and which of its files are the package's.

A folder becomes a store when the package creates it or finds it empty: it then holds ``MARKER``, a
JSON list of every file name the package writes there, each name added before its file is written.
Only the files so listed (and their temporaries, ``fileio.temporary_beside``) are ever removed. A non-empty
folder without the marker is not a store and is refused, so the user's files there (a corpus, notes) stay; a
marker that does not read is refused too, naming it, and nothing in the folder is touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hybrid_lightning import fileio
from hybrid_lightning.fileio import LOCK_FILE, TMP_SUFFIX

MARKER = ".hybrid-lightning-store"  # {"files": [names the package wrote in this folder]}
LOCK = LOCK_FILE  # the build lock (filelock), inside the store


def is_store(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    return [p for p in [folder, *folder.parents] if not p.exists()]


def refuse_foreign(folder: Path) -> None:
    """A ``ValueError`` when ``folder`` is a file, a folder that holds files and is not a store, or a store whose
    marker does not read."""
    if is_store(folder):
        owned(folder)  # raises, naming the marker, before anything is locked or written
        return
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"data.store: {folder} is a file, not a folder")
    if any(p.name != MARKER for p in folder.iterdir()):
        raise ValueError(f"data.store: {folder} is not empty and is not a token store (it has no {MARKER}); "
                         "give a new or empty folder: the package never writes among files it did not write")


def claim(folder: Path) -> None:
    """Makes ``folder`` a store: created when absent, adopted when empty, refused otherwise
    (``refuse_foreign``). Two processes may claim it at once (the marker is created exclusively,
    never overwritten)."""
    if is_store(folder):
        return
    refuse_foreign(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # another process claimed it meanwhile
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"files": []}))


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
    """Removes the store in ``folder``: every file the package wrote, its lock and marker, then the
    folders in ``made`` (``missing_folders`` before it was created) that are left empty."""
    if not is_store(folder):
        return
    remove(folder, owned(folder))
    for name in (LOCK, MARKER):
        (folder / name).unlink(missing_ok=True)
    for path in made:
        try:
            path.rmdir()
        except OSError:  # not empty: something else lives there
            break
