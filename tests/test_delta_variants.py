"""Kimi Delta Attention's and Gated DeltaProduct's operators: the chunked forms against the step-by-step ones
(outputs and gradients, fp64, several chunk sizes, lengths that are not a multiple of the chunk), both against
fla's own pure-torch references (``fla/ops/kda/naive.py``, ``fla/ops/gated_delta_product/naive.py``) to 1e-10 in
fp64, and fed in pieces against one call."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybrid_lightning.model.ops.delta_product import gated_delta_product
from hybrid_lightning.model.ops.kda import kda

F64 = torch.float64
SHAPES = [  # B, T, H, K, V, chunk: T not a multiple of the chunk, T < chunk, several sub-chunks, one step
    (2, 37, 3, 8, 6, 16),
    (1, 5, 2, 16, 16, 16),
    (2, 100, 2, 16, 8, 32),
    (1, 70, 2, 8, 8, 64),
    (2, 1, 2, 8, 8, 16),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def inputs(op: str, B, T, H, K, V, seed, decay=1.0, n=3) -> list[torch.Tensor]:
    """q, k (L2-normalised), v, g, beta, state in fp64 with gradients; KDA's g per key channel, DeltaProduct's
    k, v and beta ``n`` per token."""
    gen = torch.Generator().manual_seed(seed)
    steps = T * n if op == "product" else T
    q = torch.randn(B, T, H, K, generator=gen, dtype=F64)
    k = F.normalize(torch.randn(B, steps, H, K, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(B, steps, H, V, generator=gen, dtype=F64)
    g = F.logsigmoid(torch.randn(B, T, H, *((K,) if op == "kda" else ()), generator=gen, dtype=F64) + 2) * decay
    beta = torch.rand(B, steps, H, generator=gen, dtype=F64)
    state = torch.randn(B, H, K, V, generator=gen, dtype=F64)
    return [t.requires_grad_() for t in (q, k, v, g, beta, state)]


def run(op: str, x: list[torch.Tensor], backend: str, chunk: int):
    q, k, v, g, beta, state = x
    fn = kda if op == "kda" else gated_delta_product
    return fn(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, state=state, backend=backend, chunk_size=chunk)


@pytest.mark.parametrize("op", ["kda", "product"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-H{}-K{}-V{}-C{}".format(*s))
def test_chunked_matches_step_by_step_outputs_and_gradients(op, shape):
    """fp64: outputs, final state and the gradients of every input (the initial state included)."""
    B, T, H, K, V, chunk = shape
    x = inputs(op, B, T, H, K, V, seed=T)
    results = {}
    for backend in ("recurrent", "chunked"):
        o, S = run(op, x, backend, chunk)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
        results[backend] = (o, S, torch.autograd.grad((o * w).sum() + (S * S).sum(), x))
    (o_ref, s_ref, g_ref), (o, s, grads) = results["recurrent"], results["chunked"]
    assert o.shape == (B, T, H, V) and s.shape == (B, H, K, V)
    assert rel_err(o, o_ref) <= 1e-12 and rel_err(s, s_ref) <= 1e-12
    for got, want in zip(grads, g_ref):
        assert rel_err(got, want) <= 1e-12


@pytest.mark.parametrize("op", ["kda", "product"])
def test_chunked_is_stable_under_strong_decay(op):
    """Log-decays of -60 per step and channel: every exponential of the chunked form is of a difference <= 0
    (KDA's across sub-chunks too), so outputs and gradients stay finite and exact."""
    x = inputs(op, 2, 40, 2, 8, 8, seed=3, decay=60.0)
    outs = {b: run(op, x, b, 32)[0] for b in ("recurrent", "chunked")}
    outs["chunked"].sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in x)
    assert rel_err(outs["chunked"], outs["recurrent"]) <= 1e-10


@pytest.mark.parametrize("op", ["kda", "product"])
def test_operator_in_pieces_equals_one_call(op):
    q, k, v, g, beta, _ = (t.detach() for t in inputs(op, 2, 50, 2, 8, 8, seed=4))
    n = k.shape[1] // q.shape[1]
    full, full_state = run(op, [q, k, v, g, beta, None], "chunked", 16)
    state, outs, start = None, [], 0
    for size in (1, 20, 3, 16, 10):
        per_token = [t[:, start : start + size] for t in (q, g)]
        per_step = [t[:, start * n : (start + size) * n] for t in (k, v, beta)]
        o, state = run(op, [per_token[0], *per_step[:2], per_token[1], per_step[2], state], "chunked", 16)
        outs.append(o)
        start += size
    assert torch.allclose(torch.cat(outs, dim=1), full, atol=1e-12)
    assert torch.allclose(state, full_state, atol=1e-12)


def fla_reference_fp64(folder: str, name: str):
    """fla's pure-torch reference ``fla/ops/<folder>/naive.py:name``, loaded by file path (``fla.ops`` imports
    triton), with its casts to fp32 (``torch.float``, ``torch.float32``, ``.float()``) turned into casts to fp64:
    the same algorithm, compared in fp64."""
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("fla not installed")
    source = (Path(spec.origin).parent / "ops" / folder / "naive.py").read_text()
    source = re.sub(r"\.float\(\)", ".double()", re.sub(r"torch\.float(32)?\b", "torch.float64", source))
    namespace: dict = {}
    exec(compile(source, f"fla/ops/{folder}/naive.py (fp64)", "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("reference", ["naive_recurrent_kda", "naive_chunk_kda"])
def test_kda_matches_fla_reference_in_fp64(reference):
    """Outputs and final states from a random initial state, fla's recurrent and chunked references (the chunked
    one takes whole chunks: T = 64)."""
    fla_fn = fla_reference_fp64("kda", reference)
    q, k, v, g, beta, state = (t.detach() for t in inputs("kda", 2, 64, 3, 16, 8, seed=7))
    ours, ours_state = run("kda", [q, k, v, g, beta, state], "chunked", 16)
    theirs, theirs_state = fla_fn(q, k, v, g, beta, scale=16**-0.5, initial_state=state, output_final_state=True)
    assert theirs.dtype == F64
    assert rel_err(ours, theirs) <= 1e-10 and rel_err(ours_state, theirs_state) <= 1e-10


def test_gated_delta_product_matches_fla_reference_in_fp64():
    fla_fn = fla_reference_fp64("gated_delta_product", "naive_recurrent_gated_delta_product")
    q, k, v, g, beta, state = (t.detach() for t in inputs("product", 2, 37, 3, 16, 8, seed=8, n=3))
    ours, ours_state = run("product", [q, k, v, g, beta, state], "chunked", 16)
    theirs, theirs_state = fla_fn(q, k, v, g, beta, 16**-0.5, initial_state=state, output_final_state=True,
                                  num_householder=3)
    assert theirs.dtype == F64
    assert rel_err(ours, theirs) <= 1e-10 and rel_err(ours_state, theirs_state) <= 1e-10
