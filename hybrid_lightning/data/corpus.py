"""Real text: where documents come from and how they are read.

The sources of ``data:`` (local files and globs, a hub dataset, or the embedded corpus) are cut
into *units*: a group of whole text files, a byte range of a JSON-lines file, row groups of a
parquet file, or a chunk of a hub stream. A unit is read on its own, so units are tokenized in
parallel and each becomes one shard of the token store (``data/store.py``); in unit order, the
documents come in the order the files list them.

The embedded corpus is the Python standard library's own source (present wherever Python
is): real text with long-range dependencies (names defined far back and used later).
Its exact content follows the Python version; the store's fingerprint records the file list.
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from hybrid_lightning.config import DataConfig
from hybrid_lightning.data.tokenizer import load_tokenizer

TEXT_SUFFIXES = {".txt", ".text", ".md", ".rst", ".py", ".c", ".h", ".tex", ".csv", ".html", ".xml", ""}
JSON_SUFFIXES = {".json", ".jsonl"}
PARQUET_SUFFIXES = {".parquet"}
SNIFF_BYTES = 1 << 16  # what check_sources reads of each file: enough to tell text from binary

# A unit: ("text", (path, ...)) | ("jsonl", path, start, end) | ("json", path) |
# ("parquet", path, (row group, ...)) | ("texts", (document, ...))
Unit = tuple


def cache_root(cfg: DataConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("HYBRID_LIGHTNING_CACHE") or Path.home() / ".cache" / "hybrid_lightning"
    return Path(root)


def embedded_files() -> list[Path]:
    """The standard library's .py files, tests and third-party packages left out, in a fixed order."""
    return list(_embedded_files())


@functools.cache
def _embedded_files() -> tuple[Path, ...]:
    """Walked once per process, the skipped folders not entered (a third-party site-packages under the standard
    library made each walk take seconds: ``grid plan`` walks it once per cell)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    return tuple(sorted(files, key=lambda p: p.relative_to(root).as_posix()))


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


def source_files(cfg: DataConfig) -> list[Path] | None:
    """The files to read: data.files, else the embedded corpus; None for a hub dataset."""
    return None if cfg.hub else resolve_files(cfg.files) if cfg.files else embedded_files()


def file_kind(path: Path) -> str:
    """text | jsonl | json (a JSON array) | parquet. A .json file whose first character is not
    ``[`` holds JSON lines."""
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix not in JSON_SUFFIXES:
        return "text"
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES).lstrip()
    return "json" if head.startswith(b"[") else "jsonl"


def check_sources(cfg: DataConfig) -> None:
    """Fails early (before any run directory or store exists) on missing, empty or binary files of ``data.files``
    and ``data.text_val_files`` (the error names the key), a missing text field, or a tokenizer that does not
    load. Reads the start of each file only: a fault further in is reported, naming the file, when the store is
    prepared."""
    load_tokenizer(cfg.tokenizer)
    _check_files(cfg.files, cfg.text_field)
    try:
        _check_files(cfg.text_val_files, cfg.text_field)
    except ValueError as e:
        raise ValueError(re.sub(r"^data\.files", "data.text_val_files", str(e))) from None


def _check_files(patterns: tuple[str, ...], text_field: str) -> None:
    for path in resolve_files(patterns) if patterns else []:
        if path.stat().st_size == 0:
            raise ValueError(f"data.files: {path} is empty")
        kind = file_kind(path)
        if kind == "parquet":
            _check_parquet(path, text_field)
            continue
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
        decode(head, path, partial=len(head) == SNIFF_BYTES)
        if kind == "jsonl":
            first = next((line for line in head.splitlines() if line.strip()), None)
            if first is None or len(first) == len(head) == SNIFF_BYTES:  # no whole line in the sample
                continue
            _field(_json_row(first, path, 0), text_field, path)


def decode(raw: bytes, path: Path, partial: bool = False, offset: int = 0) -> str:
    """UTF-8 text of ``raw`` (bytes of ``path`` from ``offset``), newlines made ``\\n`` as Python's
    text mode does; a NUL byte or invalid UTF-8 is an error naming the file and the byte.
    ``partial``: ``raw`` may end inside a character."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ValueError(f"data.files: {path} looks binary (a NUL byte at byte {offset + nul}); give text files")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (partial and e.start >= len(raw) - 3 and e.reason == "unexpected end of data"):
            raise ValueError(
                f"data.files: {path} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at byte {offset + e.start}); "
                "convert it to UTF-8 or leave it out"
            ) from None
        text = raw[: e.start].decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _json_row(line: bytes, path: Path, offset: int):
    try:
        return json.loads(line)
    except UnicodeDecodeError:
        decode(line, path, offset=offset)  # raises, naming the byte
        raise
    except json.JSONDecodeError as e:
        raise ValueError(f"data.files: {path}: invalid JSON at byte {offset + e.pos}: {e.msg}") from None


def _field(row, field: str, where) -> str:
    if not isinstance(row, dict) or field not in row:
        columns = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"data.text_field: column {field!r} not in {where} (columns: {columns})")
    text = row[field]
    if text is not None and not isinstance(text, str):
        raise ValueError(f"data.text_field: column {field!r} of {where} holds {type(text).__name__}, not text")
    if text is None:
        raise ValueError(f"data.text_field: column {field!r} not in {where} (a row without it)")
    return text


