"""Real text: documents from local files, a hub dataset, or the embedded corpus, tokenized
into one flat train stream and one validation stream, cached on disk.

The embedded corpus is the Python standard library's own source (present wherever Python
is): real text with long-range dependencies (names defined far back and used later).
Its exact content follows the Python version; the cache key records the file list.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hybrid_lightning.config import DataConfig

FORMAT_VERSION = 1
TEXT_SUFFIXES = {".txt", ".text", ".md", ".rst", ".py", ".c", ".h", ".tex", ".csv", ".html", ".xml", ""}
JSON_SUFFIXES = {".json", ".jsonl"}
PARQUET_SUFFIXES = {".parquet"}
GOLDEN = 0.6180339887498949  # documents i with frac(i * GOLDEN) < val_fraction are held out: evenly spread


def cache_root(cfg: DataConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("HYBRID_LIGHTNING_CACHE") or Path.home() / ".cache" / "hybrid_lightning"
    return Path(root)


def embedded_files() -> list[Path]:
    """The standard library's .py files, tests and third-party packages left out, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def resolve_files(patterns: tuple[str, ...]) -> list[Path]:
    """Expands globs; a pattern matching nothing is a user error naming data.files."""
    out: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise ValueError(f"data.files: no file found for {pattern!r}")
        for m in matches:
            suffix = Path(m).suffix.lower()
            if suffix not in TEXT_SUFFIXES | JSON_SUFFIXES | PARQUET_SUFFIXES:
                raise ValueError(
                    f"data.files: {m}: unsupported file type {suffix!r}; accepted: text "
                    f"({sorted(s for s in TEXT_SUFFIXES if s)}), .json/.jsonl, .parquet"
                )
        out.extend(Path(m).resolve() for m in matches)
    return out


def check_sources(cfg: DataConfig) -> None:
    """Fails early (before any run directory exists) on missing files or tokenizer."""
    if cfg.files:
        resolve_files(cfg.files)
    if cfg.tokenizer != "byte" and not Path(cfg.tokenizer).is_file():
        raise ValueError(f"data.tokenizer: file not found: {cfg.tokenizer} (accepted: 'byte' or a tokenizers JSON file)")


def _quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    return datasets


def iter_documents(cfg: DataConfig, files: list[Path] | None) -> Iterator[str]:
    """One string per document: a whole text file, or one row of a json/parquet file or hub dataset."""
    datasets = _quiet_datasets()
    hf_cache = str(cache_root(cfg) / "hf")
    if cfg.hub:
        ds = datasets.load_dataset(cfg.hub, cfg.hub_config, split=cfg.hub_split, streaming=True)
        yield from _rows(ds, cfg.text_field, cfg.hub)
        return
    for kind, paths in _group_by_kind(files or []):
        kwargs = {"sample_by": "document"} if kind == "text" else {}
        ds = datasets.load_dataset(kind, data_files=[str(p) for p in paths], split="train", cache_dir=hf_cache, **kwargs)
        yield from _rows(ds, "text" if kind == "text" else cfg.text_field, paths[0])


def _rows(ds, field: str, where) -> Iterator[str]:
    names = ds.column_names if getattr(ds, "column_names", None) is not None else None
    if names is not None and field not in names:
        raise ValueError(f"data.text_field: column {field!r} not in {where} (columns: {names})")
    for row in ds:
        text = row.get(field)
        if text is None:
            raise ValueError(f"data.text_field: column {field!r} not in {where} (columns: {sorted(row)})")
        if text:
            yield text


def _group_by_kind(files: list[Path]) -> list[tuple[str, list[Path]]]:
    """Consecutive runs of files of one kind (text / json / parquet), order kept."""
    groups: list[tuple[str, list[Path]]] = []
    for f in files:
        s = f.suffix.lower()
        kind = "json" if s in JSON_SUFFIXES else "parquet" if s in PARQUET_SUFFIXES else "text"
        if groups and groups[-1][0] == kind:
            groups[-1][1].append(f)
        else:
            groups.append((kind, [f]))
    return groups


def corpus_key(cfg: DataConfig, tokenizer_name: str) -> tuple[str, list[Path] | None]:
    """A hash of everything the tokenized corpus depends on, and the files to read (None for a hub)."""
    files = None if cfg.hub else resolve_files(cfg.files) if cfg.files else embedded_files()
    source = (
        {"hub": [cfg.hub, cfg.hub_config, cfg.hub_split]}
        if cfg.hub
        else {"files": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    )
    blob = json.dumps(
        {"v": FORMAT_VERSION, "tok": tokenizer_name, "src": source, "field": cfg.text_field,
         "max": cfg.max_tokens, "val": cfg.val_fraction},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20], files


def load_corpus(cfg: DataConfig, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(train tokens, val tokens) as flat arrays, each document followed by the end-of-document id.

    Built once and cached under ``cache_root(cfg)/corpus/<key>``; concurrent runs share it.
    """
    from filelock import FileLock

    key, files = corpus_key(cfg, tokenizer.name)
    folder = cache_root(cfg) / "corpus" / key
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        if not (folder / "meta.json").is_file():
            train, val = _build(cfg, tokenizer, files)
            for name, arr in (("train", train), ("val", val)):
                tmp = folder / f"{name}.tmp.npy"
                np.save(tmp, arr)
                os.replace(tmp, folder / f"{name}.npy")
            meta = {"train_tokens": int(train.size), "val_tokens": int(val.size), "tokenizer": tokenizer.name}
            (folder / "meta.json").write_text(json.dumps(meta))
    return np.load(folder / "train.npy", mmap_mode="r"), np.load(folder / "val.npy", mmap_mode="r")


def _build(cfg: DataConfig, tokenizer, files: list[Path] | None) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    train, val, n_train = [], [], 0
    for i, doc in enumerate(iter_documents(cfg, files)):
        ids = np.append(tokenizer.encode(doc), tokenizer.eos_id).astype(dtype)
        if (i * GOLDEN) % 1.0 < cfg.val_fraction:
            val.append(ids)
            continue
        if cfg.max_tokens is not None and n_train + ids.size >= cfg.max_tokens:
            train.append(ids[: cfg.max_tokens - n_train])
            n_train = cfg.max_tokens
            break
        train.append(ids)
        n_train += ids.size
    train_arr = np.concatenate(train) if train else np.zeros(0, dtype)
    val_arr = np.concatenate(val) if val else np.zeros(0, dtype)
    if val_arr.size == 0:  # too few documents for a document-level split: hold out the stream's tail
        cut = int(train_arr.size * (1 - cfg.val_fraction))
        train_arr, val_arr = train_arr[:cut], train_arr[cut:]
    return train_arr, val_arr
