"""The files of a token store's shards (data/store.py): a unit's training and validation tokens and
document lengths with their SHA-256, the shard record written after them, the finished shards a killed
prepare resumes from, and the joining of files into the store's validation stream."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from hybrid_lightning.config import DataConfig
from hybrid_lightning.data.integrity import sha256_file
from hybrid_lightning.data.store_folder import own, owned, remove
from hybrid_lightning.fileio import write_atomic_with

GOLDEN = 0.6180339887498949  # documents i with frac(i * GOLDEN) < val_fraction are held out: evenly spread
COPY_TOKENS = 1 << 24  # tokens per chunk when files are joined


def finished_shards(folder: Path, plan_id: str) -> list[dict]:
    """Records of the finished units 0..k-1 of this plan whose files match their checksums; every
    other file of an earlier attempt is removed."""
    records: list[dict] = []
    while True:
        path = folder / f"shard_{len(records):05d}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            break
        if record.get("plan") != plan_id or not all(
            sha256_file(folder / name) == digest for name, digest in record["sha256"].items()
        ):
            break
        records.append(record)
    keep = {name for r in records for name in r["sha256"]} | {f"shard_{k:05d}.json" for k in range(len(records))}
    remove(folder, owned(folder) - keep)
    return records


def write_with(path: Path, write) -> None:
    """Writes ``path`` through ``write(f)`` all at once (``fileio.write_atomic_with``); the name is listed as the
    store's (data/store_folder.own) before anything is written."""
    own(path.parent, path.name)
    write_atomic_with(path, write)


def write_shard(folder: Path, k: int, tokens: np.ndarray, lengths: np.ndarray, doc0: int, train0: int,
                 cfg: DataConfig, dtype: np.dtype, plan_id: str) -> dict:
    """Splits unit k (documents doc0, doc0 + 1, ... of the corpus) into training and validation
    documents, cuts it where the training tokens reach ``data.max_tokens``, and writes its files and
    then its record."""
    is_val = (np.arange(doc0, doc0 + lengths.size) * GOLDEN) % 1.0 < cfg.val_fraction
    last = False
    if cfg.max_tokens is not None:
        reached = np.flatnonzero((train0 + np.cumsum(np.where(is_val, 0, lengths)) >= cfg.max_tokens) & ~is_val)
        if reached.size:  # the document that reaches the cap is cut; none after it is read
            j, last = int(reached[0]), True
            lengths, is_val = lengths[: j + 1].copy(), is_val[: j + 1]
            lengths[j] = cfg.max_tokens - train0 - int(lengths[:j][~is_val[:j]].sum())
            tokens = tokens[: int(lengths.sum())]
    digests, counts = {}, {}
    for split, docs in (("train", ~is_val), ("val", is_val)):
        name = f"{split}_{k:05d}"
        digests[f"{name}.bin"], counts[split] = write_tokens(folder / f"{name}.bin", tokens, token_runs(lengths, docs))
        write_with(folder / f"{name}.docs.npy", lambda f, a=lengths[docs]: np.save(f, a))
        digests[f"{name}.docs.npy"] = sha256_file(folder / f"{name}.docs.npy")
    record = {"unit": k, "plan": plan_id, "docs": int(lengths.size), "train_tokens": counts["train"],
              "val_tokens": counts["val"], "last": last, "sha256": digests}
    write_with(folder / f"shard_{k:05d}.json", lambda f: f.write(json.dumps(record).encode()))
    return record


def token_runs(lengths: np.ndarray, docs: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) token ranges of the runs of consecutive documents selected by ``docs``."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    edges = np.flatnonzero(np.diff(np.concatenate([[0], docs.astype(np.int8), [0]])))
    return [(int(starts[a]), int(ends[b - 1])) for a, b in zip(edges[::2], edges[1::2])]


def write_tokens(path: Path, tokens: np.ndarray, runs: list[tuple[int, int]]) -> tuple[str, int]:
    """Writes the token ranges ``runs`` one after another, without copying them; (SHA-256, tokens)."""
    digest = hashlib.sha256()

    def write(f) -> None:
        for a, b in runs:
            view = memoryview(tokens[a:b]).cast("B")
            f.write(view)
            digest.update(view)

    write_with(path, write)
    return digest.hexdigest(), sum(b - a for a, b in runs)


def join(folder: Path, names: list[str], dtype: np.dtype, out: Path, start: int = 0, stop: int | None = None) -> None:
    """Writes tokens [start, stop) of the concatenation of the files ``names`` to ``out``, chunk by chunk."""
    def write(f) -> None:
        offset = 0
        for name in names:
            arr = (np.memmap(folder / name, dtype=dtype, mode="r") if (folder / name).stat().st_size
                   else np.zeros(0, dtype))
            lo, hi = max(start - offset, 0), min((stop if stop is not None else offset + arr.size) - offset, arr.size)
            for s in range(lo, hi, COPY_TOKENS):
                f.write(memoryview(np.ascontiguousarray(arr[s : min(hi, s + COPY_TOKENS)])).cast("B"))
            offset += arr.size

    write_with(out, write)


def split_lengths(lengths: np.ndarray, cut: int) -> tuple[np.ndarray, np.ndarray]:
    """Document lengths of tokens [0, cut) and [cut, end) of a stream; a document across the cut is
    counted in both, each with its own part."""
    ends = np.cumsum(lengths)
    i = int(np.searchsorted(ends, cut, side="left"))  # the document holding token cut - 1
    head, tail = lengths[: i + 1].copy(), lengths[i:].copy()
    if i < lengths.size:
        head[-1] = cut - (int(ends[i - 1]) if i else 0)
        tail[0] = int(ends[i]) - cut
    return head[head > 0], tail[tail > 0]
