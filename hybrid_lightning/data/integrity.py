"""What makes a token store trustworthy to read: each shard checked against its manifest entry when
first read (``check_shard``), and the store's ``fingerprint``, which a run records and compares on
resume (``check_same_data``), so that a run never continues on other data than it began with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

_FIX = "run `hybrid-lightning data prepare` with the run's config to rebuild the store"


def sha256_file(path: Path) -> str | None:
    """The SHA-256 of a file's bytes; None when it does not read."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def check_shard(path: Path, dtype: np.dtype, sha256: str | None, vocab_size: int | None) -> np.ndarray:
    """The shard at ``path``, memory-mapped, once its SHA-256 is the manifest's and its token ids are
    below ``vocab_size``; else a ``ValueError`` naming it."""
    if sha256 is not None and sha256_file(path) != sha256:
        raise ValueError(f"data.store: shard {path} is damaged (its SHA-256 is not the manifest's); {_FIX}")
    tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise ValueError(f"data.store: shard {path} holds token id {int(tokens.max())}, not below the "
                         f"vocabulary size {vocab_size}; {_FIX}")
    return tokens


def wrong_size(folder: Path, manifest: dict) -> Path | None:
    """The first shard of the store in ``folder`` that is missing or not the size its ``manifest`` says (a
    truncated one), or whose document index is missing or cut short (its header's length beyond the file's), or
    None. Reads the headers only: its cost does not grow with the store."""
    for entry in [*manifest["shards"], manifest["val"]]:
        path, size = Path(folder) / entry["file"], entry["tokens"] * np.dtype(manifest["dtype"]).itemsize
        if entry["tokens"] and (not path.is_file() or path.stat().st_size != size):
            return path
        if entry["tokens"] and not _whole_index(Path(folder) / entry["docs"]):
            return Path(folder) / entry["docs"]
    return None


def _whole_index(path: Path) -> bool:
    """Whether a document index (``.npy``) is there and holds at least the values its header says."""
    try:
        np.load(path, mmap_mode="r")
        return True
    except (OSError, ValueError, EOFError):
        return False


def _digest(blob) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]


def fingerprint(manifest: dict) -> dict:
    """What a run trains on, from its store's manifest: the sources (file names, or the hub dataset),
    the tokenizer, the settings that change the tokens, and the tokens themselves (a digest of every
    shard's SHA-256). Paths and times are left out: the same text moved or touched is the same data."""
    ident = manifest["identity"]
    names = sorted(Path(f[0]).name for f in ident["src"].get("files", []))
    return {
        "sources": ident["src"].get("hub") or (names if len(names) <= 10 else f"{len(names)} files {_digest(names)}"),
        "tokenizer": ident["tok"],
        "settings": {k: ident[k] for k in ("field", "max", "val", "min_doc")},
        "tokens": _digest([[s.get("sha256") for s in manifest["shards"]], manifest["val"].get("sha256")]),
    }


def check_same_data(recorded: dict | None, now: dict) -> None:
    """A ``ValueError`` naming what differs when a run that ``recorded`` a fingerprint meets other data."""
    diff = [k for k in now if recorded is not None and recorded.get(k) != now[k]]
    if diff:
        changes = "; ".join(f"{k}: {recorded.get(k)} -> {now[k]}" for k in diff)
        raise ValueError(f"data: the run was trained on other data (differs in: {', '.join(diff)}; {changes}); "
                         "restore the data it was trained on, or use another --run-dir")
