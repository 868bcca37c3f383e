"""What a run is, before it trains: the config resolved (vocabulary size, name, step budget), the run
directory it defaults to, the provenance written beside it, and whether a run directory holds the
same run: the keys a resume may change, the data it trained on (its fingerprint, recorded in
config.yaml's provenance and in each checkpoint) and when ``train.max_steps`` may change
(``check_extension``)."""

from __future__ import annotations

import datetime
import math
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid_lightning import __version__
from hybrid_lightning.config.loading import config_to_dict, flatten, validate_config
from hybrid_lightning.config.roles import may_change_on_resume
from hybrid_lightning.config.schedule import lr_factor
from hybrid_lightning.config.schema import PROVENANCE_KEY, RunConfig
from hybrid_lightning.data.corpus import check_sources
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.model import count_params
from hybrid_lightning.design.matching import non_embedding_params
from hybrid_lightning.rundir import (
    CKPT_DIR,
    CONFIG_FILE,
    DATA_KEY,
    LAYER_FIELDS,
    LAYERS_KEY,
    PARAM_FIELDS,
    PARAMS_KEY,
    read_checkpoint_meta,
    read_config_dict,
)

if TYPE_CHECKING:
    from hybrid_lightning.model import HybridLM



def resolve_config(cfg: RunConfig) -> RunConfig:
    """Fills what follows from other settings: the vocabulary size from the tokenizer, the name, and
    ``train.max_steps`` from ``train.tokens_per_param``."""
    check_sources(cfg.data)
    model = cfg.model
    if model.vocab_size is None:
        model = model.model_copy(update={"vocab_size": load_tokenizer(cfg.data.tokenizer).vocab_size})
    cfg = cfg.model_copy(update={"model": model, "name": cfg.name or "run"})
    if cfg.train.tokens_per_param is None:
        return cfg
    steps = budget_steps(cfg)
    if cfg.train.warmup_steps >= steps > 1:
        raise ValueError(f"train.warmup_steps={cfg.train.warmup_steps} must be below train.max_steps={steps} "
                         f"(from train.tokens_per_param={cfg.train.tokens_per_param}): set train.warmup_steps to at most {steps - 1}")
    raw = config_to_dict(cfg)
    raw["train"]["max_steps"] = steps
    return validate_config(raw)


def budget_steps(cfg: RunConfig) -> int:
    """Optimizer steps for ``train.tokens_per_param`` x the non-embedding parameters, rounded up."""
    t = cfg.train
    tokens_per_step = t.tokens_per_step(t.planned_world_size(), t.accumulate_grad_batches)
    return max(1, math.ceil(t.tokens_per_param * non_embedding_params(cfg.model) / tokens_per_step))


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / (cfg.name or "run")


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(model: HybridLM) -> dict:
    """The ``provenance`` section of config.yaml: git revision, package version, time, and what analysis
    reads without building the model: the layer plan and the parameter counts (rundir.LAYERS_KEY, PARAMS_KEY)."""
    counts = count_params(model)
    return {
        "git_revision": git_revision(),
        "package_version": __version__,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        LAYERS_KEY: [{k: layer[k] for k in LAYER_FIELDS} for layer in counts["layers"]],
        PARAMS_KEY: {k: counts[k] for k in PARAM_FIELDS},
    }


def check_same_run(run_dir: Path, cfg: RunConfig, checkpoint: Path | None = None) -> None:
    """A run directory belongs to one config; only the keys tagged resumable or bookkeeping
    (config/roles.py) may change between invocations.

    The config is compared with ``config.yaml`` and with the config stored in ``checkpoint`` (the
    one training would resume from), so that a lost or edited ``config.yaml`` cannot resume a
    checkpoint under another model.
    """
    old = read_config_dict(run_dir)
    if old is not None:
        old.pop(PROVENANCE_KEY, None)
        _check_same(run_dir, old, cfg, CONFIG_FILE)
    stored = read_checkpoint_meta(checkpoint)["config"] if checkpoint is not None else None
    if stored is not None:
        _check_same(run_dir, stored, cfg, f"{CKPT_DIR}/{checkpoint.name}")


def _compared(key: str, value):
    """``data.files`` by file name: where the files lie is a location, so a run directory moved or unpacked
    on another machine or checkout (the data elsewhere) holds the same run; what the files hold is checked
    by the data fingerprint when training resumes (``recorded_data``)."""
    if key == "data.files" and isinstance(value, (list, tuple)):
        return [Path(v).name for v in value]
    return value


def _check_same(run_dir: Path, old: dict, cfg: RunConfig, source: str) -> None:
    a, b = flatten(old), flatten(config_to_dict(cfg))
    changed = sorted(k for k in a.keys() | b.keys() if _compared(k, a.get(k)) != _compared(k, b.get(k)))
    blocking = [k for k in changed if not may_change_on_resume(k)]
    if blocking:
        diffs = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in blocking[:8])
        raise ValueError(f"{run_dir} holds a run with another config (by its {source}: {diffs}); use another --run-dir")


def check_extension(cfg: RunConfig, checkpoint: Path | None, step: int) -> None:
    """A changed ``train.max_steps`` is taken only where every step already trained keeps its learning
    rate under the new schedule (constant; WSD before its decay began; cosine within its warmup), so
    that the run ends as one trained with the new ``train.max_steps`` from the start; else a ``ValueError``."""
    old = read_checkpoint_meta(checkpoint)["config"] if checkpoint is not None else None
    if old is None or old["train"]["max_steps"] == cfg.train.max_steps:
        return
    before, after = validate_config(old).train, cfg.train
    changed = next((s for s in range(step) if lr_factor(s, before) != lr_factor(s, after)), None)
    if changed is not None:
        raise ValueError(
            f"train.max_steps: {before.max_steps} -> {after.max_steps} would change the learning rate of step {changed}, "
            f"already trained, under train.schedule={after.schedule} (it depends on train.max_steps"
            f"{' once its decay began' if after.schedule == 'wsd' else ''}): the run would not equal one trained for "
            f"{after.max_steps} steps; train that as a new run (another --run-dir), or plan runs to extend with "
            "train.schedule=constant or wsd")


def recorded_data(run_dir: Path, checkpoint: Path | None) -> dict | None:
    """The data fingerprint (``data.integrity.fingerprint``) a run recorded: the checkpoint's it resumes
    from, else config.yaml's; None for a new run."""
    stored = read_checkpoint_meta(checkpoint).get("data") if checkpoint is not None else None
    return stored or ((read_config_dict(run_dir) or {}).get(PROVENANCE_KEY) or {}).get(DATA_KEY)
