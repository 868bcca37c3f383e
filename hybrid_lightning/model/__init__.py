"""Model code: plain torch, never imports Lightning, pydantic or the config.

The network is built from frozen options (``model/options.py``); ``hybrid_lightning.design`` resolves
them from the ``model:`` section (the layer plan, parameter matching) and builds models
(``design.build_model``)."""

from __future__ import annotations

from torch import nn

from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.options import LayerSpec, ModelOptions
from hybrid_lightning.model.transformer import HybridLM, count_params

BYTE_VOCAB = 257  # 256 bytes + end-of-document

__all__ = ["BYTE_VOCAB", "HybridLM", "LayerSpec", "ModelOptions", "count_params", "model_flops_per_token"]


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
