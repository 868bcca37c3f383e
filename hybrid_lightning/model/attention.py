"""The one attention dispatch: causal attention with an optional sliding window.

Window semantics, the same in every backend: a query at position t sees the key
positions t-W+1 ... t (W tokens, the current one included), i.e. flash-attn's
``window_size=(W-1, 0)`` with ``causal=True``. ``window=None`` is full causal attention.

Queries are aligned to the end of the keys (so a KV cache of past keys may precede
them): with ``Tq`` queries and ``Tk >= Tq`` keys, query ``i`` sits at key position
``Tk - Tq + i``.

Backends (``model.attn_backend``):
- ``reference``: explicit scores and a (Tq, Tk) mask; the ground truth the others are tested against.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; causal without a mask when it can,
  else a dense (Tq, Tk) mask (fine for short sequences, slow and memory-hungry for long windowed ones).
- ``blocked``: sliding-window attention on CPU in time and memory linear in T (``blocked.py``);
  full attention falls back to ``sdpa``.
- ``flash``: flash-attn's ``flash_attn_func`` (Dao 2023, arXiv 2307.08691); CUDA, fp16/bf16 only.
- ``flex``: FlexAttention (Dong et al. 2024, arXiv 2412.05496), compiled, with a block-sparse mask;
  on CUDA for training, on CPU forward-only (evaluation under ``torch.no_grad``).
- ``auto``: on CUDA ``flash`` when flash-attn is installed and the inputs are fp16/bf16, else ``sdpa``
  for full attention and ``flex`` for windows or packed documents; on CPU ``sdpa`` for full attention, ``blocked``
  for windows.

Packed documents (``doc_ids`` (B, T), see ``documents.py``; no KV cache): a query sees only keys of its
own document, in every backend: ``reference`` and ``sdpa`` by a (B, T, T) mask, ``blocked`` by a
per-block document mask, ``flex`` by a document ``mask_mod``, ``flash`` by its varlen interface
(``cu_seqlens``; checked on CPU against a stand-in with flash-attn's documented semantics,
tests/test_documents.py; flash-attn itself needs CUDA).

Asking for a backend that cannot run here (``flash`` without flash-attn or CUDA, ``blocked`` off CPU,
``flex`` with gradients on CPU) is a ``ValueError`` naming ``model.attn_backend``.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch
import torch.nn.functional as F

from hybrid_lightning.model.blocked import blocked_attention
from hybrid_lightning.model.documents import cu_seqlens, same_document

BACKENDS = ("auto", "reference", "sdpa", "blocked", "flash", "flex")
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None  # installed; imported on first use only


@functools.cache
def flash_attn_error() -> Exception | None:
    """Why flash-attn, installed, does not import (a CUDA or torch version mismatch), or None when it does or is
    not installed; ``auto`` takes it only when it imports, and the run plan names a failure (plan/kernels.py)."""
    if not HAS_FLASH_ATTN:
        return None
    try:
        import flash_attn  # noqa: F401
    except Exception as e:
        return e
    return None


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int | None, backend: str = "auto",
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh), Hkv dividing H, Tq <= Tk; doc_ids: (B, T) with Tq = Tk = T,
    or None. Returns (B, H, Tq, Dh)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {list(BACKENDS)}")
    Tq, Tk = q.shape[2], k.shape[2]
    assert Tq <= Tk, (Tq, Tk)
    assert doc_ids is None or doc_ids.shape == (q.shape[0], Tq) and Tq == Tk, "doc_ids need queries = keys"
    if window is not None and window >= Tk:
        window = None  # the window covers every key: full causal attention
    if backend == "auto":
        backend = auto_backend(q, window, documents=doc_ids is not None)
    check_backend(backend, q, k, v)
    if backend == "flash":
        return flash_attention(q, k, v, window) if doc_ids is None else flash_varlen(q, k, v, window, doc_ids)
    if backend == "flex":
        return flex(q, k, v, window, doc_ids)
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if backend == "reference":
        return reference_attention(q, k, v, window, doc_ids)
    if backend == "blocked" and window is not None:
        return blocked_attention(q, k, v, window, doc_ids)
    if window is None and Tq == Tk and doc_ids is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(Tq, Tk, window, q.device, doc_ids))


def auto_backend(q: torch.Tensor, window: int | None, documents: bool = False) -> str:
    """The backend ``auto`` picks for queries like ``q`` (see the module docstring); packed ``documents`` on
    CUDA without flash-attn go to ``flex``, whose block mask skips what SDPA's dense (B, T, T) mask computes."""
    return auto_choice(q.is_cuda, q.dtype in (torch.float16, torch.bfloat16), window is not None, documents)


def auto_choice(cuda: bool, half: bool, windowed: bool, documents: bool) -> str:
    """What ``auto`` takes on CUDA or CPU, for fp16/bf16 inputs or not, windowed or full, packed documents or not;
    ``auto_backend`` per call and the run plan before training (plan/kernels.py) both ask here."""
    if cuda:
        if HAS_FLASH_ATTN and flash_attn_error() is None and half:
            return "flash"
        return "sdpa" if not windowed and not documents else "flex"
    return "blocked" if windowed else "sdpa"


