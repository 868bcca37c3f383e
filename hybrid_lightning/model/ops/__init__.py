"""Sequence operators of the recurrent mixers, each in three implementations behind one dispatch.

- ``recurrent``: the step-by-step recurrence in plain torch, one token at a time; the ground truth.
- ``chunked``: the same recurrence computed chunk by chunk in plain torch (quadratic inside a chunk,
  recurrent across chunks); the training path on CPU.
- ``compiled``: ``chunked`` under ``torch.compile``, compiled once per chunk count (bench ``work``).
- ``fla``: the flash-linear-attention Triton kernel; on CUDA (the ``gpu`` extra), or on CPU under
  Triton's interpreter with ``TRITON_INTERPRET=1`` (the ``fla-cpu`` extra; ``interpreter.py``), slowly.
- ``auto``: ``fla`` for CUDA tensors when fla is importable, else ``chunked``.

Every operator takes ``(B, T, H, *)`` tensors and an optional ``(B, H, K, V)`` state and returns the
output and the final state, so that a sequence fed in pieces equals one full call. Packed documents
(``cu_seqlens``) go to the ``fla`` kernels in one call; the torch backends run each document alone.
"""

from hybrid_lightning.model.ops.common import BACKENDS, fla_available, fla_error, resolve_backend
from hybrid_lightning.model.ops.delta_rule import chunked_delta_rule_flops, gated_delta_rule
from hybrid_lightning.model.ops.gated_linear import chunked_gla_flops, gated_linear_attention
from hybrid_lightning.model.ops.short_conv import ShortConv

__all__ = ["BACKENDS", "ShortConv", "chunked_delta_rule_flops", "chunked_gla_flops", "fla_available", "fla_error",
           "gated_delta_rule", "gated_linear_attention", "resolve_backend"]