def _check_parquet(path: Path, field: str) -> None:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as e:  # pyarrow raises its own error types for a file that is not parquet
        raise ValueError(f"data.files: {path} does not read as parquet: {e}") from None
    if field not in names:
        raise ValueError(f"data.text_field: column {field!r} not in {path} (columns: {names})")


def plan_units(files: list[Path], unit_bytes: int) -> list[Unit]:
    """Cuts local files into units of about ``unit_bytes`` of input each, in file order."""
    import pyarrow.parquet as pq

    units: list[Unit] = []
    texts: list[str] = []
    text_bytes = 0
    for path in files:
        kind, size = file_kind(path), path.stat().st_size
        if kind != "text" and texts:
            units.append(("text", tuple(texts)))
            texts, text_bytes = [], 0
        if kind == "text":
            texts.append(str(path))
            text_bytes += size
            if text_bytes >= unit_bytes:
                units.append(("text", tuple(texts)))
                texts, text_bytes = [], 0
        elif kind == "jsonl":
            n = max(1, math.ceil(size / unit_bytes))
            units.extend(("jsonl", str(path), k * unit_bytes, min(size, (k + 1) * unit_bytes)) for k in range(n))
        elif kind == "json":
            units.append(("json", str(path)))
        else:
            meta = pq.ParquetFile(path).metadata
            group: list[int] = []
            group_bytes = 0
            for g in range(meta.num_row_groups):
                group.append(g)
                group_bytes += meta.row_group(g).total_byte_size
                if group_bytes >= unit_bytes:
                    units.append(("parquet", str(path), tuple(group)))
                    group, group_bytes = [], 0
            if group:
                units.append(("parquet", str(path), tuple(group)))
    if texts:
        units.append(("text", tuple(texts)))
    return units


def hub_units(cfg: DataConfig, unit_bytes: int) -> Iterator[Unit]:
    """The hub dataset streamed, in chunks of about ``unit_bytes`` characters of documents."""
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    ds = datasets.load_dataset(cfg.hub, cfg.hub_config, split=cfg.hub_split, streaming=True)
    chunk: list[str] = []
    size = 0
    for row in ds:
        text = _field(row, cfg.text_field, cfg.hub)
        if text:
            chunk.append(text)
            size += len(text)
        if size >= unit_bytes:
            yield ("texts", tuple(chunk))
            chunk, size = [], 0
    if chunk:
        yield ("texts", tuple(chunk))


def read_unit(unit: Unit, text_field: str) -> Iterator[str]:
    """The non-empty documents of a unit, in order."""
    kind = unit[0]
    if kind == "texts":
        yield from unit[1]
    elif kind == "text":
        for path in unit[1]:
            text = decode(Path(path).read_bytes(), Path(path))
            if text:
                yield text
    elif kind == "jsonl":
        yield from _read_jsonl(Path(unit[1]), unit[2], unit[3], text_field)
    elif kind == "json":
        path = Path(unit[1])
        rows = _json_row(path.read_bytes(), path, 0)
        if not isinstance(rows, list):
            raise ValueError(f"data.files: {path}: a .json file must hold a list of rows or JSON lines")
        for row in rows:
            text = _field(row, text_field, path)
            if text:
                yield text
    else:
        import pyarrow.parquet as pq

        path = Path(unit[1])
        _check_parquet(path, text_field)
        column = pq.ParquetFile(path).read_row_groups(list(unit[2]), columns=[text_field]).column(0)
        for text in column.to_pylist():
            if text:
                yield _field({text_field: text}, text_field, path)


def _read_jsonl(path: Path, start: int, end: int, field: str) -> Iterator[str]:
    """Documents of the lines that begin in bytes [start, end) of a JSON-lines file."""
    with open(path, "rb") as f:
        pos = start
        if start:  # a line that begins before start belongs to the unit before
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())
        f.seek(pos)
        while pos < end:
            line = f.readline()
            if not line:
                break
            if line.strip():
                text = _field(_json_row(line, path, pos), field, path)
                if text:
                    yield text
            pos += len(line)


def iter_documents(cfg: DataConfig, unit_bytes: int = 1 << 24) -> Iterator[str]:
    """Every document of the config's sources, in order (one process)."""
    files = source_files(cfg)
    units = hub_units(cfg, unit_bytes) if files is None else plan_units(files, unit_bytes)
    for unit in units:
        yield from read_unit(unit, cfg.text_field)
