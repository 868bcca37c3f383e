"""``hybrid-lightning pack``: finished runs as packed records, the part of a run directory that
``analyze`` reads, small enough to commit (docs/run-directory.md, "Packed runs").

A packed run is a run directory without checkpoints or TensorBoard events: ``config.yaml``,
``status.json`` and ``eval/*.json`` as training wrote them, ``tracing/step_<k>.json`` as ``hybrid-lightning
trace`` wrote them, and the TensorBoard scalars that
analysis reads (``scalars.TAGS``) as ``scalars.csv`` (``SCALARS_FILE``: step, metric, value, each
value the float TensorBoard stored, written exactly). A packed run packs again into itself. ``analyze`` reads a
packed run as it reads the run; a grid counts a packed ``done`` run copied into its root as done and trains only
the other cells.

    pack_runs("runs/cpu_replica", "analysis/results/cpu_replica/runs")
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

from hybrid_lightning.fileio import overlap, refuse_file_for_folder, write_atomic
from hybrid_lightning.rundir import (
    CONFIG_FILE,
    EVAL_DIR,
    PLAN_FILE,
    SCALARS_FILE,
    STATUS_FILE,
    TRACING_DIR,
    eval_files,
    find_runs,
    runs_under,
)
from hybrid_lightning.rundir.status import read_status

PACKED = (CONFIG_FILE, PLAN_FILE, STATUS_FILE, SCALARS_FILE)  # with RECORDS: every file a packed run holds
RECORDS = (EVAL_DIR, TRACING_DIR)  # the folders of a packed run's JSON records


def _is_record(name: str) -> bool:
    """Whether ``name`` (a path relative to a packed run) is one of its records."""
    folder, _, file = name.partition("/")
    return folder in RECORDS and "/" not in file and file.endswith(".json")


def pack_runs(root: str | Path, out: str | Path, tags: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """Packs every run under ``root`` into ``out/<its path under root>``; returns (run, what happened)
    per run: ``packed``, ``unchanged`` (packed before, same files) or why it was skipped (not done).

    A target folder that holds anything a packed run does not, or a packed run of another config,
    is refused before anything is written (``ValueError``): pack replaces only what it wrote.
    ``tags``: the scalars kept; default those analysis reads (``scalars.TAGS``).
    """
    from hybrid_lightning.analysis.scalars import TAGS  # pandas: not at the command line's start

    root, out, tags = Path(root), Path(out), tags or TAGS
    refuse_file_for_folder(out, "--out")
    _check_apart(root, out)
    dirs = runs_under(root)
    done = [d for d in dirs if (read_status(d) or {}).get("state") == "done"]
    for run in done:
        _check_sound(run)
        _check_target(run, out / run.relative_to(root))
    results = [(d.relative_to(root).as_posix(), f"skipped: {(read_status(d) or {}).get('state', 'no status.json')}, "
                "not done")
               for d in dirs if d not in done]
    for run in done:
        results.append((run.relative_to(root).as_posix(), _pack(run, out / run.relative_to(root), tags)))
    return sorted(results)


def packed_files(run: Path, tags: tuple[str, ...]) -> dict[str, bytes]:
    """The packed run of run directory ``run``: relative path -> content."""
    from hybrid_lightning.analysis.scalars import read_scalars

    files = {name: (run / name).read_bytes() for name in (CONFIG_FILE, PLAN_FILE, STATUS_FILE)
             if (run / name).is_file()}
    files |= {f"{EVAL_DIR}/{path.name}": path.read_bytes() for _, _, path in eval_files(run)}
    traced = sorted((run / TRACING_DIR).glob("step_*.json"))  # hybrid-lightning trace's records
    files |= {f"{TRACING_DIR}/{path.name}": path.read_bytes() for path in traced}
    # repr of each stored float: read back, it is the same number
    files[SCALARS_FILE] = read_scalars(run, tags).to_csv(index=False, float_format=lambda v: repr(float(v))).encode()
    return files


def _pack(run: Path, target: Path, tags: tuple[str, ...]) -> str:
    files, existing = packed_files(run, tags), _existing(target)
    if existing == files:
        return "unchanged"
    for name in set(existing) - set(files):  # an evaluation record the run no longer has
        (target / name).unlink()
    for name, content in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target / name, content)
    return "packed"


def _existing(target: Path) -> dict[str, bytes]:
    return ({p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
            if target.is_dir() else {})


def _check_target(run: Path, target: Path) -> None:
    """Refuses a target that is not a packed run of this run: a file, foreign files, another config."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"--out: {target} is a file; pack writes the packed run {run} there as a folder")
    existing = _existing(target)
    foreign = sorted(n for n in existing if n not in PACKED and not _is_record(n))
    if foreign:
        raise ValueError(f"--out: {target} holds {foreign[0]}, which pack did not write; pack {run} elsewhere")
    if CONFIG_FILE in existing and existing[CONFIG_FILE] != (run / CONFIG_FILE).read_bytes():
        raise ValueError(f"--out: {target} holds the packed run of another config than {run}'s; pack it elsewhere")


