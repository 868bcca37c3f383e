"""Models built from a run plan's layers (or from a ``model:`` section, planned on the way), and a trained
model from a checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from hybrid_lightning.config import ModelConfig, validate_config
from hybrid_lightning.kinds import ModelOptions
from hybrid_lightning.model import BYTE_VOCAB, HybridLM
from hybrid_lightning.plan.layers import model_options
from hybrid_lightning.plan.matching import matched_plan
from hybrid_lightning.runplan import RunPlan


def resolve_model_config(cfg: ModelConfig | Mapping, vocab_size: int | None = None) -> ModelConfig:
    """Validates a ``model:`` section given as a dict or config and fills the vocabulary size
    (``vocab_size``, else the byte tokenizer's) when the config leaves it open."""
    if not isinstance(cfg, ModelConfig):
        cfg = validate_config({"model": dict(cfg)}, model_only=True).model
    if cfg.vocab_size is None:
        cfg = cfg.model_copy(update={"vocab_size": vocab_size or BYTE_VOCAB})
    return cfg


def build_model(source: RunPlan | ModelConfig | Mapping, vocab_size: int | None = None) -> HybridLM:
    """The hybrid LM of a run plan (its model options and layers, as recorded), or of a ``model:`` section (a
    dict or a ``ModelConfig``, its layers planned here)."""
    if isinstance(source, RunPlan):
        specs = tuple(layer.spec() for layer in source.layers)  # a rebuilt plan refuses here, naming why
        return HybridLM(ModelOptions(**source.model), specs)
    cfg = resolve_model_config(source, vocab_size)
    return HybridLM(model_options(cfg), matched_plan(cfg))


def load_trained(source: RunPlan | ModelConfig | Mapping, path: str | Path) -> tuple[HybridLM, dict]:
    """The model of ``source`` (``build_model``, on the CPU) with the weights of the training checkpoint at ``path``,
    and the checkpoint itself: its ``state_dict`` holds the model's weights under ``model.`` (the training
    system's attribute), with ``global_step`` and the other training state beside it."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = build_model(source)
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    return model, ckpt
