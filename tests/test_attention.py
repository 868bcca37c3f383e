import random
import typing

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from hybrid_lightning.bench.gpu import CASES, TOLERANCE, backend_errors
from hybrid_lightning.config import ModelConfig, validate_config
from hybrid_lightning.model.attention import BACKENDS, HAS_FLASH_ATTN, attend, auto_backend
from naive_attention import naive_attention, visible_keys

# The backends that run on CPU with gradients; FlexAttention runs there forward-only (the tests under eager_flex).
GRAD_BACKENDS = ["reference", "sdpa", "blocked"]
EAGER_FLEX_WARNING = "ignore:flex_attention called without torch.compile"


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention without torch.compile (minutes on a CPU): the same masks and semantics, unfused."""
    monkeypatch.setattr("hybrid_lightning.model.attention._compiled_flex", lambda: flex_attention)


def _qkv(B, H, Hkv, Tq, Tk, D, dtype=torch.float32):
    g = torch.Generator().manual_seed(Tq * 1000 + Tk)
    make = lambda h, t: torch.randn(B, h, t, D, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(H, Tq), make(Hkv, Tk), make(Hkv, Tk)


def _check(backend, T, W, past=0, H=4, Hkv=2, tol=1e-5):
    """``backend``'s outputs and gradients against the oracle written from the definition (naive_attention.py)."""
    q, k, v = _qkv(2, H, Hkv, T, T + past, 16)
    ref = naive_attention(q, k, v, W)
    out = attend(q, k, v, window=W, backend=backend)
    grad = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, (q, k, v), grad)
    g_out = torch.autograd.grad(out, (q, k, v), grad)
    assert (out - ref).abs().max() <= tol
    for a, b in zip(g_out, g_ref):
        assert (a - b).abs().max() <= tol


def test_the_oracle_counts_a_window_of_three_by_hand():
    assert visible_keys(5, 3) == [3, 4, 5]
    assert visible_keys(1, 3) == [0, 1] and visible_keys(5, 1) == [5] and visible_keys(5, None) == [0, 1, 2, 3, 4, 5]
    assert visible_keys(5, 3, doc=[0, 0, 0, 0, 1, 1, 1]) == [4, 5]


