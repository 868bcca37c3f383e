"""Packed documents (``data.doc_mask``): a packed batch equals each of its documents run alone, in every
mixer and every backend that runs on CPU, outputs and gradients; without doc_ids nothing changes."""

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import document_ids
from hybrid_lightning.model.attention import attend
from hybrid_lightning.model.documents import by_document, cu_seqlens, document_positions
from hybrid_lightning.model.ops import ShortConv
from hybrid_lightning.plan import build_model, resolve_model_config
from naive_attention import naive_attention

VOCAB = 40
# Two rows of 300 tokens, documents of every kind of length: shorter than the window, longer than a
# blocked-attention block (64 queries), of one token, and a row that is one document.
LENGTHS = ([50, 3, 120, 1, 126], [300])


def packed_ids(lengths=LENGTHS) -> torch.Tensor:
    return torch.stack([torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in lengths])


def documents(doc_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document."""
    out = []
    for b, row in enumerate(doc_ids.tolist()):
        start = 0
        for t in range(1, len(row) + 1):
            if t == len(row) or row[t] != row[start]:
                out.append((b, start, t))
                start = t
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_document_ids_from_end_of_document_tokens():
    eos = 9
    tokens = torch.tensor([[5, eos, 7, 8, eos, eos, 3], [1, 2, 3, 4, 5, 6, eos]])
    ids = document_ids(tokens, eos)
    assert ids.tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 0, 0, 0, 0, 0, 0]]  # an eos ends its own document
    assert document_positions(ids).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 1, 2, 3, 4, 5, 6]]
    cu, longest = cu_seqlens(ids)
    assert cu.tolist() == [0, 2, 5, 6, 7, 14] and cu.dtype == torch.int32 and longest == 7


def test_by_document_runs_each_document_from_a_fresh_start():
    ids = packed_ids()
    x = torch.randn(2, 300, 3, dtype=torch.float64)
    y = by_document(lambda part: part.cumsum(dim=1), x, ids)  # a causal map with state: the running sum
    for b, s, e in documents(ids):
        assert torch.equal(y[b, s:e], x[b, s:e].cumsum(dim=0))


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention uncompiled: on CPU it runs forward only, and a compile takes about a minute here."""
    monkeypatch.setattr("hybrid_lightning.model.attention._compiled_flex", lambda: flex_attention)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["reference", "sdpa", "blocked", "flex"])
@pytest.mark.parametrize("window", [None, 32, 100])
def test_attention_of_a_packed_batch_is_each_document_alone(backend, window, eager_flex):
    if backend == "blocked" and window is None:
        pytest.skip("blocked is the windowed path; full attention there is sdpa's")
    ids = packed_ids()
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32 if backend == "flex" else torch.float64
    q = torch.randn(2, 4, 300, 16, generator=g, dtype=dtype, requires_grad=backend != "flex")
    k, v = (torch.randn(2, 2, 300, 16, generator=g, dtype=dtype, requires_grad=backend != "flex") for _ in range(2))
    with torch.set_grad_enabled(backend != "flex"):  # flex runs forward-only on CPU
        packed = attend(q, k, v, window=window, backend=backend, doc_ids=ids)
        alone = torch.zeros_like(packed)
        for b, s, e in documents(ids):
            one = [t[b : b + 1, :, s:e] for t in (q, k, v)]
            alone[b : b + 1, :, s:e] = naive_attention(*one, window)  # the definition, one document
    tol = 1e-6 if backend == "flex" else 1e-12
    assert rel(packed, alone) <= tol
    if backend != "flex":
        w = torch.randn(packed.shape, generator=g, dtype=dtype)
        got = torch.autograd.grad((packed * w).sum(), (q, k, v))
        want = torch.autograd.grad((alone * w).sum(), (q, k, v))
        assert all(rel(a, b) <= tol for a, b in zip(got, want))


ATTENTION_BACKENDS = ["reference", "sdpa", "blocked"]
CASES = [("swa", b) for b in ATTENTION_BACKENDS] + [
    (m, b) for m in ("mamba2", "gated_deltanet", "lightning", "kda", "gated_deltaproduct")
    for b in ("chunked", "recurrent")
]


