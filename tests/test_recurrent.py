"""Recurrent mixers (Mamba-2, Gated DeltaNet, Lightning Attention, Kimi Delta Attention, Gated DeltaProduct) and
their sequence operators (the last two's operators: test_delta_variants.py)."""

import pytest
import torch
import torch.nn.functional as F

from hybrid_lightning import build_model
from hybrid_lightning.config import validate_config
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.mixers.lightning import decay_rates
from hybrid_lightning.model.ops import fla_available, gated_delta_rule, gated_linear_attention
from hybrid_lightning.plan import resolve_model_config
from hybrid_lightning.plan.layers import layer_plan

RECURRENT = ["mamba2", "gated_deltanet", "lightning", "kda", "gated_deltaproduct"]
VOCAB = 50


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def op_inputs(B, T, H, K, V, seed, dtype=torch.float32, decay=1.0):
    """Random operator inputs with gradients: q, k (L2-normalised), v, g (log-decay), beta, state."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(B, T, H, K, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    log_decay = F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=dtype) + 2) * decay
    beta = torch.rand(B, T, H, generator=g, dtype=dtype)
    state = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, log_decay, beta, state)]


def run_op(op, inputs, backend, chunk):
    q, k, v, g, beta, state = inputs
    if op == "gla":
        return gated_linear_attention(q, k, v, g, scale=q.shape[-1] ** -0.5, state=state, backend=backend,
                                      chunk_size=chunk)
    return gated_delta_rule(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, state=state, backend=backend, chunk_size=chunk)


SHAPES = [  # B, T, H, K, V, chunk: T not a multiple of the chunk, T < chunk, T a multiple, one step
    (2, 37, 3, 8, 6, 16),
    (1, 5, 2, 16, 16, 16),
    (3, 64, 4, 8, 12, 16),
    (2, 100, 2, 32, 16, 32),
    (2, 1, 2, 8, 8, 16),
]


def assert_matches_recurrent(op, shape, backend):
    """``backend``'s operator equals the step-by-step reference in fp32: outputs, final state and the
    gradients of every input (the initial state included)."""
    B, T, H, K, V, chunk = shape
    inputs = op_inputs(B, T, H, K, V, seed=T)
    results = {}
    for name in ("recurrent", backend):
        o, S = run_op(op, inputs, name, chunk)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(0))
        loss = (o * w).sum() + (S * S).sum()
        used = inputs if op == "delta" else [t for i, t in enumerate(inputs) if i != 4]  # gla has no beta
        results[name] = (o, S, torch.autograd.grad(loss, used))
    (o_ref, s_ref, g_ref), (o, s, grads) = results["recurrent"], results[backend]
    assert o.dtype == torch.float32 and o.shape == (B, T, H, V)
    assert rel_err(o, o_ref) <= 1e-4 and rel_err(s, s_ref) <= 1e-4
    for got, want in zip(grads, g_ref):
        assert rel_err(got, want) <= 1e-4


@pytest.mark.parametrize("op", ["gla", "delta"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-H{}-K{}-V{}-C{}".format(*s))
def test_chunked_matches_recurrent_outputs_and_gradients(op, shape):
    """B1: the chunked operator equals the step-by-step reference."""
    assert_matches_recurrent(op, shape, "chunked")


@pytest.mark.slow
@pytest.mark.parametrize("op", ["gla", "delta"])
def test_compiled_matches_recurrent_outputs_and_gradients(op):
    """The chunked operator under torch.compile (backend ``compiled``, about a minute of compilation each)
    equals the step-by-step reference, at a length that is not a multiple of the chunk."""
    assert_matches_recurrent(op, SHAPES[0], "compiled")


@pytest.mark.parametrize("op", ["gla", "delta"])
def test_chunked_is_stable_under_strong_decay(op):
    """Log-decays of -60 per step underflow exp(cumsum) over a chunk; the chunked form only takes
    exponentials of differences, so outputs and gradients stay finite and exact."""
    inputs = op_inputs(2, 40, 2, 8, 8, seed=3, decay=60.0)
    outs = {b: run_op(op, inputs, b, 16)[0] for b in ("recurrent", "chunked")}
    torch.autograd.backward(outs["chunked"].sum())
    assert all(torch.isfinite(t.grad).all() for t in inputs if t.grad is not None)
    assert rel_err(outs["chunked"], outs["recurrent"]) <= 1e-4


@pytest.mark.parametrize("decay", [1.0, 60.0])
def test_hand_written_backwards_pass_gradcheck(decay):
    """The chunk-level functions whose backward is written by hand (the decayed scores of both operators, the
    delta rule's solve with its scores) against finite differences in fp64, under mild and strong decay; the
    upper triangle and diagonal of the solve's system are not read, so their gradient must be zero."""
    from hybrid_lightning.model.ops.common import decayed
    from hybrid_lightning.model.ops.delta_rule import _WYSolve

    g = torch.Generator().manual_seed(0)
    C = 6
    b = (F.logsigmoid(torch.randn(2, 3, C, generator=g, dtype=torch.float64) + 2) * decay).cumsum(-1)
    kk, qk = (0.3 * torch.randn(2, 3, C, C, generator=g, dtype=torch.float64) for _ in range(2))
    rhs = torch.randn(2, 3, C, 4, generator=g, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (b, kk, qk, rhs)]
    assert torch.autograd.gradcheck(decayed, (inputs[0], inputs[2]))
    assert torch.autograd.gradcheck(_WYSolve.apply, inputs)
    _WYSolve.apply(*inputs)[0].sum().backward()
    assert kk.grad.triu().abs().max() == 0


@pytest.mark.parametrize("op", ["gla", "delta"])
def test_operator_in_pieces_equals_one_call(op):
    """B2 at the operator: feeding the sequence in pieces, carrying the final state, equals one call."""
    q, k, v, g, beta, _ = (t.detach() for t in op_inputs(2, 50, 2, 8, 8, seed=4, dtype=torch.float64))
    full, full_state = run_op(op, (q, k, v, g, beta, None), "chunked", 16)
    state, outs, start = None, [], 0
    for n in (1, 20, 3, 16, 10):
        piece = [t[:, start : start + n] for t in (q, k, v, g, beta)]
        o, state = run_op(op, (*piece, state), "chunked", 16)
        outs.append(o)
        start += n
    assert torch.allclose(torch.cat(outs, dim=1), full, atol=1e-12)
    assert torch.allclose(state, full_state, atol=1e-12)


@pytest.mark.parametrize("B, T, C, size", [(2, 37, 6, 4), (1, 1, 5, 4), (3, 9, 4, 1), (2, 3, 8, 5)])
def test_short_conv_matches_conv1d_with_gradients(B, T, C, size):
    """The multiply-add taps and their written-out backward equal F.conv1d(groups=C) with left padding,
    outputs and the gradients of input, weight and bias (fp64)."""
    from hybrid_lightning.model.ops import ShortConv

    torch.manual_seed(0)
    conv = ShortConv(C, size, bias=True).double()
    x = torch.randn(B, T, C, dtype=torch.float64, requires_grad=True)
    want_y = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (size - 1, 0)), conv.conv.weight, conv.conv.bias,
                             groups=C)).transpose(1, 2)
    w = torch.randn(B, T, C, dtype=torch.float64)
    want = torch.autograd.grad((want_y * w).sum(), (x, conv.conv.weight, conv.conv.bias))
    y = conv(x)
    got = torch.autograd.grad((y * w).sum(), (x, conv.conv.weight, conv.conv.bias))
    assert torch.allclose(y, want_y, atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want))


