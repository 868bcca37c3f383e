import random

import pytest
import torch

from hybrid_lightning.model.attention import attend


def _qkv(B, H, Hkv, Tq, Tk, D, dtype=torch.float32):
    g = torch.Generator().manual_seed(Tq * 1000 + Tk)
    make = lambda h, t: torch.randn(B, h, t, D, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(H, Tq), make(Hkv, Tk), make(Hkv, Tk)


def _check(backend, T, W, past=0, H=4, Hkv=2, tol=1e-5):
    q, k, v = _qkv(2, H, Hkv, T, T + past, 16)
    ref = attend(q, k, v, window=W, backend="reference")
    out = attend(q, k, v, window=W, backend=backend)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, (q, k, v), grad)
    g_out = torch.autograd.grad(out, (q, k, v), grad)
    assert (out - ref).abs().max() <= tol
    for a, b in zip(g_out, g_ref):
        assert (a - b).abs().max() <= tol


@pytest.mark.parametrize("backend", ["blocked", "sdpa"])
@pytest.mark.parametrize(
    "T, W", [(1, 1), (50, 1), (37, 5), (64, 16), (65, 16), (100, 17), (40, 40), (40, 41), (30, 500), (200, 64)]
)
def test_windowed_backends_match_reference(backend, T, W):
    _check(backend, T, W)


def test_blocked_matches_reference_random_shapes():
    rng = random.Random(0)
    for _ in range(20):
        T, W = rng.randint(1, 300), rng.randint(1, 320)
        _check("blocked", T, W)


@pytest.mark.parametrize("past", [1, 7, 40])
def test_queries_after_cached_keys(past):
    for backend in ("blocked", "sdpa"):
        _check(backend, 13, 9, past=past)
        _check(backend, 13, None, past=past)


def test_full_attention_matches_reference():
    _check("sdpa", 77, None)
    _check("blocked", 77, None)  # no window: blocked falls back to causal SDPA


def test_unknown_backend_is_rejected():
    q, k, v = _qkv(1, 1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="backend"):
        attend(q, k, v, window=None, backend="magic")