def tiny_model(mixer: str, backend: str, pos: str = "rope"):
    torch.manual_seed(0)
    backends = {"attn_backend": backend} if mixer == "swa" else {"recurrent_backend": backend}
    cfg = resolve_model_config({
        "n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "mixer": mixer, "window": 24,
        "pos": {"full": pos, "efficient": pos}, "mamba2": {"head_dim": 16, "d_state": 8}, "recurrent_chunk": 16,
        **backends,
    }, vocab_size=VOCAB)
    return build_model(cfg).double()


@pytest.mark.parametrize("mixer,backend", CASES)
def test_a_packed_batch_equals_its_documents_run_alone(mixer, backend):
    """Every mixer, every CPU backend, fp64: the logits of a packed batch and the gradient of every parameter
    equal those of its documents run one by one (the full-attention layer and RoPE restart too)."""
    model = tiny_model(mixer, backend)
    lengths = ([20, 3, 40, 1, 26], [90]) if backend == "recurrent" else LENGTHS  # the step-by-step path is slow
    ids = packed_ids(lengths)
    tokens = torch.randint(0, VOCAB, ids.shape, generator=torch.Generator().manual_seed(1))
    w = torch.randn(*ids.shape, VOCAB, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    packed = model(tokens, doc_ids=ids)
    grads = torch.autograd.grad((packed * w).sum(), list(model.parameters()))
    alone = torch.zeros_like(packed)
    loss = 0
    for b, s, e in documents(ids):
        alone[b, s:e] = model(tokens[b : b + 1, s:e])[0]
        loss = loss + (alone[b, s:e] * w[b, s:e]).sum()
    want = torch.autograd.grad(loss, list(model.parameters()))
    assert rel(packed, alone) <= 1e-10
    assert max(rel(a, b) for a, b in zip(grads, want) if b.norm() > 0) <= 1e-10


def test_without_documents_the_forward_is_unchanged():
    """doc_ids=None is the model as it always was; one document per row given as ids agrees with it."""
    for mixer, backend in [("swa", "reference"), ("gated_deltanet", "chunked")]:
        model = tiny_model(mixer, backend)
        tokens = torch.randint(0, VOCAB, (2, 300), generator=torch.Generator().manual_seed(1))
        plain = model(tokens)
        assert torch.equal(model(tokens, doc_ids=None), plain)
        assert rel(model(tokens, doc_ids=torch.zeros_like(tokens)), plain) <= 1e-12


def test_doc_mask_off_the_training_system_passes_no_doc_ids(monkeypatch):
    from conftest import system_of

    raw = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "vocab_size": 257}}
    seen = []
    def recording(forward):
        def wrapped(ids, states=None, doc_ids=None):
            return seen.append(doc_ids) or forward(ids, states, doc_ids)
        return wrapped

    for doc_mask in (False, True):
        system = system_of({**raw, "data": {"doc_mask": doc_mask}})
        monkeypatch.setattr(system.model, "forward", recording(system.model.forward))
        system._logits(torch.tensor([[1, 256, 2, 3, 4]]))
    assert seen[0] is None and seen[1].tolist() == [[0, 0, 1, 1]]


def test_states_with_doc_ids_are_refused():
    model = tiny_model("swa", "sdpa")
    with pytest.raises(ValueError, match="doc_ids"):
        model(torch.zeros(1, 4, dtype=torch.long), model.new_states(), torch.zeros(1, 4, dtype=torch.long))


def test_doc_mask_is_a_config_switch():
    assert validate_config({}).data.doc_mask is False
    assert validate_config({"data": {"doc_mask": True}}).data.doc_mask is True
    with pytest.raises(ValueError, match="doc_mask"):
        validate_config({"data": {"doc_mask": 1}})


