"""Model code: plain torch, never imports Lightning.

The network is built from frozen options (``model/options.py``) that the layer plan resolves from the
``model:`` section (``model/plan.py``); only ``build_model`` and its helpers here validate a config.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from hybrid_lightning.config import ModelConfig, validate_config
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.matching import matched_plan
from hybrid_lightning.model.options import LayerSpec, ModelOptions
from hybrid_lightning.model.plan import layer_plan, model_options, plan_string
from hybrid_lightning.model.transformer import HybridLM, count_params

BYTE_VOCAB = 257  # 256 bytes + end-of-document


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


__all__ = ["BYTE_VOCAB", "HybridLM", "LayerSpec", "ModelOptions", "build_model", "count_params", "layer_plan", "load_trained", "plan_string", "resolve_model_config"]


def model_flops_per_token(model: HybridLM, T: int) -> float:
    """Training FLOPs per token at length T, forward and backward (PaLM, Chowdhery et al. 2022, appendix B):
    6 per matmul weight (forward 2, backward 4); in each attention layer 12 d per key a query sees
    (QK^T and PV, forward and backward), counting only the keys a causal or windowed query sees; in each
    recurrent layer its operator's matmuls in the chunked form (the mixer's optional ``flops_per_token``).
    tests/test_perf.py checks the count against torch's FlopCounterMode."""
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))  # with the head
    sequence = 0.0
    d = model.opts.d_model
    for spec, layer in zip(model.plan, model.layers):
        if KINDS[spec.mixer].attention:
            W = min(spec.window or T, T)
            keys = (W * (W + 1) / 2 + (T - W) * W) / T  # mean over queries t of min(t + 1, W)
            sequence += 12 * d * keys
        elif hasattr(layer.mixer, "flops_per_token"):  # a mixer without one counts its weights only
            sequence += layer.mixer.flops_per_token(T)
    return 6 * matmul + sequence
