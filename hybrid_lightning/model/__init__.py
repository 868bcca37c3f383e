"""Model code: plain torch, never imports Lightning."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from hybrid_lightning.config import ModelConfig, validate_config
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.plan import LayerSpec, layer_plan, plan_string
from hybrid_lightning.model.transformer import HybridLM

BYTE_VOCAB = 257  # 256 bytes + end-of-document


def resolve_model_config(cfg: ModelConfig | Mapping, vocab_size: int | None = None) -> ModelConfig:
    """Validates a ``model:`` section given as a dict or config and fills the vocabulary size
    (``vocab_size``, else the byte tokenizer's) when the config leaves it open."""
    if not isinstance(cfg, ModelConfig):
        cfg = validate_config({"model": dict(cfg)}).model
    if cfg.vocab_size is None:
        cfg = cfg.model_copy(update={"vocab_size": vocab_size or BYTE_VOCAB})
    return cfg


def build_model(cfg: ModelConfig | Mapping, vocab_size: int | None = None) -> HybridLM:
    """Builds the hybrid LM from the ``model:`` section (a dict or a ``ModelConfig``)."""
    return HybridLM(resolve_model_config(cfg, vocab_size))


def count_params(model: HybridLM) -> dict:
    """Parameter counts: embedding (input embedding + untied output head), non-embedding, per layer."""
    emb = model.embed.weight.numel()
    if model.lm_head.weight is not model.embed.weight:
        emb += model.lm_head.weight.numel()
    layers = []
    for spec, block in zip(model.plan, model.layers):
        mixer = sum(p.numel() for p in block.mixer.parameters())
        mlp = sum(p.numel() for p in block.mlp.parameters())
        norms = sum(p.numel() for p in block.mixer_norm.parameters()) + sum(p.numel() for p in block.mlp_norm.parameters())
        layers.append(
            {"layer": spec.index, "kind": spec.mixer, "letter": spec.letter, "window": spec.window, "pos": spec.pos,
             "mixer": mixer, "mlp": mlp, "norm": norms, "total": mixer + mlp + norms}
        )
    non_emb = sum(layer["total"] for layer in layers) + sum(p.numel() for p in model.norm.parameters())
    return {"embedding": emb, "non_embedding": non_emb, "total": emb + non_emb, "layers": layers}


__all__ = ["BYTE_VOCAB", "HybridLM", "LayerSpec", "build_model", "count_params", "layer_plan", "plan_string", "resolve_model_config"]


def model_flops_per_token(model: HybridLM, T: int) -> float:
    """Training FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): 6 per matmul weight (forward 2,
    backward 4) plus 12 d per visible key in each attention layer (QK^T and PV, forward and backward),
    counting only the keys a causal or windowed query sees. Recurrent mixers count their weights only."""
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))  # with the head
    attention = 0.0
    d = model.cfg.d_model
    for spec in model.plan:
        if KINDS[spec.mixer].attention:
            W = min(spec.window or T, T)
            keys = (W * (W + 1) / 2 + (T - W) * W) / T  # mean over queries t of min(t + 1, W)
            attention += 12 * d * keys
    return 6 * matmul + attention
