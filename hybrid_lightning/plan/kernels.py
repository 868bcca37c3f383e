"""The fast paths a run takes, resolved once before it trains and recorded in its plan (``RunPlan.kernels``):
the attention kernel of each attention mixer, the recurrent backend, ``torch.compile``. Training names them in
its start line and in TensorBoard's config text, ``--dry-run`` prints them.

No silent fallback. On CUDA, ``auto`` takes fla's kernels for recurrent layers and flash-attn for attention;
where fla fails to import (absent, or triton failing) the recurrent layers would run the pure-torch chunked
operators, and where flash-attn is installed but fails to import attention would run SDPA or FlexAttention.
Either is a ``SlowKernelWarning`` naming the exception and the cost, or, with ``model.require_fast_kernels``
(null = true when the run trains on CUDA), a ``ValueError`` naming the key. flash-attn not installed at all is
``auto``'s documented choice (SDPA's fused kernel for full attention, FlexAttention for windows), named, not
warned. A backend set explicitly that cannot import on CUDA is refused here, before training.
"""

from __future__ import annotations

import warnings

from hybrid_lightning.config import RunConfig
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.attention import HAS_FLASH_ATTN, auto_choice, flash_attn_error
from hybrid_lightning.model.ops.common import auto_choice as auto_recurrent
from hybrid_lightning.model.ops.common import fla_error
from hybrid_lightning.plan.precision import autocast_dtype, unmeasured_note
from hybrid_lightning.runplan import Kernels

# What falling back costs. Neither is measured on a GPU in analysis/results/bench (no GPU run of
# bench.gpu_recurrent or of the attention section is committed): the figures are estimates, said as such.
FLA_FALLBACK_COST = ("the recurrent layers run the pure-torch chunked operators instead of fla's Triton kernels: "
                     "several times slower per recurrent layer (estimated; not measured on a GPU here: "
                     "python -m hybrid_lightning.bench.gpu_recurrent measures the two paths)")
FLASH_FALLBACK_COST = ("attention runs SDPA (full) or FlexAttention (windows) instead of flash-attn: within a small "
                       "factor for full attention (SDPA's own fused kernel), unmeasured for windows")


class SlowKernelWarning(UserWarning):
    """A run on CUDA falls back from a fast kernel that failed to import (``resolve_kernels``)."""


def resolve_kernels(cfg: RunConfig, precision: str, device: str) -> Kernels:
    """The fast paths of the resolved run ``cfg`` training on ``device`` (``cuda`` or ``cpu``) in ``precision`` (a
    Lightning precision string); warns or refuses a fallback as the module docstring says."""
    m, cuda = cfg.model, device == "cuda"
    kinds = [KINDS[name] for name in m.mixers_used]
    half = autocast_dtype(precision) is not None
    attention = {}
    for k in (k for k in kinds if k.attention):
        windowed = k.has_window and m.window < cfg.train.seq_len  # a window over every key is full attention
        auto = auto_choice(cuda, half, windowed, cfg.data.doc_mask)
        attention[k.name] = auto if m.attn_backend == "auto" else m.attn_backend
    recurrent = None
    if any(k.recurrent for k in kinds):
        recurrent = auto_recurrent(cuda) if m.recurrent_backend == "auto" else m.recurrent_backend
    notes = [note for note in (unmeasured_note(cfg.train, m),) if note]
    if cuda:
        notes += _fallbacks(m, bool(attention), recurrent is not None)
    return Kernels(device, attention, recurrent, cfg.train.compile, tuple(notes))


def _fallbacks(m, attention: bool, recurrent: bool) -> list[str]:
    """On CUDA: the fast kernels of the model ``m`` that failed to import, each refused (an explicit backend, or
    ``model.require_fast_kernels``) or warned about; returns the warnings' sentences."""
    failed = []
    if recurrent and fla_error() is not None:
        failed.append(("model.recurrent_backend", m.recurrent_backend, "fla", fla_error(), FLA_FALLBACK_COST))
    if attention and HAS_FLASH_ATTN and flash_attn_error() is not None:
        failed.append(("model.attn_backend", m.attn_backend, "flash", flash_attn_error(), FLASH_FALLBACK_COST))
    require = m.require_fast_kernels is not False  # null = true on CUDA, where this runs
    said = []
    for key, backend, fast, error, cost in failed:
        why = f"{fast} failed to import ({type(error).__name__}: {error})"
        if backend == fast:
            raise ValueError(f"{key}={fast!r} on CUDA, but {why}; install it (pip install -e '.[gpu]') or use 'auto'")
        if backend != "auto":
            continue
        sentence = f"{key} auto on CUDA: {why}, so {cost}"
        if require:
            setting = "null (true on CUDA)" if m.require_fast_kernels is None else "true"
            raise ValueError(f"{sentence}. model.require_fast_kernels is {setting}: "
                             "fix the import, or set model.require_fast_kernels: false to train anyway")
        warnings.warn(sentence, SlowKernelWarning, stacklevel=3)
        said.append(sentence)
    return said
