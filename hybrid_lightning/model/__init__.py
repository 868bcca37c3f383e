"""Model code: plain torch, never imports Lightning, pydantic or the config.

The network is built from frozen options (``hybrid_lightning/kinds/``); ``hybrid_lightning.plan`` resolves
them from the ``model:`` section (the layer plan, parameter matching) and builds models (``plan.build_model``)."""

from __future__ import annotations

from torch import nn

from hybrid_lightning.kinds import KINDS, LayerSpec, ModelOptions
from hybrid_lightning.model.transformer import Block, HybridLM

BYTE_VOCAB = 257  # 256 bytes + end-of-document

__all__ = ["BYTE_VOCAB", "Block", "HybridLM", "LayerSpec", "ModelOptions", "block_flops_per_token", "matmul_weights"]


def matmul_weights(module: nn.Module) -> int:
    """The weights of ``module``'s matmuls (its ``nn.Linear`` layers; a shared weight once)."""
    weights = {id(m.weight): m.weight for m in module.modules() if isinstance(m, nn.Linear)}
    return sum(w.numel() for w in weights.values())


def block_flops_per_token(block: Block, T: int) -> float:
    """Training FLOPs per token of one block at length T, forward and backward (PaLM, Chowdhery et al. 2022,
    appendix B): 6 per matmul weight (forward 2, backward 4); in an attention layer 12 d per key a query sees
    (QK^T and PV, forward and backward), counting only the keys a causal or windowed query sees, head by head
    (``head_windows``); in a recurrent layer its operator's matmuls in the chunked form (the mixer's optional
    ``flops_per_token``; a mixer without one counts its weights only). plan/count.py sums these over a plan;
    tests/test_perf.py checks the sum against torch's FlopCounterMode."""
    spec = block.spec
    sequence = 0.0
    if KINDS[spec.mixer].attention:
        windows = getattr(block.mixer, "head_windows", (spec.window,))  # each head's (a head-wise layer's differ)
        Ws = [min(w or T, T) for w in windows]
        keys = sum((W * (W + 1) / 2 + (T - W) * W) / T for W in Ws) / len(Ws)  # mean over queries t of min(t + 1, W)
        sequence = 12 * block.mixer_norm.weight.numel() * keys  # 12 d per key, d/H per key of each head
    elif hasattr(block.mixer, "flops_per_token"):
        sequence = block.mixer.flops_per_token(T)
    return 6 * matmul_weights(block) + sequence
