"""Reading run configs: YAML, ``--set dotted.key=value`` overrides, validation into one ``ValueError``.

Every user error is a ``ValueError`` whose message names the bad field and, for unknown keys, the
closest valid one (``suggest``). ``flatten`` turns nested sections into dotted keys; the grid, the
resume check and analysis all use it.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hybrid_lightning.config.fields import _Frozen
from hybrid_lightning.config.schema import PROVENANCE_KEY, RunConfig


def flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys, ``{"model": {"window": 8}}`` -> ``{"model.window": 8}``; an
    empty mapping stays a value (``{"eval.heads": {}}``) so that no key disappears."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def suggest(name: object, choices: Iterable[str], cutoff: float = 0.5, quote: str = "'", prefix: str = "") -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` to ``name`` (shown after ``prefix``), or
    ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=cutoff)
    return f"; did you mean {quote}{prefix}{close[0]}{quote}?" if close else ""

def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (["train", "lr"], 3e-4); the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects dotted.key=value, got {item!r}")
    return key.strip().split("."), read_yaml(raw, f"--set {item}") if raw.strip() else None


MAX_DEPTH = 32  # sections and lists nested deeper than this are no config
MAX_NODES = 1_000_000  # values in a config once its aliases are expanded (a grid of a few thousand cells is far below)


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` with YAML 1.2's numbers (``3e-4`` is a float; PyYAML's YAML 1.1 rules make it the
    string "3e-4", which the strict number check would refuse; integers are decimal, where YAML 1.1 reads ``0b11``
    as 3 and ``010`` as 8), and a key given twice in one mapping refused
    (YAML 1.2 forbids it; PyYAML would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):  # a list or a mapping as a key: no config key
                raise yaml.constructor.ConstructorError(None, None, f"a key is a name or a number, not {key!r}",
                                                        key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+0123456789."))
_INT = "tag:yaml.org,2002:int"  # YAML 1.2's integers are decimal: 0b11, 0x1f, 1_000 and 1:30 stay strings, 010 is ten
_Loader.yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in resolvers if tag != _INT]
                                   for first, resolvers in _Loader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_constructor(_INT, lambda loader, node: int(loader.construct_scalar(node), 10))


def read_yaml(text: str, source: str | Path) -> Any:
    """``yaml.safe_load(text)`` (YAML 1.2 numbers); a syntax error, a duplicate key, nesting deeper than
    ``MAX_DEPTH`` or more than ``MAX_NODES`` values once aliases are expanded (an alias bomb) is a ``ValueError``
    naming ``source`` (with the line and column where YAML gives them)."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ValueError(f"{source}: nested deeper than a config can be (at most {MAX_DEPTH} levels)") from None
    _check_size(data, source)
    return data


