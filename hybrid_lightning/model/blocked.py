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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The CPU flash-attention kernel behind F.scaled_dot_product_attention, with its log-sum-exp.
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_cpu_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


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

    def head_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """None when the head is plainly causal (no cached keys), else its (head_q, head) mask."""
        return None if self.past == 0 else band_bias(self.head_q, self.head, self.past, self.window, dtype)

    def windows(self, keys: torch.Tensor) -> torch.Tensor:
        """(BH, P + nS, Dh) padded keys -> (BH, n, K, Dh) overlapping key windows, a view."""
        BH, L, Dh = keys.shape
        return keys.as_strided((BH, self.n, self.P + self.S, Dh), (L * Dh, self.S * Dh, Dh, 1))


class _BlockedSWA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
        B, H, Tq, Dh = q.shape
        lay = _Layout(Tq, k.shape[2], window)
        q3, k3, v3 = q.reshape(B * H, Tq, Dh), k.reshape(B * H, lay.T, Dh), v.reshape(B * H, lay.T, Dh)
        head_bias = lay.head_bias(q.dtype)
        # Head: (BH, 1, head_q, Dh) queries against the first `head` keys.
        out_h, lse_h = _flash_cpu(
            q3[:, None, : lay.head_q], k3[:, None, : lay.head], v3[:, None, : lay.head], 0.0, head_bias is None,
            attn_mask=head_bias,
        )
        ctx.lay, ctx.head_bias, ctx.shape = lay, head_bias, q.shape
        if lay.n == 0:
            ctx.save_for_backward(q3, k3, v3, out_h, lse_h)
            return out_h.view(B, H, Tq, Dh)
        qb = F.pad(q3[:, lay.head_q :], (0, 0, 0, lay.pad)).view(B * H, lay.n, lay.S, Dh)  # (BH, n, S, Dh)
        kp = F.pad(k3[:, lay.head - lay.P :], (0, 0, 0, lay.pad))  # (BH, P + nS, Dh)
        vp = F.pad(v3[:, lay.head - lay.P :], (0, 0, 0, lay.pad))
        ctx.band_bias = band_bias(lay.S, lay.P + lay.S, lay.P, window, q.dtype)  # (S, K)
        out_b, lse_b = _flash_cpu(qb, lay.windows(kp), lay.windows(vp), 0.0, False, attn_mask=ctx.band_bias)
        ctx.save_for_backward(q3, k3, v3, out_h, lse_h, qb, kp, vp, out_b, lse_b)
        out = torch.cat([out_h.view(B * H, lay.head_q, Dh), out_b.view(B * H, -1, Dh)[:, : lay.rest]], dim=1)
        return out.view(B, H, Tq, Dh)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        lay: _Layout = ctx.lay
        B, H, Tq, Dh = ctx.shape
        q3, k3, v3, out_h, lse_h = ctx.saved_tensors[:5]
        g3 = grad.reshape(B * H, Tq, Dh)
        dq_h, dk_h, dv_h = _flash_cpu_backward(
            g3[:, None, : lay.head_q].contiguous(), q3[:, None, : lay.head_q], k3[:, None, : lay.head],
            v3[:, None, : lay.head], out_h, lse_h, 0.0, ctx.head_bias is None, attn_mask=ctx.head_bias,
        )  # (BH, 1, head_q | head, Dh)
        if lay.n == 0:
            return dq_h.reshape(B, H, Tq, Dh), dk_h.reshape(B, H, lay.T, Dh), dv_h.reshape(B, H, lay.T, Dh), None
        qb, kp, vp, out_b, lse_b = ctx.saved_tensors[5:]
        gb = F.pad(g3[:, lay.head_q :], (0, 0, 0, lay.pad)).view(qb.shape)
        dq_b, dk_w, dv_w = _flash_cpu_backward(
            gb, qb, lay.windows(kp), lay.windows(vp), out_b, lse_b, 0.0, False, attn_mask=ctx.band_bias
        )  # (BH, n, S | K, Dh)
        dq = torch.cat([dq_h.reshape(B * H, lay.head_q, Dh), dq_b.reshape(B * H, -1, Dh)[:, : lay.rest]], dim=1)
        dk, dv = _fold(dk_h, dk_w, kp, lay), _fold(dv_h, dv_w, vp, lay)
        return dq.view(B, H, Tq, Dh), dk.view(B, H, lay.T, Dh), dv.view(B, H, lay.T, Dh), None


def _fold(d_head: torch.Tensor, d_windows: torch.Tensor, padded: torch.Tensor, lay: _Layout) -> torch.Tensor:
    """Sums the head's and the overlapping windows' key gradients into one (B, H, T, Dh) gradient."""
    BH, L, Dh = padded.shape
    # unfold_backward sums overlapping windows; it takes them as unfold makes them: (BH, n, Dh, K).
    d_pad = torch.ops.aten.unfold_backward(d_windows.transpose(-1, -2), (BH, L, Dh), 1, lay.P + lay.S, lay.S)
    start = lay.head - lay.P  # key position of padded row 0
    d_pad[:, : lay.P] += d_head[:, 0, start:]  # the keys that both the head and the first block see
    return torch.cat([d_head[:, 0, :start], d_pad[:, : lay.T - start]], dim=1)  # (BH, T, Dh)


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Sliding-window attention of window ``window`` on CPU; q: (B, H, Tq, Dh), k and v: (B, H, Tk, Dh)
    with Tk >= Tq, queries aligned to the end of the keys. Returns (B, H, Tq, Dh)."""
    Tq, Tk = q.shape[2], k.shape[2]
    past = min(Tk - Tq, window - 1)  # older cached keys are out of every query's window
    k, v = k[:, :, Tk - Tq - past :], v[:, :, Tk - Tq - past :]
    return _BlockedSWA.apply(q, k, v, window)