def test_rope_positions_restart_at_each_document():
    """RoPE's scores depend on q - k only, so the logits above cannot show it: the rotated queries and keys
    of a packed row are those of each document alone."""
    attention = tiny_model("swa", "reference").layers[1].mixer  # the full-attention layer, RoPE
    ids = packed_ids()
    x = torch.randn(2, 300, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    q, k, _ = attention.project(x, 0, document_positions(ids))
    for b, s, e in documents(ids):
        q_alone, k_alone, _ = attention.project(x[b : b + 1, s:e], 0)
        assert rel(q[b : b + 1, :, s:e], q_alone) <= 1e-14 and rel(k[b : b + 1, :, s:e], k_alone) <= 1e-14


def test_the_doc_mask_grid_crosses_every_arch_with_the_switch(tmp_path):
    from conftest import REPO
    from hybrid_lightning.grid import load_grid

    cells = load_grid(REPO / "ablations" / "doc-mask.yaml", tmp_path).cells
    pairs = {(c.labels["arch"], c.config.data.doc_mask) for c in cells}
    assert pairs == {(arch, on) for arch in ("full", "swa16", "gdn") for on in (False, True)}


def test_the_short_convolution_restarts_at_each_document():
    """``ShortConv`` with document positions (the fla path's convolution) equals each document alone,
    outputs and gradients, fp64."""
    ids = packed_ids()
    conv = ShortConv(6, 4, bias=True).double()
    x = torch.randn(2, 300, 6, dtype=torch.float64, requires_grad=True)
    y = conv(x, positions=document_positions(ids))
    w = torch.randn_like(y)
    grads = torch.autograd.grad((y * w).sum(), [x, *conv.parameters()])
    alone = torch.cat([conv(x[b:b + 1, s:e]) for b, s, e in documents(ids)], dim=1).view(2, 300, 6)
    assert torch.allclose(y, alone, rtol=0, atol=1e-12)
    expected = torch.autograd.grad((alone * w).sum(), [x, *conv.parameters()])
    assert all(torch.allclose(a, b, rtol=0, atol=1e-10) for a, b in zip(grads, expected))


def _flash_reference(q, k, v, causal, window_size, softmax_scale=None):
    """flash-attn's documented semantics for one sequence, in plain torch: q (Tq, H, D), k, v (Tk, Hk, D);
    query i (aligned to the end of the keys) sees key j iff i - left <= j <= i + right (right = 0 causal),
    left or right -1 = unbounded; head h reads key head h // (H / Hk)."""
    Tq, H, D = q.shape
    Tk = k.shape[0]
    k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    scores = torch.einsum("ihd,jhd->hij", q, k) * (softmax_scale or D**-0.5)
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None, :]
    left, right = window_size
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        right = 0
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    return torch.einsum("hij,jhd->ihd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)


def _fake_flash_attn():
    import types

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, window_size=(-1, -1), softmax_scale=None, **_):
        assert cu_q.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0] and max_q == int((cu_q[1:] - cu_q[:-1]).max())
        return torch.cat([_flash_reference(q[a:b], k[c:d], v[c:d], causal, window_size, softmax_scale)
                          for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])])

    def dense(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, **_):
        return torch.stack([_flash_reference(q[b], k[b], v[b], causal, window_size, softmax_scale)
                            for b in range(q.shape[0])])

    return types.SimpleNamespace(flash_attn_varlen_func=varlen, flash_attn_func=dense)


@pytest.mark.parametrize("window", [None, 24])
def test_the_flash_calls_follow_flash_attns_documented_interface(monkeypatch, window):
    """The ``flash`` paths' layouts, cu_seqlens, window and GQA, checked on CPU against a stand-in that
    implements flash-attn's documented semantics (flash-attn itself needs CUDA): packed documents and a plain
    batch equal the oracle written from the definition (naive_attention.py)."""
    import sys

    from hybrid_lightning.model.attention import flash_attention, flash_varlen

    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn())
    ids = packed_ids()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 300, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 300, 8, generator=g, dtype=torch.float64) for _ in range(2))
    assert rel(flash_varlen(q, k, v, window, ids), naive_attention(q, k, v, window, ids)) <= 1e-12
    assert rel(flash_attention(q, k, v, window), naive_attention(q, k, v, window)) <= 1e-12
