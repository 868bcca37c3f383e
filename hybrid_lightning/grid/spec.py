"""Grid files expanded into cells: one validated run config per cell, named after its values.

A cell's name is its axis values in the grid file's order, ``key=value`` joined by commas, with
the config section dropped from keys when that stays unambiguous (``model.window`` ->
``window``, ``model.pos.full`` -> ``pos.full``)::

    window=128,pos.full=nope,seed=0

A name that would be long or hold characters unsafe in a path is cut and suffixed with a hash
of the cell's values, so it is still unique and the same on every machine. Resubmitting a grid
therefore finds each cell's run directory again and resumes it. Values are named as the validated
config holds them (``16`` and ``16.0`` of an integer field are one cell, ``window=16``); two cells
whose configs are equal are refused, naming both.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid_lightning.config import (
    RunConfig,
    apply_assignments,
    apply_overrides,
    config_to_dict,
    flatten,
    load_config,
    parse_override,
    read_text_file,
    read_yaml,
    refuse_no_files,
    resolve_paths,
    suggest,
    validate_config,
)
from hybrid_lightning.grid.branches import share_stable_phases
from hybrid_lightning.grid.schema import GridConfig, VerdictsSpec, validate_grid_config
from hybrid_lightning.plan.resolve import plan_run, resolve_config
from hybrid_lightning.rundir import GRID_DIR
from hybrid_lightning.runplan import RunPlan

MAX_NAME = 80  # characters; longer names keep a readable prefix and end in a hash
_SAFE = re.compile(r"^[A-Za-z0-9._+=,\-]+$")


@dataclass(frozen=True)
class Cell:
    """One run of a grid.

    Args:
        name: the directory name under the grid's root, from ``labels``.
        labels: axis -> value as written in the grid file (a preset's name for a preset axis).
        overrides: dotted config key -> value applied to the base config.
        config: the validated, resolved run config (``name`` = the cell's name).
        run_dir: ``<root>/<name>``.
        plan: its run plan (``plan.resolve.make_plan``); None for a grid loaded without resolving.
        exploratory: the grid's ``exploratory`` entries match it: left out of the verdicts and the design check.
    """

    name: str
    labels: dict[str, Any]
    overrides: dict[str, Any]
    config: RunConfig
    run_dir: Path
    plan: RunPlan | None = None
    exploratory: bool = False


@dataclass(frozen=True)
class Grid:
    """An expanded grid: its cells in a fixed order and the values each axis takes."""

    name: str
    path: Path
    root: Path
    cells: list[Cell]
    axes: dict[str, list[Any]]  # axis label -> its values, in file order
    verdicts: VerdictsSpec = VerdictsSpec()  # what the grid declares for its verdicts

    @property
    def state_dir(self) -> Path:
        return self.root / GRID_DIR

    def name_of(self, labels: dict[str, Any]) -> str:
        """The name cells of ``labels`` (axis -> value, some axes left out) get: ``cell_name_for`` with the grid's
        short keys."""
        return cell_name_for(labels, _short_keys(list(self.axes)))

    def select(self, names: list[str] | tuple[str, ...]) -> list[Cell]:
        """The cells named (all when none), or a ``ValueError`` naming an unknown one."""
        if not names:
            return list(self.cells)
        by_name = {c.name: c for c in self.cells}
        for name in names:
            if name not in by_name:
                hint = suggest(name, by_name)
                raise ValueError(f"grid {self.name}: no cell named {name!r}{hint}")
        return [by_name[n] for n in names]


@dataclass(frozen=True)
class _Option:
    labels: dict[str, Any]  # what the cell name shows
    assignment: dict[str, Any]  # what it sets in the config


def _label_values(axes: list) -> dict[str, list]:
    """Each label of the axes' options -> its values, in the axes' order."""
    values = {label: [] for options in axes for label in options[0].labels}
    for options in axes:
        for option in options:
            for label, value in option.labels.items():
                values[label].append(value)
    return values


def load_grid(path: str | Path, root: str | Path | None = None, resolve: bool = True, overrides: Sequence[str] = (),
              cells: Sequence[str] = ()) -> Grid:
    """Reads a grid file and validates every cell; the first problem is one ``ValueError``
    naming the grid file and, where it applies, the cell and the config key.

    Args:
        path: the grid YAML file.
        root: folder of the cells' run directories; default the file's ``root:``, else ``runs/<name>``.
        resolve: False leaves the cells' configs validated but neither resolved nor planned (``plan.resolve.plan_run``):
            their data files and tokenizer need not exist, as for analysis, which needs the cells' names, and
            ``grid status``, which reads what the runs recorded.
        cells: glob patterns over the cells' names (``--cells``, ``fnmatch``): the cells matching one of them are
            kept, and only they are planned; a pattern that matches none is refused.
        overrides: ``KEY=VALUE`` settings (``--set``) applied to every cell kept, after the grid's axes (a smoke
            run: ``--set train.max_steps=5``); the cells keep their names. Settings that make two cells one run
            are refused.
    """
    path = Path(path)
    raw = read_yaml(read_text_file(path, "grid file"), path)
    if not raw:  # a grid of the defaults alone is no study
        raise ValueError(f"{path}: the grid file is empty; give its base config and axes (docs/grids.md)")
    try:
        spec = validate_grid_config(raw)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    name = spec.name or path.stem
    root = Path(root or spec.root or Path("runs") / name).absolute()
    axes = [_axis_options(key, values) for key, values in spec.axes.items()]
    axes += [_zip_options(group) for group in spec.zip]
    base = _base_config(spec, path)
    label_values = _label_values(axes)
    for field in ("exclude", "exploratory"):
        _check_entries(getattr(spec, field), field, label_values, path)
    short = _short_keys(list(label_values))

    found = _expand(spec, axes, base, short, root, path)
    _check_distinct(found, path)
    if not found:
        raise ValueError(f"{path}: the exclusions leave no cell")
    chosen = _overridden(_matching(found, cells), overrides)
    if resolve:
        chosen = [_planned(c, path) for c in chosen]
    if resolve and spec.share_stable_phase:
        chosen = _sharing(chosen, found if cells and not overrides else chosen, root, short, path)
    return Grid(name, path, root, chosen, label_values, spec.verdicts)


def _expand(spec: GridConfig, axes: list, base: dict, short: dict[str, str], root: Path, path: Path) -> list[Cell]:
    """The cells of the axes' product, in file order: those matching an ``exclude`` entry dropped, those matching an
    ``exploratory`` entry marked; an entry that matches no cell is refused."""
    found: list[Cell] = []
    unmatched = {field: set(range(len(getattr(spec, field)))) for field in ("exclude", "exploratory")}
    for combo in itertools.product(*axes) if axes else [()]:
        labels = {k: v for option in combo for k, v in option.labels.items()}
        hits = {field: {i for i, entry in enumerate(getattr(spec, field))
                        if all(_same(labels[k], v) for k, v in entry.items())} for field in unmatched}
        if hits["exclude"]:
            unmatched["exclude"] -= hits["exclude"]
            continue
        unmatched["exploratory"] -= hits["exploratory"]
        assignment = _merge([option.assignment for option in combo], path)
        cfg = _cell_config(base, assignment, cell_name_for(labels, short), path)
        labels = _normalised(labels, cfg)
        cell_name = cell_name_for(labels, short)
        found.append(Cell(cell_name, labels, assignment, cfg.model_copy(update={"name": cell_name}), root / cell_name,
                          exploratory=bool(hits["exploratory"])))
    for field, left in unmatched.items():
        for i in sorted(left):
            raise ValueError(f"{path}: {field}[{i}] {dict(getattr(spec, field)[i])} matches no cell"
                             + (" (left after the exclusions)" if field == "exploratory" else ""))
    return found


def _sharing(chosen: list[Cell], pool: list[Cell], root: Path, short: dict[str, str], grid_path: Path) -> list[Cell]:
    """``chosen`` (planned) with their stable phases (``grid.branches``), grouped among ``pool``: every cell of the
    grid, so that what a cell publishes does not depend on ``--cells``, unless ``--set`` changed the chosen ones. The
    others are only resolved (their steps), not planned."""
    planned = {c.name: c for c in chosen}
    pool = [planned.get(c.name) or _resolved(c, grid_path) for c in pool]
    shared = share_stable_phases(pool, root, lambda labels: cell_name_for(labels, short), str(grid_path))
    by_name = {c.name: c for c in shared}
    return [by_name[c.name] for c in chosen]


def _overridden(cells: list[Cell], overrides: Sequence[str]) -> list[Cell]:
    """The cells with ``--set`` settings applied over their configs (relative paths against the working directory,
    as ``train --set``); a ``ValueError`` for a bad setting or for cells it makes one run."""
    if not overrides:
        return cells
    changed = {".".join(key): value for key, value in map(parse_override, overrides)}
    if "name" in changed:
        raise ValueError("--set name: each cell is named after its values")
    try:
        refuse_no_files(changed.get("data.files"))
    except ValueError as e:
        raise ValueError(f"--set: {e}") from None
    out = []
    for cell in cells:
        try:
            cfg = validate_config(resolve_paths(apply_overrides(config_to_dict(cell.config), list(overrides)),
                                                Path.cwd()))
        except ValueError as e:
            raise ValueError(f"--set: {e}") from None
        out.append(dataclasses.replace(cell, overrides={**cell.overrides, **changed}, config=cfg))
    seen: dict[str, Cell] = {}
    for cell in out:
        first = seen.setdefault(json.dumps({**config_to_dict(cell.config), "name": None}, sort_keys=True), cell)
        if first is not cell:
            raise ValueError(f"--set {' '.join(overrides)} makes cells {first.name} and {cell.name} one run; pick one "
                             "with --cells")
    return out


def _matching(cells: list[Cell], patterns: Sequence[str]) -> list[Cell]:
    """The cells whose names match one of ``patterns`` (all without any); a ``ValueError`` names a pattern
    that matches none, with the closest names."""
    if not patterns:
        return cells
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(c.name, pattern) for c in cells):
            hint = suggest(pattern, [c.name for c in cells])
            raise ValueError(f"--cells {pattern!r} matches no cell{hint} (cells are named key=value,...; quote the "
                             "pattern, e.g. --cells 'arch=full,*')")
    return [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


def _planned(cell: Cell, grid_path: Path) -> Cell:
    """The cell with its config resolved and planned (``plan_run``: a bad cell is refused here)."""
    try:
        cfg, plan = plan_run(cell.config)
    except ValueError as e:
        raise ValueError(f"{grid_path}: cell {cell.name}: {e}") from None
    return dataclasses.replace(cell, config=cfg, plan=plan)


def _resolved(cell: Cell, grid_path: Path) -> Cell:
    """The cell with its config resolved (``resolve_config``: its steps from its budget), not planned."""
    try:
        return dataclasses.replace(cell, config=resolve_config(cell.config))
    except ValueError as e:
        raise ValueError(f"{grid_path}: cell {cell.name}: {e}") from None


def _normalised(labels: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """Each label of a config key as the validated config holds it (16.0 of an integer field is 16);
    a preset's name stays."""
    values = flatten(config_to_dict(cfg))
    return {k: values.get(k, v) for k, v in labels.items()}


def _check_distinct(cells: list[Cell], grid_path: Path) -> None:
    """Refuses two cells that are one run: the same name, or equal configs under two names."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        key = json.dumps({**config_to_dict(cell.config), "name": None}, sort_keys=True)
        first = seen.setdefault(key, cell)
        if first is not cell or sum(c.name == cell.name for c in cells) > 1:
            other = first if first is not cell else next(c for c in cells if c.name == cell.name and c is not cell)
            raise ValueError(f"{grid_path}: cells {other.overrides} and {cell.overrides} are one run "
                             f"({other.name}); drop the duplicate value")


def cell_name_for(labels: dict[str, Any], short: dict[str, str] | None = None) -> str:
    """``key=value`` pairs joined by commas; long or unsafe names end in a hash of the values."""
    short = short or {}
    name = ",".join(f"{short.get(k, k)}={format_value(v)}" for k, v in labels.items())
    if _SAFE.match(name) and len(name) <= MAX_NAME:
        return name or "base"
    digest = hashlib.sha256(json.dumps(list(labels.items()), sort_keys=True, default=str).encode()).hexdigest()[:10]
    readable = re.sub(r"[^A-Za-z0-9._+=,\-]", "_", name)[: MAX_NAME - len(digest) - 1]
    return f"{readable}-{digest}"


def format_value(value: Any) -> str:
    """A value as a name shows it: YAML spelling for scalars (true, null, 0.0003), JSON for lists."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _same(a: Any, b: Any) -> bool:
    # 1, 1.0 and true are different values in a grid file even though Python calls them equal.
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _base_config(spec: GridConfig, grid_path: Path) -> dict:
    """The base run config as plain data with every default filled and data paths absolute."""
    if isinstance(spec.base, str):
        base_path = grid_path.parent / spec.base
        try:
            cfg = load_config(base_path)
        except ValueError as e:
            raise ValueError(f"{grid_path}: base: {e}") from None
    else:
        try:
            data = spec.base.get("data")
            refuse_no_files(data.get("files") if isinstance(data, dict) else None)
            cfg = validate_config(resolve_paths(dict(spec.base), grid_path.parent))
        except ValueError as e:
            raise ValueError(f"{grid_path}: base: {e}") from None
    return config_to_dict(cfg)


def _axis_options(key: str, values: list | dict) -> list[_Option]:
    if isinstance(values, dict):  # named presets: the name shows, the settings apply
        return [_Option({key: preset}, flatten(settings)) for preset, settings in values.items()]
    return [_Option({key: v}, {key: v}) for v in values]


def _zip_options(group: dict[str, list]) -> list[_Option]:
    n = len(next(iter(group.values())))
    return [_Option({k: group[k][i] for k in group}, {k: group[k][i] for k in group}) for i in range(n)]


def _merge(assignments: list[dict[str, Any]], grid_path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for assignment in assignments:
        for key, value in assignment.items():
            if key in out:
                raise ValueError(f"{grid_path}: {key} is set by two axes; give it to one")
            out[key] = value
    return out


def _cell_config(base: dict, overrides: dict[str, Any], name: str, grid_path: Path) -> RunConfig:
    """The cell's config, validated."""
    if "name" in overrides:
        raise ValueError(f"{grid_path}: 'name' cannot be set by an axis; each cell is named after its values")
    try:
        refuse_no_files(overrides.get("data.files"))
        return validate_config(resolve_paths(apply_assignments(base, {**overrides, "name": name}), grid_path.parent))
    except ValueError as e:
        raise ValueError(f"{grid_path}: cell {name}: {e}") from None


def _check_entries(entries: tuple[dict, ...], field: str, label_values: dict[str, list], grid_path: Path) -> None:
    """Each key of each ``exclude`` or ``exploratory`` entry (``field``) an axis, each value one of its values."""
    for i, entry in enumerate(entries):
        for key, value in entry.items():
            if key not in label_values:
                hint = suggest(key, label_values)
                raise ValueError(f"{grid_path}: {field}[{i}]: '{key}' is not an axis{hint} Axes: {list(label_values)}")
            if not any(_same(value, v) for v in label_values[key]):
                raise ValueError(
                    f"{grid_path}: {field}[{i}]: {key}={format_value(value)} is not a value of that axis "
                    f"(values: {[format_value(v) for v in label_values[key]]})"
                )


def _short_keys(labels: list[str]) -> dict[str, str]:
    """``model.window`` -> ``window`` when no other label would read the same."""
    short = {k: k.split(".", 1)[1] if "." in k else k for k in labels}
    taken = list(short.values())
    return {k: s if taken.count(s) == 1 and (s == k or s not in labels) else k for k, s in short.items()}