def _check_size(data: Any, source: str | Path) -> None:
    """Refuses ``data`` nested deeper than ``MAX_DEPTH`` or holding more than ``MAX_NODES`` values when its shared
    parts (YAML aliases) are counted as often as they occur; without recursion, each part counted once."""
    sizes: dict[int, int] = {}
    stack = [(data, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
        if depth > MAX_DEPTH:
            raise ValueError(f"{source}: nested deeper than a config can be (at most {MAX_DEPTH} levels)")
        if done:
            sizes[id(node)] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[id(node)] > MAX_NODES:
                raise ValueError(f"{source}: over {MAX_NODES:,} values once its aliases are expanded; a config is far "
                                 "smaller (an alias bomb?)")
        elif children and id(node) not in sizes:
            stack.append((node, depth, True))
            stack.extend((c, depth + 1, False) for c in children)


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Returns a copy of ``raw`` with each ``dotted.key=value`` set (unknown keys are caught later)."""
    assignments = {}
    for item in overrides:
        path, value = parse_override(item)
        assignments[".".join(path)] = value
    return apply_assignments(raw, assignments)


def apply_assignments(raw: dict, assignments: Mapping[str, Any]) -> dict:
    """Returns a copy of ``raw`` with each dotted key set to its value, e.g. ``{"model.window": 128}``."""
    out = _deep_copy(raw)
    for key, value in assignments.items():
        path = key.split(".")
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"{key}: {'.'.join(path[: i + 1])} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def validate_config(raw: dict | None, model_only: bool = False) -> RunConfig:
    """Builds a ``RunConfig`` from plain data; every problem becomes one ``ValueError``. ``model_only``: the
    config of a model built alone (``plan.build``), whose window no run's sequences bound."""
    return validate(RunConfig, raw, "a run config", "config", {"model_only": model_only})


def validate(model: type[_Frozen], raw: dict | None, what: str, noun: str, context: dict | None = None):
    """``model`` from plain data (``context``: pydantic's validation context); unknown keys named with a
    suggestion, every other problem one ``ValueError``."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a mapping, got {type(raw).__name__}")
    _check_keys(raw, model, "", noun)
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as e:
        raise ValueError(f"invalid {noun}: {_describe(e)}") from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Reads a YAML run config (None = the embedded default), applies overrides, validates.

    Relative paths in ``data.files``, ``data.tokenizer``, ``data.store`` and ``eval.longppl_evaluator`` are resolved
    against the config file's folder; those given with ``--set`` against the working directory.
    """
    raw: dict = {}
    if path is not None:
        path = Path(path)
        raw = read_yaml(read_text_file(path, "config file"), path) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a run config must be a YAML mapping")
        raw.pop(PROVENANCE_KEY, None)  # written by train next to the config; not an input
        raw = resolve_paths(raw, path.parent)
        raw.setdefault("name", path.stem)
    raw = resolve_paths(apply_overrides(raw, overrides), Path.cwd())
    data = raw.get("data")
    refuse_no_files(data.get("files") if isinstance(data, dict) else None)
    return validate_config(raw)


def refuse_no_files(files: Any) -> None:
    """A ``data.files`` the user wrote as an empty list names no file: a ``ValueError`` (null, or no key, is the
    embedded corpus), so that a list left empty by mistake never trains on the embedded corpus unsaid. Run
    records write null (``dump_config``); older ones with ``[]`` are read as they were written."""
    if isinstance(files, (list, tuple)) and not files:
        raise ValueError("data.files: [] names no file; give files or globs, or leave the key out (null) to train on "
                         "the embedded corpus")


def read_text_file(path: Path, what: str) -> str:
    """The text of ``path``, a ``ValueError`` saying what is wrong otherwise: not found, not a regular file (a
    folder, a FIFO, a device), not UTF-8 text."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{what} not found: {path}")
    if not path.is_file():
        raise ValueError(f"{what} {path} is not a regular file; give a YAML file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text "
                         f"(invalid byte 0x{e.object[e.start]:02x} at byte {e.start})") from None


def resolve_paths(raw: dict, base: Path) -> dict:
    """Makes relative ``data.files``, ``data.text_val_files``, ``data.tokenizer``, ``data.store`` and
    ``eval.longppl_evaluator`` paths absolute against ``base``."""
    ev = raw.get("eval")
    if isinstance(ev, dict) and isinstance(ev.get("longppl_evaluator"), str):
        raw = {**raw, "eval": {**ev, "longppl_evaluator": str((base / ev["longppl_evaluator"]).resolve())}}
    data = raw.get("data")
    if not isinstance(data, dict):
        return raw
    data = dict(data)
    for key in ("files", "text_val_files"):
        files = data.get(key)
        if isinstance(files, str):
            files = [files]
        if isinstance(files, list):
            data[key] = [str((base / f).resolve()) if isinstance(f, str) else f for f in files]
    tok = data.get("tokenizer")
    if isinstance(tok, str) and tok != "byte":
        data["tokenizer"] = str((base / tok).resolve())
    if isinstance(data.get("store"), str):
        data["store"] = str((base / data["store"]).resolve())
    return {**raw, "data": data}


def _check_keys(raw: dict, model: type[BaseModel], prefix: str, noun: str) -> None:
    """Rejects unknown keys with the closest valid key, recursing into sections."""
    fields = model.model_fields
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            hint = suggest(key, fields, prefix=prefix)
            raise ValueError(f"unknown {noun} key '{where}'{hint} Valid keys here: {sorted(fields)}")
        sub = _section_type(fields[key].annotation)
        if sub is not None and isinstance(value, dict):
            _check_keys(value, sub, where + ".", noun)


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


# The tags pydantic puts in an error's location for the member of a union (``int | None``: "int").
UNION_TAGS = ("int", "float", "bool", "str", "none")


def _describe(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]
                       if not str(p).startswith(("function-", "literal[")) and p not in UNION_TAGS)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg = f"{err['input']!r} is not accepted; {msg.lower()}"
        elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def config_to_dict(cfg: RunConfig) -> dict:
    """Plain YAML-ready data (tuples become lists)."""
    return cfg.model_dump(mode="json")


def dump_config(cfg: RunConfig, extra: dict | None = None) -> str:
    """The config as YAML, ``extra`` keys after it; no ``data.files`` is written as null (``refuse_no_files``)."""
    data = config_to_dict(cfg)
    data["data"]["files"] = data["data"]["files"] or None
    if extra:
        data = {**data, **extra}
    return yaml.safe_dump(data, sort_keys=False)