def mixer(name, seed=0, **model):
    torch.manual_seed(seed)
    cfg = resolve_model_config({"n_layers": 4, "d_model": 32, "n_heads": 2, "pattern": "EEEF", "mixer": name,
                                "mamba2": {"head_dim": 16, "d_state": 8}, **model}, vocab_size=VOCAB)
    spec = layer_plan(cfg)[1]
    return KINDS[name].mixer_class()(spec.options, spec)


@pytest.mark.parametrize("name", RECURRENT)
def test_mixer_chunked_matches_recurrent_with_gradients(name):
    """B1 through a whole mixer: outputs and every parameter's gradient, fp32, chunked vs step-by-step."""
    x = torch.randn(2, 45, 32, generator=torch.Generator().manual_seed(1))
    results = {}
    for backend in ("recurrent", "chunked"):
        m = mixer(name, recurrent_backend=backend, recurrent_chunk=16)
        y = m(x)
        y.pow(2).sum().backward()
        results[backend] = (y, {n: p.grad for n, p in m.named_parameters()})
    (y_ref, g_ref), (y, grads) = results["recurrent"], results["chunked"]
    assert rel_err(y, y_ref) <= 1e-4
    assert g_ref.keys() == grads.keys() and all(g is not None for g in grads.values())
    for n in grads:
        assert rel_err(grads[n], g_ref[n]) <= 1e-4, n