def check_backend(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raises ``ValueError`` when ``backend`` cannot run on these inputs, saying what would."""
    where = f"model.attn_backend={backend!r}"
    if backend == "flash":
        if not HAS_FLASH_ATTN:
            raise ValueError(f"{where} needs the flash-attn package (pip install 'hybrid-lightning[gpu]' on a CUDA "
                             "machine); use 'auto', 'flex' or 'sdpa'")
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{where} needs CUDA tensors in fp16 or bf16 (train.precision=bf16-mixed on a GPU); "
                             f"got {q.dtype} on {q.device.type}")
    elif backend == "blocked" and q.device.type != "cpu":
        raise ValueError(f"{where} is the CPU sliding-window path; on {q.device.type} use 'auto', 'flash' or 'flex'")
    elif backend == "flex" and not q.is_cuda and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(f"{where} runs forward-only on CPU (evaluation under torch.no_grad); "
                         "for training on CPU use 'auto' or 'blocked'")


def causal_mask(
    Tq: int, Tk: int, window: int | None, device: torch.device | None = None, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """(Tq, Tk) boolean mask, True where query i (at key position Tk-Tq+i) may see key j; with ``doc_ids``
    (B, T) a (B, 1, T, T) mask that also hides the keys of other documents."""
    qpos = torch.arange(Tk - Tq, Tk, device=device)[:, None]
    kpos = torch.arange(Tk, device=device)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= qpos - kpos < window
    return allowed if doc_ids is None else (allowed & same_document(doc_ids))[:, None]


def attention_probs(q: torch.Tensor, k: torch.Tensor, window: int | None,
                    doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention weights (B, H, Tq, Tk), in at least fp32, of queries q (B, H, Tq, Dh) over keys
    k (B, Hkv, Tk, Dh), Hkv dividing H: causal, within ``window``, queries aligned to the end of the keys,
    within their document when ``doc_ids`` (B, T) are given."""
    dtype = torch.promote_types(q.dtype, torch.float32)  # at least fp32 scores and softmax
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Tk, Dh)
    scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], window, q.device, doc_ids), float("-inf"))
    return scores.softmax(dim=-1)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain softmax attention over explicit scores (``attention_probs``); q, k, v: (B, H, T*, Dh) with equal heads."""
    probs = attention_probs(q, k, window, doc_ids)  # (B, H, Tq, Tk)
    return (probs @ v.to(probs.dtype)).to(q.dtype)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """flash-attn with its native GQA; it aligns a causal window to the end of the keys as ``attend`` does."""
    from flash_attn import flash_attn_func

    window_size = (-1, -1) if window is None else (window - 1, 0)
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window_size=window_size)
    return out.transpose(1, 2)  # (B, Tq, H, Dh) -> (B, H, Tq, Dh)


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                 doc_ids: torch.Tensor) -> torch.Tensor:
    """flash-attn's varlen interface over the documents of the B rows laid end to end (``cu_seqlens``):
    each document attends causally within itself, in its own window."""
    from flash_attn import flash_attn_varlen_func

    B, H, T, Dh = q.shape
    cu, longest = cu_seqlens(doc_ids)
    window_size = (-1, -1) if window is None else (window - 1, 0)
    q, k, v = (t.transpose(1, 2).reshape(B * T, t.shape[1], Dh) for t in (q, k, v))  # (B*T, H | Hkv, Dh)
    out = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True, window_size=window_size)
    return out.view(B, T, H, Dh).transpose(1, 2)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
         doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Compiled FlexAttention with the block mask of (Tq, Tk, window), cached per shape; with ``doc_ids`` a
    block mask of those documents, made for this call."""
    if doc_ids is None:
        mask = flex_block_mask(q.shape[2], k.shape[2], window, str(q.device))
    else:
        mask = flex_document_mask(doc_ids, window)
    return _compiled_flex()(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _as_tensor(value: int, device: str) -> torch.Tensor:
    """An int a mask reads, as a 0-dim tensor: the compiled FlexAttention then takes it as an input rather than
    guarding on its value. Closed-over ints recompiled it for each window, key offset and window-or-full; past
    torch's recompile limit (8) it ran unfused, materialising the (Tq, Tk) scores (seen on an H200: the 7th shape
    of the GPU check's correctness section)."""
    return torch.tensor(value, device=device)


@functools.lru_cache(maxsize=64)
def flex_block_mask(Tq: int, Tk: int, window: int | None, device: str):
    """FlexAttention block mask: query i (at key position Tk-Tq+i) sees key j iff 0 <= pos - j < window.

    Blocks of the (Tq, Tk) grid the mask leaves empty are skipped, so a window costs O(T W)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset, reach = _as_tensor(Tk - Tq, device), _as_tensor(Tk + 1 if window is None else window, device)

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx + offset - kv_idx
        return (distance >= 0) & (distance < reach)

    return create_block_mask(mask_mod, None, None, Tq, Tk, device=device)


def flex_document_mask(doc_ids: torch.Tensor, window: int | None):
    """FlexAttention block mask of packed documents (B, T): query i sees key j iff j <= i, i - j < window
    and both lie in one document (torchtitan's document mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    reach = _as_tensor(doc_ids.shape[1] + 1 if window is None else window, str(doc_ids.device))

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < reach) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    B, T = doc_ids.shape
    return create_block_mask(mask_mod, B, None, T, T, device=str(doc_ids.device))
