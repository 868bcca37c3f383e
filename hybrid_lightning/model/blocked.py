"""Sliding-window attention on CPU in time and memory linear in T: the ``blocked`` backend.

Window W: a query at position t sees keys t-W+1 ... t. The first W query positions see every key
before them, so they are one causal call. The rest is cut into query blocks of S positions; block
j, starting at position s, needs the keys s-W+1 ... s+S-1: a window of K = W-1+S keys that starts
S after its neighbour's. All blocks go to PyTorch's CPU flash-attention kernel in one call, each
block as one "head", with the key windows passed as a strided view of the key sequence (overlapping
rows, no copy) and one (S, K) additive band mask shared by every block:

    key c of the window ->   0 . . . . . . W-1 . . . K-1
    query r = 0              x x x x x x x x . . . . .      x = visible, . = masked
    query r = 1              . x x x x x x x x . . . .      query r sees c in [r, r+W-1]
    query r = S-1            . . . . . x x x x x x x x

Each query scores K keys for the W it needs (K/W = 1 + (S-1)/W); a smaller S wastes less but gives
the kernel smaller tiles and overlaps the windows more (each key's gradient is computed K/S times,
then summed). ``block_size`` is the compromise measured on a 2-core CPU (see ``hybrid_lightning.bench``).

The kernel's op returns the softmax log-sum-exp that the public SDPA hides; a custom autograd
Function keeps it and calls the kernel's own backward, which makes the gradients exact to fp32
rounding without the zero-filled gradient buffers and copies of slicing and padding under autograd.
The backward runs over chunks of blocks, so the windows' K/S-fold key gradients never exist for
the whole sequence at once (measured at T=16384, W=512: 40% less peak memory, 10-25% less time
than one call).

Packed documents (one row's ``doc`` ids): the head's mask and each block's band also hide the keys of
other documents, so the band becomes one (S, K) mask per block; rows are then computed one by one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The CPU flash-attention kernel behind F.scaled_dot_product_attention, with its log-sum-exp.
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_cpu_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

CHUNK_QUERIES = 2048  # queries per backward call: bounds the windows' gradient buffers


def block_size(window: int) -> int:
    """Query block S for a window W: W/4 within [64, 512] (fastest of the sizes measured at W=128, 512, 2048)."""
    return min(max(window // 4, 64), 512)


def band_bias(n_queries: int, n_keys: int, first_query: int, window: int, dtype: torch.dtype) -> torch.Tensor:
    """(n_queries, n_keys) additive mask: 0 where query i (at key position first_query + i) sees key j, else -inf.

    In the dtype of the queries: the kernel reads an fp32 mask with fp64 queries as fp64."""
    qpos = torch.arange(first_query, first_query + n_queries)[:, None]
    kpos = torch.arange(n_keys)[None, :]
    hidden = (kpos > qpos) | (qpos - kpos >= window)
    return torch.zeros(n_queries, n_keys, dtype=dtype).masked_fill_(hidden, float("-inf"))


class _Layout:
    """Where the head (the first W positions) and the blocks lie for Tq queries ending at the T-th key."""

    def __init__(self, Tq: int, T: int, window: int):
        self.Tq, self.T, self.window = Tq, T, window
        self.past = T - Tq  # cached keys before the first query
        self.head = min(T, window)  # key positions < head: every query there sees every key before it
        self.head_q = self.head - self.past  # queries in the head
        self.P = window - 1  # keys before a block's first query
        self.S = block_size(window)
        self.rest = T - self.head  # queries after the head
        self.n = -(-self.rest // self.S)  # blocks
        self.pad = self.n * self.S - self.rest  # padding rows after the last query
        self.chunk = max(1, CHUNK_QUERIES // self.S)  # blocks per backward call

    def head_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """None when the head is plainly causal (no cached keys), else its (head_q, head) mask."""
        return None if self.past == 0 else band_bias(self.head_q, self.head, self.past, self.window, dtype)

    def document_biases(self, doc: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's (head_q, head) and the blocks' (1, n, S, K) masks (None without blocks) of one row whose
        tokens lie in the documents ``doc`` (T,), no cached keys: causal, within the window and the document."""
        padded = torch.cat([doc, doc[-1:].expand(self.pad)])  # (T + pad,): padding rows join the last document
        head = band_bias(self.head_q, self.head, 0, self.window, dtype)
        head.masked_fill_(padded[: self.head_q, None] != padded[None, : self.head], float("-inf"))
        if self.n == 0:
            return head, None
        queries = padded[self.head_q :].view(self.n, self.S)  # (n, S)
        keys = padded[self.head - self.P :].unfold(0, self.P + self.S, self.S)  # (n, K): the blocks' key windows
        band = band_bias(self.S, self.P + self.S, self.P, self.window, dtype).expand(self.n, -1, -1)
        return head, band.masked_fill(queries[:, :, None] != keys[:, None, :], float("-inf"))[None]

    def head_inputs(self, qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Padded (BH, L, Dh) inputs -> the head's (BH, 1, head_q, Dh) queries and (BH, 1, head, Dh) keys, values."""
        return qp[:, None, : self.head_q], kp[:, None, : self.head], vp[:, None, : self.head]

    def block_inputs(self, qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Padded (BH, L, Dh) inputs -> (BH, n, S, Dh) query blocks and (BH, n, K, Dh) overlapping key and
        value windows, all views: window j starts at key position head - P + jS."""
        BH, L, Dh = kp.shape
        size, stride = (BH, self.n, self.P + self.S, Dh), (L * Dh, self.S * Dh, Dh, 1)
        offset = (self.head - self.P) * Dh
        return (qp[:, self.head_q :].view(BH, self.n, self.S, Dh), kp.as_strided(size, stride, offset),
                vp.as_strided(size, stride, offset))


class _BlockedSWA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                doc: torch.Tensor | None) -> torch.Tensor:
        B, H, Tq, Dh = q.shape
        lay = _Layout(Tq, k.shape[2], window)
        doc_biases = None if doc is None else lay.document_biases(doc, q.dtype)
        # One padded copy of each input serves the head and the blocks, forward and backward.
        qp = F.pad(q.reshape(B * H, Tq, Dh), (0, 0, 0, lay.pad))  # (BH, Tq + pad, Dh)
        kp = F.pad(k.reshape(B * H, lay.T, Dh), (0, 0, 0, lay.pad))  # (BH, T + pad, Dh)
        vp = F.pad(v.reshape(B * H, lay.T, Dh), (0, 0, 0, lay.pad))
        ctx.lay, ctx.shape = lay, q.shape
        ctx.head_bias = lay.head_bias(q.dtype) if doc_biases is None else doc_biases[0]
        out_h, lse_h = _flash_cpu(*lay.head_inputs(qp, kp, vp), 0.0, ctx.head_bias is None, attn_mask=ctx.head_bias)
        if lay.n == 0:
            ctx.save_for_backward(qp, kp, vp, out_h, lse_h)
            return out_h.view(B, H, Tq, Dh)
        # (S, K) shared by every block, or one per block (1, n, S, K) with documents
        ctx.band_bias = band_bias(lay.S, lay.P + lay.S, lay.P, window, q.dtype) if doc_biases is None else doc_biases[1]
        out_b, lse_b = _flash_cpu(*lay.block_inputs(qp, kp, vp), 0.0, False, attn_mask=ctx.band_bias)
        ctx.save_for_backward(qp, kp, vp, out_h, lse_h, out_b, lse_b)
        out = torch.cat([out_h.view(B * H, lay.head_q, Dh), out_b.view(B * H, -1, Dh)[:, : lay.rest]], dim=1)
        return out.view(B, H, Tq, Dh)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        lay: _Layout = ctx.lay
        B, H, Tq, Dh = ctx.shape
        saved = ctx.saved_tensors  # read once: activation checkpointing allows one unpack
        qp, kp, vp, out_h, lse_h = saved[:5]
        gp = F.pad(grad.reshape(B * H, Tq, Dh), (0, 0, 0, lay.pad))  # (BH, Tq + pad, Dh)
        dq_h, dk_h, dv_h = _flash_cpu_backward(
            gp[:, None, : lay.head_q], *lay.head_inputs(qp, kp, vp), out_h, lse_h, 0.0, ctx.head_bias is None,
            attn_mask=ctx.head_bias,
        )  # (BH, 1, head_q | head, Dh)
        if lay.n == 0:
            return dq_h.reshape(B, H, Tq, Dh), dk_h.reshape(B, H, lay.T, Dh), dv_h.reshape(B, H, lay.T, Dh), None, None
        out_b, lse_b = saved[5:]
        qb, kw, vw = lay.block_inputs(qp, kp, vp)
        gb = gp[:, lay.head_q :].view(qb.shape)
        dq = torch.empty(B * H, Tq, Dh, dtype=qp.dtype)
        dq[:, : lay.head_q] = dq_h[:, 0]
        dk, dv = (torch.zeros(B * H, lay.T, Dh, dtype=kp.dtype) for _ in range(2))
        dk[:, : lay.head], dv[:, : lay.head] = dk_h[:, 0], dv_h[:, 0]
        # In chunks of blocks: the windows' key gradients are K/S times the keys they cover.
        for j0 in range(0, lay.n, lay.chunk):
            j = slice(j0, min(lay.n, j0 + lay.chunk))
            mask = ctx.band_bias if ctx.band_bias.dim() == 2 else ctx.band_bias[:, j]
            dq_c, dk_c, dv_c = _flash_cpu_backward(
                gb[:, j], qb[:, j], kw[:, j], vw[:, j], out_b[:, j], lse_b[:, j], 0.0, False, attn_mask=mask
            )  # (BH, c, S | K, Dh)
            c = dq_c.shape[1]
            first_q = lay.head_q + j0 * lay.S
            n_q = min(c * lay.S, Tq - first_q)  # the last block's padding rows are dropped
            dq[:, first_q : first_q + n_q] = dq_c.reshape(B * H, c * lay.S, Dh)[:, :n_q]
            first_k = lay.head - lay.P + j0 * lay.S  # the chunk's windows cover P + cS keys from here
            n_k = min(lay.P + c * lay.S, lay.T - first_k)
            for d_all, d_c in ((dk, dk_c), (dv, dv_c)):
                # unfold_backward sums overlapping windows, given as unfold makes them: (BH, c, Dh, K).
                summed = torch.ops.aten.unfold_backward(
                    d_c.transpose(-1, -2), (B * H, lay.P + c * lay.S, Dh), 1, lay.P + lay.S, lay.S
                )
                d_all[:, first_k : first_k + n_k] += summed[:, :n_k]
        return dq.view(B, H, Tq, Dh), dk.view(B, H, lay.T, Dh), dv.view(B, H, lay.T, Dh), None, None


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Sliding-window attention of window ``window`` on CPU; q: (B, H, Tq, Dh), k and v: (B, H, Tk, Dh)
    with Tk >= Tq, queries aligned to the end of the keys; ``doc_ids`` (B, T) (no cached keys) keep each
    query within its document. Returns (B, H, Tq, Dh)."""
    Tq, Tk = q.shape[2], k.shape[2]
    if doc_ids is not None:
        rows = [_BlockedSWA.apply(q[b : b + 1], k[b : b + 1], v[b : b + 1], window, doc_ids[b])
                for b in range(q.shape[0])]
        return torch.cat(rows)
    past = min(Tk - Tq, window - 1)  # older cached keys are out of every query's window
    k, v = k[:, :, Tk - Tq - past :], v[:, :, Tk - Tq - past :]
    return _BlockedSWA.apply(q, k, v, window, None)
