"""A run directory's ``config.yaml`` (the resolved config and its provenance) and ``plan.json`` (the run plan)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, dump_config, read_text_file, read_yaml, validate_config
from hybrid_lightning.fileio import write_atomic
from hybrid_lightning.rundir import CONFIG_FILE, PLAN_FILE
from hybrid_lightning.rundir.legacy import check_planless, plan_of_record, rebuilt_plan
from hybrid_lightning.runplan import RunPlan


def read_config_dict(run_dir: Path) -> dict | None:
    """``config.yaml`` as plain data; None without one, a ``ValueError`` naming it when it does not read."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    raw = read_yaml(read_text_file(path, "run config"), path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a YAML mapping; the file is damaged")
    return raw


def write_config(run_dir: Path, cfg: RunConfig, provenance: Mapping) -> None:
    """Writes ``config.yaml``: the resolved config and its ``provenance`` section."""
    write_atomic(Path(run_dir) / CONFIG_FILE, dump_config(cfg, {PROVENANCE_KEY: dict(provenance)}))


def read_run_config(run_dir: Path) -> RunConfig:
    """The run's config as written by ``train`` (provenance dropped)."""
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: no {CONFIG_FILE}; is this a run directory?")
    raw.pop(PROVENANCE_KEY, None)
    return validate_config(raw)


def write_plan(run_dir: Path, plan: RunPlan) -> None:
    write_atomic(Path(run_dir) / PLAN_FILE, json.dumps(plan.as_dict(), indent=1))


def read_plan(run_dir: Path) -> RunPlan:
    """The run's plan: ``plan.json`` (of this version or an older one: ``legacy.plan_of_record``), or for a run
    written before plans were recorded, the plan rebuilt from its config.yaml (``legacy.rebuilt_plan``). A
    ``ValueError`` names a file that does not read, and a plan.json missing from a run of a version that writes one
    (``legacy.check_planless``)."""
    path = Path(run_dir) / PLAN_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{path}: not JSON; the file is damaged") from None
        return plan_of_record(data, str(path))
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: neither {PLAN_FILE} nor {CONFIG_FILE}; is this a run directory?")
    check_planless(run_dir, raw)
    return rebuilt_plan(run_dir, raw)