@pytest.mark.parametrize("name", RECURRENT)
def test_mixer_state_across_chunks(name):
    """B2 with several chunks per piece (the model-level tests use T below the chunk size)."""
    m = mixer(name, recurrent_chunk=8).double()
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full = m(x)
    for pieces in ([70], [1] * 9 + [61], [17, 8, 1, 44]):
        state, outs, start = {}, [], 0
        for n in pieces:
            outs.append(m(x[:, start : start + n], state))
            start += n
        assert torch.allclose(torch.cat(outs, dim=1), full, atol=1e-10)


@pytest.mark.parametrize("name", RECURRENT)
def test_model_incremental_inference_across_chunks(name):
    model = build_model({"n_layers": 4, "d_model": 32, "n_heads": 2, "pattern": "EEEF", "mixer": name,
                         "vocab_size": VOCAB,
                         "recurrent_chunk": 8, "mamba2": {"head_dim": 16, "d_state": 8}}).double().eval()
    x = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(6))
    full = model(x)
    states, outs = model.new_states(), []
    for piece in x.split(13, dim=1):
        outs.append(model(piece, states))
    assert torch.allclose(torch.cat(outs, dim=1), full, atol=1e-10)


def test_mixers_register_their_letters_and_no_positions():
    assert {name: KINDS[name].letter for name in RECURRENT} == {
        "mamba2": "M", "gated_deltanet": "G", "lightning": "L", "kda": "K", "gated_deltaproduct": "P"}
    cfg = resolve_model_config({"n_layers": 4, "pattern": "MGLF", "d_model": 64, "n_heads": 2})
    assert [(s.mixer, s.pos) for s in layer_plan(cfg)] == [
        ("mamba2", None), ("gated_deltanet", None), ("lightning", None), ("full", "rope")]
    assert build_model(cfg)(torch.randint(0, 257, (1, 9))).shape == (1, 9, 257)


def test_lightning_decay_follows_layer_depth():
    """MiniMax-01's rates: ALiBi slopes 2^(-8(h+1)/H), scaled by 1 - l/(L-1) with depth."""
    first, last = decay_rates(4, 0, 8), decay_rates(4, 7, 8)
    assert torch.allclose(first, torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]), rtol=1e-4)
    assert (last > 0).all() and (last < 1e-4 * first).all()
    assert torch.isfinite(decay_rates(2, 0, 1)).all()


def test_fla_backend_without_cuda_is_a_clear_error():
    m = mixer("gated_deltanet", recurrent_backend="fla")
    with pytest.raises(ValueError, match="model.recurrent_backend"):
        m(torch.randn(1, 4, 32))


