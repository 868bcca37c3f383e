"""Whether a run directory holds the run a config asks for, before training resumes it: only the keys tagged
resumable or bookkeeping (config/roles.py) may change, ``train.max_steps`` only where no trained step's
learning rate would change (``check_extension``), and the data is the data it trained on (its fingerprint,
``recorded_data``). The checkpoint training would resume from is read once (``Resume``: its step, config and
data fingerprint from the scan that found it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, config_to_dict, flatten, validate_config
from hybrid_lightning.config.roles import may_change_on_resume
from hybrid_lightning.config.schedule import lr_factor
from hybrid_lightning.rundir import CKPT_DIR, CONFIG_FILE, DATA_KEY
from hybrid_lightning.rundir.checkpoints import newest_checkpoint
from hybrid_lightning.rundir.files import read_config_dict, read_plan
from hybrid_lightning.rundir.legacy import check_resumable, plan_of_record


@dataclass(frozen=True)
class Resume:
    """The checkpoint a rerun resumes from: its path and step, and what it stored
    (``rundir.checkpoints.read_checkpoint_meta``)."""

    path: Path
    step: int
    config: dict | None  # the resolved config it was trained with
    data: dict | None  # the fingerprint of its data
    plan: dict | None = None  # the run plan it was trained with

    @classmethod
    def of(cls, run_dir: Path) -> Resume | None:
        """The run's newest valid checkpoint (``rundir.checkpoints.newest_checkpoint``), None for a new run."""
        found = newest_checkpoint(run_dir)
        if found is None:
            return None
        return cls(found[0], found[1]["step"], found[1]["config"], found[1]["data"], found[1]["plan"])


def check_same_run(run_dir: Path, cfg: RunConfig, resume: Resume | None = None, flag: str = "--run-dir") -> None:
    """A run directory belongs to one config; only the keys tagged resumable or bookkeeping
    (config/roles.py) may change between invocations.

    The config is compared with ``config.yaml`` and with the config stored in the checkpoint training would
    resume from, so that a lost or edited ``config.yaml`` cannot resume a checkpoint under another model.
    ``flag``: the option that chose the run directory, named in the refusal (a grid's ``--root``).
    """
    old = read_config_dict(run_dir)
    if old is not None:
        old.pop(PROVENANCE_KEY, None)
        check_same_config(run_dir, old, cfg, CONFIG_FILE, flag)
    if resume is not None and resume.config is not None:
        check_same_config(run_dir, resume.config, cfg, f"{CKPT_DIR}/{resume.path.name}", flag)


def _compared(key: str, value):
    """``data.files`` by file name: where the files lie is a location, so a run directory moved or unpacked
    on another machine or checkout (the data elsewhere) holds the same run; what the files hold is checked
    by the data fingerprint when training resumes (``recorded_data``). No files is null in newer records, [] in
    older ones."""
    if key == "data.files":
        return [Path(v).name for v in value] if value else None
    return value


def check_same_config(run_dir: Path, old: dict, cfg: RunConfig, source: str, flag: str = "--run-dir",
                      also: frozenset[str] = frozenset(), hint: str | None = None) -> None:
    """Refuses ``cfg`` where it differs from ``old`` (a config ``source`` in ``run_dir`` holds) in a key that may not
    change on resume and is not in ``also``; ``hint``: what the refusal says instead of naming ``flag``. A key the
    record lacks is newer than it (a mixer or option added since; configs are written whole) and takes its default:
    the run was made without it."""
    newer = flatten(config_to_dict(validate_config({})))
    a, b = {**newer, **flatten(old)}, flatten(config_to_dict(cfg))
    changed = sorted(k for k in a.keys() | b.keys() if _compared(k, a.get(k)) != _compared(k, b.get(k)))
    blocking = [k for k in changed if not may_change_on_resume(k) and k not in also]
    if blocking:
        diffs = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in blocking[:8])
        raise ValueError(f"{run_dir} holds a run with another config (by its {source}: {diffs}); "
                         f"{hint or f'use another {flag}'}")


def check_numbering(run_dir: Path, resume: Resume | None) -> None:
    """A run written before steps counted the optimizer steps completed is not resumed (``legacy.check_resumable``):
    by the plan stored in the checkpoint it would resume from, else by the run's plan.json (or its config.yaml)."""
    if resume is None:
        return
    stored = resume.plan and plan_of_record(resume.plan, f"{resume.path}: its plan")
    check_resumable(run_dir, stored or read_plan(run_dir))


def check_extension(cfg: RunConfig, resume: Resume | None) -> None:
    """A changed ``train.max_steps`` is taken only where every step already trained keeps its learning
    rate under the new schedule (constant; WSD before its decay began; cosine within its warmup), so
    that the run ends as one trained with the new ``train.max_steps`` from the start; else a ``ValueError``."""
    if resume is None or resume.config is None or resume.config["train"]["max_steps"] == cfg.train.max_steps:
        return
    before, after = validate_config(resume.config).train, cfg.train
    changed = next((s for s in range(resume.step) if lr_factor(s, before) != lr_factor(s, after)), None)
    if changed is not None:
        raise ValueError(
            f"train.max_steps: {before.max_steps} -> {after.max_steps} would change the learning rate of step "
            f"{changed}, already trained, under train.schedule={after.schedule} (it depends on train.max_steps"
            f"{' once its decay began' if after.schedule == 'wsd' else ''}): the run would not equal one trained for "
            f"{after.max_steps} steps; train that as a new run (another --run-dir), or plan runs to extend with "
            "train.schedule=constant or wsd")


def recorded_data(run_dir: Path, resume: Resume | None) -> dict | None:
    """The data fingerprint (``data.integrity.fingerprint``) a run recorded: the checkpoint's it resumes
    from, else config.yaml's; None for a new run."""
    stored = resume.data if resume is not None else None
    return stored or ((read_config_dict(run_dir) or {}).get(PROVENANCE_KEY) or {}).get(DATA_KEY)
