"""The token store: a corpus tokenized once, in parallel, into memory-mapped shards.

A store is a folder::

    train_00000.bin  train_00000.docs.npy   training tokens of unit 0 (raw uint16/uint32) and its
    ...                                     documents' lengths (each document ends with the eos id)
    val.bin          val.docs.npy           the validation documents, in corpus order
    shard_00000.json ...                    one record per finished unit (counts, SHA-256 of its files)
    manifest.json                           written last and atomically: the store is whole
    .hybrid-lightning-store                 the marker: the names of the files the package wrote here

Each unit of the sources (``data/corpus.py``) is read and tokenized by a worker process and becomes one shard; the
main process splits it into training and validation documents (document i of the corpus is held out when frac(i x
golden ratio) < ``data.val_fraction``), stops once ``data.max_tokens`` training tokens are reached, and writes the
shard. At most ``workers`` units are in memory at once, whatever the corpus size. A killed prepare resumes from its
finished shards (their checksums verified); a store without a manifest is never read. Only files the package wrote
are ever removed (``data/store_folder.py``); a non-empty folder that is not a store is refused. Each shard's
checksum and token ids are checked when it is first read, so a damaged shard is an error naming it (and ``data
prepare`` rebuilds the store), while opening a store costs the same whatever its size.

The store lives in ``data.store`` when set, else in ``<cache>/store/<fingerprint>``; the
fingerprint covers the source files (path, size, mtime), the tokenizer's hash and every setting
that changes the tokens. Concurrent runs share it: one builds under a file lock, the others wait.
A run records the store's ``fingerprint`` and resumes only on the same data. A store that a run refuses
(too short for its windows, other data than it recorded) is refused before it is published, so a store is
never removed once another process may read it.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from hybrid_lightning.config import DataConfig
from hybrid_lightning.data.corpus import Unit, cache_root, check_sources, hub_units, plan_units, read_unit, source_files
from hybrid_lightning.data.integrity import check_shard, sha256_file, wrong_size
from hybrid_lightning.data.shards import finished_shards, join, split_lengths, write_shard, write_with
from hybrid_lightning.data.store_folder import claimed, discard, is_store, owned, refuse_foreign, remove
from hybrid_lightning.data.tokenizer import load_tokenizer

FORMAT_VERSION = 3  # 3: the folder carries the marker of data/store_folder.py
MANIFEST = "manifest.json"
ENCODE_CHARS = 1 << 20  # characters per batch-encode call inside a worker


class TokenStream:
    """Shards read as one flat token array: ``size``, ``len`` and slicing (a copy only where a slice
    spans two shards), by memory map; O(shards) memory. Pickles as paths (dataloader workers). Each
    shard is checked (``check_shard``) when first read, so the cost of the first batch does not grow
    with the number of shards."""

    def __init__(self, paths: list[Path], sizes: list[int], dtype: str, sha256: list[str | None] | None = None,
                 vocab_size: int | None = None):
        self.paths, self.dtype = [str(p) for p in paths], np.dtype(dtype)
        self.ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        self.size = int(self.ends[-1]) if len(sizes) else 0
        self.sha256, self.vocab_size = sha256 or [None] * len(self.paths), vocab_size
        self._maps: list[np.ndarray | None] = [None] * len(self.paths)

    def _shard(self, i: int) -> np.ndarray:
        if self._maps[i] is None:
            self._maps[i] = check_shard(Path(self.paths[i]), self.dtype, self.sha256[i], self.vocab_size)
        return self._maps[i]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise IndexError("a TokenStream takes contiguous slices only")
        parts = []
        i = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop:
            shard = self._shard(i)
            begin = int(self.ends[i]) - shard.size
            take = min(stop, int(self.ends[i])) - start
            parts.append(shard[start - begin : start - begin + take])
            start += take
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self[:], dtype=dtype)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": [None] * len(self.paths)}


class Store:
    """An opened, whole store: its folder, manifest, training stream and validation array (checked
    when first used)."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder, self.manifest = folder, manifest
        shards, vocab = manifest["shards"], manifest["vocab_size"]
        self.train = TokenStream([folder / s["file"] for s in shards], [s["tokens"] for s in shards], manifest["dtype"],
                                 [s.get("sha256") for s in shards], vocab)
        self._val: np.ndarray | None = None

    @property
    def val(self) -> np.ndarray:
        if self._val is None:
            val, dtype = self.manifest["val"], np.dtype(self.manifest["dtype"])
            self._val = (check_shard(self.folder / val["file"], dtype, val.get("sha256"), self.manifest["vocab_size"])
                         if val["tokens"] else np.zeros(0, dtype))
        return self._val

    def damaged(self) -> str | None:
        """The first file that fails its check (every shard and its document index read now), or None."""
        if (bad := wrong_size(self.folder, self.manifest)) is not None:
            return str(bad)
        for i, path in enumerate(self.train.paths):
            try:
                self.train._shard(i)
            except ValueError:
                return path
        try:
            self.val  # noqa: B018 (the property reads and checks the validation shard: ValueError when damaged)
        except ValueError:
            return str(self.folder / self.manifest["val"]["file"])
        for entry in [*self.manifest["shards"], self.manifest["val"]]:  # stores of format 3 before these digests: none
            if (entry.get("docs_sha256") is not None
                    and sha256_file(self.folder / entry["docs"]) != entry["docs_sha256"]):
                return str(self.folder / entry["docs"])
        return None

    def check_fits(self, seq_len: int) -> None:
        check_fits(self.manifest, seq_len)

    def summary(self) -> str:
        m = self.manifest
        return (f"{self.folder}: {m['train_tokens']:,} training tokens in {len(m['shards'])} shards, "
                f"{m['val']['tokens']:,} validation tokens, {m['documents']:,} documents, tokenizer "
                f"{m['identity']['tok']}")