@pytest.mark.filterwarnings(EAGER_FLEX_WARNING)
@pytest.mark.parametrize("backend", [*GRAD_BACKENDS, "flex"])
def test_a_window_of_three_counted_by_hand(backend, eager_flex):
    """W = 3: query 5 sees keys 3, 4 and 5. Zero queries and keys weigh the visible keys equally, and value j is
    the j-th unit vector, so an output row holds the weight of each key: 1/3 on each key its query sees."""
    q = torch.zeros(1, 1, 8, 8)
    v = torch.eye(8)[None, None]  # (1, 1, 8, 8): value j is the unit vector e_j
    with torch.no_grad():  # FlexAttention runs forward-only on CPU
        out = attend(q, q, v, window=3, backend=backend)[0, 0]  # (8, 8): query x key weights
    third = pytest.approx(1 / 3)
    assert out[5].tolist() == [0, 0, 0, third, third, third, 0, 0]
    assert out[7].tolist() == [0, 0, 0, 0, 0, third, third, third]
    assert out[1].tolist() == [0.5, 0.5, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
@pytest.mark.parametrize(
    "T, W", [(1, 1), (50, 1), (37, 5), (64, 16), (65, 16), (100, 17), (40, 40), (40, 41), (30, 500), (200, 64)]
)
def test_windowed_backends_match_the_oracle(backend, T, W):
    _check(backend, T, W)


def test_blocked_matches_the_oracle_random_shapes():
    rng = random.Random(0)
    for _ in range(20):
        T, W = rng.randint(1, 300), rng.randint(1, 320)
        _check("blocked", T, W)


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
@pytest.mark.parametrize("past", [1, 7, 40])
def test_queries_after_cached_keys(backend, past):
    _check(backend, 13, 9, past=past)
    _check(backend, 13, None, past=past)


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_full_attention_matches_the_oracle(backend):
    _check(backend, 77, None)  # blocked: no window, it falls back to causal SDPA


def test_unknown_backend_is_rejected():
    q, k, v = _qkv(1, 1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="backend"):
        attend(q, k, v, window=None, backend="magic")


@pytest.mark.parametrize(
    "T, W, past", [(700, 300, 0), (700, 300, 299), (1000, 70, 5), (129, 64, 0), (130, 64, 63), (400, 2, 1)]
)
def test_blocked_over_many_blocks_matches_the_oracle(T, W, past):
    """Shapes with several query blocks, a last block cut short, and cached keys before the queries."""
    _check("blocked", T, W, past=past)


@pytest.mark.parametrize("chunk", [1, 150])
def test_blocked_backward_in_chunks_matches_the_oracle(monkeypatch, chunk):
    """Backward calls of one block, or of a few, including a last chunk cut short."""
    monkeypatch.setattr("hybrid_lightning.model.blocked.CHUNK_QUERIES", chunk)
    _check("blocked", 700, 300, past=299)
    _check("blocked", 1000, 70, past=5)


def test_blocked_float64_matches_the_oracle():
    q, k, v = (t.detach().double().requires_grad_() for t in _qkv(2, 4, 2, 150, 160, 16))
    ref = naive_attention(q, k, v, 33)
    out = attend(q, k, v, window=33, backend="blocked")
    assert (out - ref).abs().max() <= 1e-12
    g_ref, g_out = (torch.autograd.grad(o, (q, k, v), torch.ones_like(o)) for o in (ref, out))
    assert max((a - b).abs().max() for a, b in zip(g_out, g_ref)) <= 1e-12


def test_blocked_bf16_close_to_reference():
    errors = backend_errors("blocked", 300, 64, 20, 4, 2, torch.device("cpu"))
    assert max(errors.values()) <= TOLERANCE, errors


def test_auto_backend_on_cpu():
    q = torch.zeros(1, 2, 8, 4)
    assert auto_backend(q, None) == "sdpa"
    assert auto_backend(q, 4) == "blocked"


@pytest.mark.skipif(HAS_FLASH_ATTN, reason="flash-attn is installed here")
def test_flash_without_flash_attn_is_a_value_error():
    q, k, v = _qkv(1, 2, 2, 8, 8, 8)
    with pytest.raises(ValueError, match="model.attn_backend='flash' needs the flash-attn package"):
        attend(q, k, v, window=4, backend="flash")


def test_blocked_off_cpu_is_a_value_error():
    q = torch.zeros(1, 2, 8, 4, device="meta")
    with pytest.raises(ValueError, match="model.attn_backend='blocked' is the CPU"):
        attend(q, q, q, window=4, backend="blocked")


def test_config_accepts_exactly_the_dispatch_backends():
    assert typing.get_args(ModelConfig.model_fields["attn_backend"].annotation) == BACKENDS
    with pytest.raises(ValueError, match="model.attn_backend"):
        validate_config({"model": {"attn_backend": "flashy"}})


@pytest.mark.filterwarnings(EAGER_FLEX_WARNING)
@pytest.mark.parametrize("T, W, past", [(64, None, 0), (100, 17, 0), (77, 9, 30), (50, None, 13)])
def test_flex_on_cpu_forward_matches_the_oracle(eager_flex, T, W, past):
    q, k, v = (t.detach() for t in _qkv(2, 4, 2, T, T + past, 16))
    with torch.no_grad():
        out = attend(q, k, v, window=W, backend="flex")
        assert (out - naive_attention(q, k, v, W)).abs().max() <= 1e-5


@pytest.mark.filterwarnings(EAGER_FLEX_WARNING)
def test_flex_on_cpu_refuses_gradients(eager_flex):
    q, k, v = _qkv(1, 2, 2, 16, 16, 8)
    with pytest.raises(ValueError, match="forward-only on CPU"):
        attend(q, k, v, window=4, backend="flex")


@pytest.mark.slow
def test_compiled_flex_on_cpu_matches_the_oracle():
    """The production flex path on CPU, compiled (about a minute of warm-up on 2 cores)."""
    q, k, v = (t.detach() for t in _qkv(1, 4, 2, 300, 310, 16))
    with torch.no_grad():
        out = attend(q, k, v, window=64, backend="flex")
        assert (out - naive_attention(q, k, v, 64)).abs().max() <= 1e-5


CUDA_BACKENDS = ["sdpa", "flex", "flash"]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 kernels of flash-attn, FlexAttention, SDPA)"
)
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_cuda_backends_match_reference_in_bf16(backend, case):
    if backend == "flash" and not HAS_FLASH_ATTN:
        pytest.skip("flash-attn is not installed (pip install 'hybrid-lightning[gpu]')")
    errors = backend_errors(backend, *case, torch.device("cuda"))
    assert max(errors.values()) <= TOLERANCE, errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_backend_on_cuda():
    q = torch.zeros(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    assert auto_backend(q, 4) == ("flash" if HAS_FLASH_ATTN else "flex")
    assert auto_backend(q.float(), None) == "sdpa"