def _check_apart(root: Path, out: Path) -> None:
    """Refuses an ``out`` inside ``root`` (a later pack would pack the packed runs) or around it."""
    if overlap(root, out):
        raise ValueError(f"--out: {out} and DIR {root} overlap; packed runs go into a folder apart from the runs")


def copy_packed(packed: str | Path, root: str | Path) -> list[str]:
    """Copies the packed runs under ``packed`` that ``root`` lacks into ``root`` (a grid then counts the
    done ones as done); a run directory already in ``root`` is left as it is. Returns the runs copied."""
    packed, root = Path(packed), Path(root)
    refuse_file_for_folder(root, "--into")
    runs = find_runs(packed)
    if not runs:
        raise ValueError(f"{packed} holds no packed run (a folder with {CONFIG_FILE}); give the --out folder of "
                         "hybrid-lightning pack")
    for run in runs:
        _check_sound(run)
    copied = []
    for run in runs:
        target = root / run.relative_to(packed)
        if not target.exists():
            shutil.copytree(run, target)
            copied.append(run.relative_to(packed).as_posix())
    return copied


def _check_sound(run: Path) -> None:
    """Refuses a run whose records do not read as analysis reads them (``load.damaged_records``), naming them:
    nothing is packed or copied then."""
    from hybrid_lightning.analysis.load import damaged_records

    damaged = damaged_records(run)
    if damaged:
        raise ValueError(f"{run}: damaged records, nothing written: {'; '.join(damaged)}")


def add_parsers(sub, command: Callable[..., argparse.ArgumentParser]) -> None:
    """The ``pack`` and ``unpack`` commands (``command``: the command line's way to add one)."""
    p = command(sub, "pack", "the finished runs under a folder as packed records (what analyze reads), small enough "
                "to commit", "run-directory.md")
    p.add_argument("dir", help="folder searched recursively for run directories; runs not done are skipped")
    p.add_argument("--out", required=True, help="folder of the packed runs (apart from DIR), one per run at its path "
                   "under DIR")
    p.set_defaults(func=_cmd_pack)
    p = command(sub, "unpack", "copy packed runs into a grid's root, which then counts the done ones as done",
                "run-directory.md")
    p.add_argument("packed", help="folder of packed runs (hybrid-lightning pack --out)")
    p.add_argument("--into", required=True, help="the grid's root; a run directory already there is left as it is")
    p.set_defaults(func=_cmd_unpack)


def _cmd_pack(args: argparse.Namespace) -> int:
    for run, what in pack_runs(args.dir, args.out):
        print(f"{run}: {what}")
    print(f"packed runs in {args.out}; hybrid-lightning analyze {args.out} reads them")
    return 0


def _cmd_unpack(args: argparse.Namespace) -> int:
    copied = copy_packed(args.packed, args.into)
    print(f"{len(copied)} packed runs copied into {args.into}" + "".join(f"\n  {run}" for run in copied))
    return 0