def check_fits(manifest: dict, seq_len: int) -> None:
    """Both splits of the store ``manifest`` describes must hold at least one window of ``seq_len + 1`` tokens."""
    for name, size in (("training", manifest["train_tokens"]), ("validation", manifest["val"]["tokens"])):
        if size < seq_len + 1:
            raise ValueError(f"data: the {name} split holds {size} tokens, fewer than train.seq_len + 1 = "
                             f"{seq_len + 1}; give more text (data.files) or a shorter train.seq_len")


def identity(cfg: DataConfig, tokenizer_name: str) -> dict:
    """Everything the store's tokens depend on: the sources' fingerprint, the tokenizer, the settings."""
    files = source_files(cfg)
    source = ({"hub": [cfg.hub, cfg.hub_config, cfg.hub_split]} if files is None
              else {"files": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]})
    return {"v": FORMAT_VERSION, "tok": tokenizer_name, "src": source, "field": cfg.text_field,
            "max": cfg.max_tokens, "val": cfg.val_fraction, "min_doc": cfg.min_doc_tokens}


def _digest(blob) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]


def store_folder(cfg: DataConfig, ident: dict) -> Path:
    return Path(cfg.store) if cfg.store else cache_root(cfg) / "store" / _digest(ident)


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0))))


def locate(cfg: DataConfig, tokenizer=None) -> tuple:
    """(tokenizer, identity, folder) of the store of ``cfg``."""
    tok = tokenizer or load_tokenizer(cfg.tokenizer)
    ident = identity(cfg, tok.name)
    return tok, ident, store_folder(cfg, ident)


def read_whole(folder: Path, ident: dict) -> dict | None:
    """The manifest of the whole store in ``folder``, None when there is none (or it is not a store); read without
    the lock, as a whole store is never removed. A store whose marker does not read is refused."""
    manifest = _read_manifest(folder, ident) if is_store(folder) else None
    if manifest is not None:
        owned(folder)  # raises, naming the marker
    return manifest


def _accept(manifest: dict) -> None:
    """The ``check`` of a caller that takes any store."""


def open_store(cfg: DataConfig, build: bool = True, workers: int | None = None, tokenizer=None,
               verify: bool = False, check: Callable[[dict], None] = _accept) -> Store:
    """The whole store for ``cfg``, prepared first when there is none and ``build`` (one process
    builds under a file lock; the others wait and then read it). Opening reads the manifest and
    checks the shards' sizes: its cost does not grow with the store. ``verify`` (``data prepare``):
    every shard is checked now, under the lock, and a damaged store is prepared again.
    ``check(manifest)`` raises a ``ValueError`` for a store the caller refuses: a store this call
    prepares is then removed before any other process can read it."""
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    tok, ident, folder = locate(cfg, tokenizer)
    manifest = None if verify else read_whole(folder, ident)
    if manifest is not None:
        if (bad := wrong_size(folder, manifest)) is not None:
            raise ValueError(f"data.store: {bad} is missing or not the size the manifest says; run "
                             "`hybrid-lightning data prepare` with this config to prepare the store again")
        check(manifest)
        return Store(folder, manifest)
    if not build:
        refuse_foreign(folder)
        raise ValueError(f"data: no token store at {folder}; prepare it with `hybrid-lightning data prepare`")
    return _prepared(cfg, tok, folder, ident, workers or cfg.prepare_workers or default_workers(), check)


