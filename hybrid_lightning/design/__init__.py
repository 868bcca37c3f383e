"""The model's design, resolved from the config: the layer plan and each layer's frozen options
(``plan.py``), parameter matching (``matching.py``), the memory estimate (``memory.py``), and the model
built from a ``model:`` section (``build_model``). The model code below it (``hybrid_lightning.model``)
reads only the options this resolves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from hybrid_lightning.config import ModelConfig, validate_config
from hybrid_lightning.design.matching import matched_plan
from hybrid_lightning.design.plan import layer_plan, model_options, plan_string
from hybrid_lightning.model import BYTE_VOCAB, HybridLM


def resolve_model_config(cfg: ModelConfig | Mapping, vocab_size: int | None = None) -> ModelConfig:
    """Validates a ``model:`` section given as a dict or config and fills the vocabulary size
    (``vocab_size``, else the byte tokenizer's) when the config leaves it open."""
    if not isinstance(cfg, ModelConfig):
        cfg = validate_config({"model": dict(cfg)}).model
    if cfg.vocab_size is None:
        cfg = cfg.model_copy(update={"vocab_size": vocab_size or BYTE_VOCAB})
    return cfg


def load_trained(cfg: ModelConfig | Mapping, path: str | Path, vocab_size: int | None = None) -> tuple[HybridLM, dict]:
    """The model of ``cfg`` (on the CPU) with the weights of the training checkpoint at ``path``, and the
    checkpoint itself: its ``state_dict`` holds the model's weights under ``model.`` (the training system's
    attribute), with ``global_step`` and the other training state beside it."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = build_model(cfg, vocab_size)
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    return model, ckpt


def build_model(cfg: ModelConfig | Mapping, vocab_size: int | None = None) -> HybridLM:
    """Builds the hybrid LM from the ``model:`` section (a dict or a ``ModelConfig``)."""
    cfg = resolve_model_config(cfg, vocab_size)
    return HybridLM(model_options(cfg), matched_plan(cfg))


__all__ = ["build_model", "layer_plan", "load_trained", "plan_string", "resolve_model_config"]