@pytest.mark.parametrize("model, field", [
    ({"recurrent_backend": "triton"}, "model.recurrent_backend"),
    ({"mixer": "mamba2", "d_model": 48, "n_heads": 2}, "model.mamba2.head_dim"),
    ({"mixer": "gated_deltanet", "gated_deltanet": {"expand_v": 1.3}}, "model.gated_deltanet.expand_v"),
    ({"mamba2": {"d_stat": 4}}, "model.mamba2.d_state"),
    ({"recurrent_chunk": 0}, "model.recurrent_chunk"),
])
def test_bad_recurrent_options_name_the_field(model, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate_config({"model": model})


def test_unused_mixer_options_are_not_checked():
    """A Mamba-2 head width that does not fit this d_model is fine while no layer is Mamba-2."""
    validate_config({"model": {"mixer": "swa", "d_model": 48, "n_heads": 2}})


def test_gpu_check_script_logic_on_cpu():
    """B6's comparison code, run here with the chunked path as the candidate and the step-by-step
    reference in its place (on a GPU the candidate is fla and the reference the chunked path)."""
    from hybrid_lightning.bench.gpu_recurrent import mixer_checks, op_checks

    rows = op_checks("cpu", "chunked", "recurrent", torch.float32, [(2, 37, 2, 8, 8)])
    rows += mixer_checks("cpu", "chunked", "recurrent", torch.float32, T=30, d_model=64)
    assert len(rows) == 2 + len(RECURRENT) and all(r["ok"] for r in rows), rows
    assert max(max(r["output"], r["grad"], r["state"]) for r in rows) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available() or not fla_available(), reason="needs a CUDA device and fla")
def test_fla_matches_torch_path_on_gpu():
    from hybrid_lightning.bench.gpu_recurrent import main

    assert main(["--quick"]) == 0


def test_benchmark_section_runs_quick():
    from hybrid_lightning.bench.recurrent import run

    result = run(quick=True)
    ops = {r["op"] for r in result["rows"]}
    assert ops == {"gated_delta_rule", "gated_linear_attention", "kda", "gated_delta_product"}
    timed = [r for r in result["rows"] if "step-by-step / chunked" in r]
    assert len(timed) == 4 and all(r["step-by-step / chunked"] > 1 for r in timed)
    assert "agree with the step-by-step reference" in result["notes"]
    assert "gated_delta_product: fla has no pure-torch chunked reference" in result["notes"]


@pytest.mark.parametrize("op", ["gla", "delta"])
def test_same_semantics_as_fla_reference(op):
    """The fla backend hands our arguments to fla's kernels as they are; fla's own step-by-step
    references (the kernels' ground truth in fla's tests) must then compute what ours do:
    log-space decay, (K, V) state layout, scale, outputs in (B, T, H, V)."""
    from hybrid_lightning.bench.recurrent import fla_naive

    folder, name = (("simple_gla", "naive_recurrent_simple_gla") if op == "gla"
                    else ("gated_delta_rule", "naive_recurrent_gated_delta_rule"))
    fla_fn, why = fla_naive(folder, name)
    if fla_fn is None:
        pytest.skip(why)
    q, k, v, g, beta, state = (t.detach() for t in op_inputs(2, 30, 3, 8, 6, seed=7, dtype=torch.float64))
    ours, ours_state = run_op(op, (q, k, v, g, beta, state), "chunked", 16)
    if op == "gla":
        theirs, theirs_state = fla_fn(q, k, v, g, scale=8**-0.5, initial_state=state, output_final_state=True)
    else:  # fla's recurrent reference takes beta before g
        theirs, theirs_state = fla_fn(q, k, v, beta, g, scale=8**-0.5, initial_state=state, output_final_state=True)
    assert rel_err(ours, theirs.to(ours.dtype)) <= 1e-5 and rel_err(ours_state, theirs_state.to(ours.dtype)) <= 1e-5