def _prepared(cfg: DataConfig, tok, folder: Path, ident: dict, workers: int, check) -> Store:
    """The store in ``folder`` prepared under its lock, unless another process did meanwhile; a damaged
    one is prepared again. On bad input, or a store ``check`` refuses, the store is removed with the
    folders this call created, before its manifest is written."""
    check_sources(cfg)
    with claimed(folder) as made:  # the folder refused, created or adopted under the lock
        manifest = _read_manifest(folder, ident)
        if manifest is not None and (bad := Store(folder, manifest).damaged()) is None:
            check(manifest)
            return Store(folder, manifest)
        if manifest is not None:
            print(f"data: {bad} is damaged; preparing the store again")
            remove(folder, [MANIFEST, *(s["file"] for s in manifest["shards"]), manifest["val"]["file"]])
        try:
            return Store(folder, _prepare(cfg, tok, folder, ident, workers, check))
        except ValueError:  # bad input, or a store the caller refuses: leave nothing behind
            discard(folder, made)
            raise


def _read_manifest(folder: Path, ident: dict) -> dict | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"data.store: {folder / MANIFEST} does not read ({e}); "
                         "delete the folder to prepare it again") from None
    if manifest.get("identity") != ident:
        old = manifest.get("identity", {})
        diff = sorted(k for k in ident.keys() | old.keys() if ident.get(k) != old.get(k))
        raise ValueError(f"data.store: {folder} holds a store for another config (differs in: {', '.join(diff)} "
                         f"[v=format, tok=data.tokenizer, src=the sources, field=data.text_field, max=data.max_tokens, "
                         f"val=data.val_fraction, min_doc=data.min_doc_tokens]); use another data.store or delete it")
    return manifest


_WORKER_TOKENIZERS: dict = {}


def _init_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker process


def tokenize_unit(unit: Unit, tokenizer: str, text_field: str,
                  min_doc_tokens: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, document lengths) of one unit: its kept documents, each followed by the eos id."""
    tok = _WORKER_TOKENIZERS.get(tokenizer) or _WORKER_TOKENIZERS.setdefault(tokenizer, load_tokenizer(tokenizer))
    dtype = token_dtype(tok.vocab_size)
    eos = np.array([tok.eos_id], dtype)
    parts: list[np.ndarray] = []
    lengths: list[int] = []
    batch: list[str] = []
    size = 0

    def flush() -> None:
        for ids in tok.encode_batch(batch):
            if min_doc_tokens is None or ids.size >= min_doc_tokens:
                parts.extend((ids.astype(dtype), eos))
                lengths.append(ids.size + 1)
        batch.clear()

    for text in read_unit(unit, text_field):
        batch.append(text)
        size += len(text)
        if size >= ENCODE_CHARS:
            flush()
            size = 0
    flush()
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return tokens, np.asarray(lengths, np.int64)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


class _InProcess:
    """The executor of one worker: runs each unit in this process when submitted."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _prepare(cfg: DataConfig, tok, folder: Path, ident: dict, workers: int, check) -> dict:
    t0 = time.perf_counter()
    unit_bytes = max(1, int(cfg.shard_mb * 2**20))
    files = source_files(cfg)
    plan = plan_units(files, unit_bytes) if files is not None else None
    plan_id = _digest([ident, plan if plan is not None else unit_bytes])
    records = finished_shards(folder, plan_id)
    units = enumerate(plan if plan is not None else hub_units(cfg, unit_bytes))
    dtype = token_dtype(tok.vocab_size)
    docs = sum(r["docs"] for r in records)
    train = sum(r["train_tokens"] for r in records)
    if not any(r["last"] for r in records):
        for _ in records:  # the finished units
            next(units)
        if plan is not None:  # no more workers than units left
            workers = max(1, min(workers, len(plan) - len(records)))
        gc.freeze()  # forked workers then leave this process's objects alone: no copy-on-write by their GC
        pool = _InProcess() if workers <= 1 else ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_init_worker)
        pending: deque[tuple[int, Future]] = deque()
        try:
            while True:
                while len(pending) < workers and (nxt := next(units, None)) is not None:
                    k, unit = nxt
                    pending.append((k, pool.submit(tokenize_unit, unit, cfg.tokenizer, cfg.text_field,
                                                   cfg.min_doc_tokens)))
                if not pending:
                    break
                k, future = pending.popleft()
                record = write_shard(folder, k, *future.result(), docs, train, cfg, dtype, plan_id)
                records.append(record)
                docs, train = docs + record["docs"], train + record["train_tokens"]
                if record["last"]:
                    break
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            gc.unfreeze()
    return _finalize(cfg, tok, folder, ident, records, dtype, check, time.perf_counter() - t0)


