"""Runs an older version wrote, read here and nowhere else:

- a run written before ``plan.json``: its plan rebuilt from its config.yaml (``rebuilt_plan``): the layers its
  provenance recorded (else from ``model.pattern``), its parameter counts and its budget;
- a ``plan.json`` of version 1, whose records number a step by the index of its last batch (``plan_of_record``);
- such a run is not resumed (``check_resumable``): its records would mix two numberings;
- a run whose config.yaml says a version that writes plan.json wrote it, without one: not rebuilt, named missing
  (``check_planless``);
- evaluation records whose rows name a layer's mixer ``kind`` (written before December 2026), read with it as
  ``mixer`` (``upgraded_record``).

Every reader of a run directory goes through ``files.read_plan`` and ``evals.read_eval_record``, which send these
cases here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hybrid_lightning.config import PROVENANCE_KEY, config_to_dict, flatten, validate_config
from hybrid_lightning.kinds import expand, layer_traits
from hybrid_lightning.rundir import CONFIG_FILE, DATA_KEY, PLAN_FILE
from hybrid_lightning.runplan import STEPS_INDEXED, Budget, LayerPlan, RunPlan, plan_from_dict

# What runs written before plan.json recorded in config.yaml's provenance instead: the layers (one entry per
# layer: layer, kind, letter, window, pos) and the parameter counts.
LAYERS_KEY, PARAMS_KEY = "layers", "params"
_DEFAULTS = flatten(config_to_dict(validate_config({})))  # every key's default, for configs written without it


def upgraded_record(record):
    """An evaluation record as read (a dict, or anything else, returned as is) with the rows of its lists that name the
    layer's mixer ``kind`` (records written before the field was ``mixer``) renamed, the field kept in its place."""
    if not isinstance(record, dict):
        return record
    for name, rows in record.items():
        if isinstance(rows, list) and any(isinstance(r, dict) and "kind" in r and "mixer" not in r for r in rows):
            record[name] = [{("mixer" if k == "kind" else k): v for k, v in r.items()} if isinstance(r, dict) else r
                            for r in rows]
    return record


def plan_of_record(data: Mapping, source: str) -> RunPlan:
    """The plan of a ``plan.json``'s data (``runplan.plan_from_dict``); one of version 1 numbers its steps by index."""
    if isinstance(data, Mapping) and isinstance(data.get("version"), int) and data["version"] < 2:
        data = {**data, "step_numbering": STEPS_INDEXED}  # recorded before steps counted the optimizer steps completed
    return plan_from_dict(data, source)


def check_planless(run_dir: Path, raw: Mapping) -> None:
    """Refuses to rebuild the plan of a run whose config.yaml (``raw``) a version that writes plan.json wrote: its
    provenance holds the data's fingerprint (recorded since before plan.json) and no layer list (recorded in the
    provenance until plan.json took it over). Its plan.json was lost, not never written."""
    provenance = raw.get(PROVENANCE_KEY) or {}
    if isinstance(provenance, Mapping) and provenance.get(DATA_KEY) and not provenance.get(LAYERS_KEY):
        raise ValueError(f"{Path(run_dir) / PLAN_FILE} is missing, though {CONFIG_FILE} was written by a version that "
                         f"writes it (its provenance holds the data's fingerprint and no layer list); restore it, or "
                         "train the run again (same command) to write it from the checkpoint's plan")


def rebuilt_plan(run_dir: Path, raw: dict) -> RunPlan:
    """The plan of a run written before plan.json, from its config.yaml as read (``raw``): its layers as its
    provenance recorded them (else from ``model.pattern``), its parameter counts, and its budget with the
    processes its config states (``train.devices``, ``auto`` counted as one, times ``train.num_nodes``; a run
    since records the processes it trained in, in its plan's budget). The config is read as written, a key it
    lacks taking today's default, not validated: a run of another version (a mixer this process does not know)
    is still read."""
    provenance = raw.pop(PROVENANCE_KEY, None) or {}
    written = flatten(raw)

    def value(key: str):
        return written.get(key, _DEFAULTS[key])

    if provenance.get(LAYERS_KEY):
        layers = [LayerPlan(r["layer"], r["kind"], r["window"], r["pos"]) for r in provenance[LAYERS_KEY]]
    else:
        try:
            mixers = expand(str(value("model.pattern")), int(value("model.n_layers")), value("model.mixer"))
            traits = (value("model.window"), value("model.pos.full"), value("model.pos.efficient"))
            layers = [LayerPlan(i, m, *layer_traits(m, *traits)) for i, m in enumerate(mixers)]
        except (KeyError, ValueError) as e:
            raise ValueError(f"{Path(run_dir) / CONFIG_FILE}: its layers cannot be read ({e}); the file is damaged "
                             "or of a version that recorded no layer plan") from None
    devices = value("train.devices")
    world = (1 if devices == "auto" else int(devices)) * int(value("train.num_nodes"))
    sizes = (int(value(f"train.{k}")) for k in ("seq_len", "batch_size", "accumulate_grad_batches"))
    budget = Budget(*sizes, world, int(value("train.max_steps")))
    return RunPlan(tuple(layers), budget, params=provenance.get(PARAMS_KEY), rebuilt=True, step_numbering=STEPS_INDEXED)


def check_resumable(run_dir: Path, plan: RunPlan) -> None:
    """A ``ValueError`` for a run (its ``plan``) written before steps counted the optimizer steps completed
    (``runplan.STEPS_INDEXED``: its plan.json of version 1, or none): resuming it would mix two numberings."""
    if plan.step_numbering == STEPS_INDEXED:
        raise ValueError(f"{run_dir} was trained by an older hybrid-lightning, whose records number a step by the "
                         f"index of its last batch (plan version {plan.version}{', rebuilt' if plan.rebuilt else ''}); "
                         "finish it with that version, or train this config again in another --run-dir")
