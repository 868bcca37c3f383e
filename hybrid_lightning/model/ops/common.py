"""Backend dispatch and the chunking helpers shared by the recurrent operators."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from hybrid_lightning.interpreter import interpreting, patched

BACKENDS = ("auto", "chunked", "compiled", "recurrent", "fla")


@functools.cache
def fla_error() -> Exception | None:
    """Why flash-linear-attention's kernels do not import (they need triton: a CUDA build, or Triton's
    interpreter on CPU), or None when they do. Any exception counts: an ImportError, or triton failing to
    find a driver or to compile at import; the run plan names it before training (plan/kernels.py)."""
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
        import fla.ops.simple_gla  # noqa: F401
    except Exception as e:
        return e
    return None


def fla_available() -> bool:
    """Whether flash-linear-attention's kernels import (``fla_error``)."""
    return fla_error() is None


@functools.cache
def compiled(fn):
    """``fn`` (a chunked operator) under ``torch.compile`` (inductor), made once per operator. Each new chunk
    count, and inference beside training, is a compilation of its own (about 1-2 minutes on one CPU core)."""
    return torch.compile(fn)


def chunked_form(fn, backend: str):
    """The chunked operator ``fn`` as ``backend`` runs it: itself for ``chunked``, compiled for ``compiled``."""
    return compiled(fn) if backend == "compiled" else fn


def check_documents(backend: str, cu_seqlens: torch.Tensor | None, state: torch.Tensor | None) -> None:
    """Packed documents (``cu_seqlens``) go to fla's kernels only, each document from a zero state."""
    if cu_seqlens is not None and (backend != "fla" or state is not None):
        raise ValueError(f"cu_seqlens needs the fla backend (not {backend!r}) and no initial state; the other "
                         "backends run each document alone (model/documents.by_document)")


def auto_choice(cuda: bool) -> str:
    """What ``auto`` takes on CUDA or CPU: ``resolve_backend`` per call and the run plan before training ask here."""
    return "fla" if cuda and fla_available() else "chunked"


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """The implementation to run for ``model.recurrent_backend`` on tensors like ``x``."""
    if backend not in BACKENDS:
        raise ValueError(f"model.recurrent_backend: {backend!r} is not one of {list(BACKENDS)}")
    if backend == "auto":
        return auto_choice(x.is_cuda)
    if backend == "fla" and not x.is_cuda:
        if not interpreting():
            raise ValueError(
                f"model.recurrent_backend='fla' runs on CUDA, or on CPU under Triton's interpreter "
                f"(TRITON_INTERPRET=1, the fla-cpu extra), but this forward runs on {x.device.type}; "
                "use 'auto' or 'chunked'"
            )
        if not patched():
            raise ValueError("model.recurrent_backend='fla' on CPU: Triton's interpreter needs the package's patches, "
                             "applied at the start of the process: hybrid-lightning applies them when "
                             "TRITON_INTERPRET=1 is set; a script calls hybrid_lightning.interpreter.patch() first")
    if backend == "fla" and not fla_available():
        raise ValueError(
            "model.recurrent_backend='fla' needs flash-linear-attention (pip install -e '.[gpu]'), "
            "which is not importable here; use 'auto' or 'chunked'"
        )
    return backend


def chunk_cost(T: int, chunk_size: int) -> tuple[int, float]:
    """(C, padding factor) of the chunked form at length T: the chunk size it uses and the steps it
    computes per real step (T padded up to whole chunks)."""
    C = min(chunk_size, T)
    return C, -(-T // C) * C / T


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The torch paths compute in at least fp32 (fp64 stays fp64), whatever the input precision."""
    return torch.promote_types(x.dtype, torch.float32)


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a kernel should see: the autocast dtype when autocast is on, else ``x``'s."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def end_to_end(x: torch.Tensor) -> torch.Tensor:
    """(B, T, *F) -> (1, B*T, *F): the rows laid end to end, as fla's kernels take packed documents
    (with ``cu_seqlens``)."""
    return x.reshape(1, -1, *x.shape[2:])


def to_chunks(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, T, H, *F) -> (B, H, n, size, *F), zero-padded at the end to n * size steps.

    Zero padding is neutral for both operators: a padded step has zero key, value and
    log-decay (and zero beta), so it changes neither the real outputs nor the final state.
    """
    T = x.shape[1]
    x = x.movedim(1, 2)  # (B, H, T, *F)
    pad = -T % size
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], -1, size, *x.shape[3:]).contiguous()


def from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, n, C, F) -> (B, T, H, F), dropping the padding."""
    return x.flatten(2, 3)[:, :, :T].movedim(2, 1)


def segment_decay(b: torch.Tensor) -> torch.Tensor:
    """b: (..., C) cumulative log-decay inside a chunk -> (..., C, C): exp(b_i - b_j) for j <= i, else 0.

    The upper triangle is masked before the exponential, where b_i - b_j > 0 could overflow. Not
    differentiated: ``decayed`` and the delta rule's solve give b its gradient themselves.
    """
    C = b.shape[-1]
    upper = torch.ones(C, C, dtype=torch.bool, device=b.device).triu(1)
    return (b[..., :, None] - b[..., None, :]).masked_fill_(upper, float("-inf")).exp_()


def decay_gradient(*pairs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The gradient of b through products Y = P * segment_decay(b), from pairs (dL/dY, Y): with
    M = Σ dL/dY * Y, dL/db_i = Σ_j M_ij - Σ_j M_ji (b_i enters row i with +, column i with -)."""
    (grad, y), *rest = pairs
    m = grad * y
    for grad, y in rest:
        m.addcmul_(grad, y)
    return m.sum(-1) - m.sum(-2)


class _Decayed(torch.autograd.Function):
    """(b, P) -> P * segment_decay(b), with 4 passes over the (C, C) blocks backward where autograd makes 6."""

    @staticmethod
    def forward(ctx, b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        d = segment_decay(b)
        y = p * d
        ctx.save_for_backward(d, y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d, y = ctx.saved_tensors
        return decay_gradient((grad, y)), grad * d


def decayed(b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """b: (..., C) cumulative log-decay, p: (..., C, C) -> p * exp(b_i - b_j) below and on the diagonal, 0 above."""
    return _Decayed.apply(b, p)