def _finalize(cfg: DataConfig, tok, folder: Path, ident: dict, records: list[dict], dtype: np.dtype, check,
              seconds: float) -> dict:
    """Joins the validation pieces, falls back to a tail split when every document is held out (a
    corpus of one document), and writes the manifest once ``check`` takes it; then drops the pieces."""
    n = len(records)
    val_pieces = [f"val_{k:05d}.bin" for k in range(n)]
    train_tokens, val_tokens = sum(r["train_tokens"] for r in records), sum(r["val_tokens"] for r in records)
    if train_tokens + val_tokens == 0:
        where = (f"data.hub {cfg.hub}" if cfg.hub else f"data.files {list(cfg.files)}" if cfg.files
                 else "the embedded corpus")
        filtered = f" of at least data.min_doc_tokens={cfg.min_doc_tokens} tokens" if cfg.min_doc_tokens else ""
        raise ValueError(f"data: {where} holds no document{filtered}")
    val_lengths = np.concatenate([np.load(folder / f"val_{k:05d}.docs.npy") for k in range(n)])
    if train_tokens == 0:  # every document held out: hold out the tail of the stream instead
        cut = int(val_tokens * (1 - cfg.val_fraction))
        join(folder, val_pieces, dtype, folder / "train_tail.bin", 0, cut)
        join(folder, val_pieces, dtype, folder / "val.bin", cut)
        head, val_lengths = split_lengths(val_lengths, cut)
        write_with(folder / "train_tail.docs.npy", lambda f: np.save(f, head))
        shards = [{"file": "train_tail.bin", "docs": "train_tail.docs.npy", "tokens": cut,
                   "sha256": sha256_file(folder / "train_tail.bin"),
                   "docs_sha256": sha256_file(folder / "train_tail.docs.npy")}]
        train_tokens, val_tokens = cut, val_tokens - cut
    else:
        join(folder, val_pieces, dtype, folder / "val.bin")
        shards = [{"file": f"train_{r['unit']:05d}.bin", "docs": f"train_{r['unit']:05d}.docs.npy",
                   "tokens": r["train_tokens"], "sha256": r["sha256"][f"train_{r['unit']:05d}.bin"],
                   "docs_sha256": r["sha256"][f"train_{r['unit']:05d}.docs.npy"]}
                  for r in records if r["train_tokens"]]
    write_with(folder / "val.docs.npy", lambda f: np.save(f, val_lengths))
    manifest = {
        "identity": ident, "format": FORMAT_VERSION, "dtype": dtype.name, "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id, "documents": sum(r["docs"] for r in records), "units": n, "train_tokens": train_tokens,
        "shards": shards, "val": {"file": "val.bin", "docs": "val.docs.npy", "tokens": val_tokens,
                                  "sha256": sha256_file(folder / "val.bin"),
                                  "docs_sha256": sha256_file(folder / "val.docs.npy")},
    }
    check(manifest)
    write_with(folder / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    remove(folder, val_pieces + [f"val_{k:05d}.docs.npy" for k in range(n)])
    print(f"data: prepared the token store {folder} in {seconds:.1f} s")
    return manifest


def load_corpus(cfg: DataConfig, tokenizer=None):
    """(training tokens, validation tokens) of the config's token store, prepared when missing:
    the training stream as a ``TokenStream``, validation as one
    memory-mapped array; each document is followed by the end-of-document id."""
    store = open_store(cfg, build=True, tokenizer=tokenizer)
    return store.train, store.val
