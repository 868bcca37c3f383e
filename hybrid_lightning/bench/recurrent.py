"""B4: the chunked recurrent operators, fwd+bwd on CPU, against the step-by-step reference and
against flash-linear-attention's own pure-torch chunked reference (its ``naive.py``).

Shapes follow the issue: B=1, H=4, head width 64 (keys and values), chunk 64, fp32. Every time is
the minimum over repeats taken round-robin across the implementations compared, so a busy machine
slows all of them alike and the ratios stay meaningful.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from hybrid_lightning.model.ops.delta_product import gated_delta_product
from hybrid_lightning.model.ops.delta_rule import chunked_delta_rule, recurrent_delta_rule
from hybrid_lightning.model.ops.gated_linear import chunked_gla, recurrent_gla
from hybrid_lightning.model.ops.kda import kda

B, H, DIM, CHUNK = 1, 4, 64, 64
TARGETS = {"vs_recurrent": 20.0, "vs_fla_naive": 1.0, "growth": 2.3}  # the acceptance numbers

HOUSEHOLDER = 2  # Gated DeltaProduct's delta-rule steps per token (its layer's default)
# op -> (ours chunked, ours step-by-step, fla naive file under fla/ops, fla naive chunked function or None where
# fla has none); step-by-step None: one dispatcher for both (KDA, Gated DeltaProduct: ``backend`` chunked or recurrent)
OPS = {
    "gated_delta_rule": (chunked_delta_rule, recurrent_delta_rule, "gated_delta_rule", "naive_chunk_gated_delta_rule"),
    "gated_linear_attention": (chunked_gla, recurrent_gla, "simple_gla", "naive_chunk_simple_gla"),
    "kda": (kda, None, "kda", "naive_chunk_kda"),
    "gated_delta_product": (gated_delta_product, None, "gated_delta_product", None),
}


def fla_naive(folder: str, name: str | None) -> tuple[Callable | None, str]:
    """fla's pure-torch chunked reference, loaded by file path: ``fla.ops`` itself imports triton."""
    if name is None:
        return None, f"fla has no pure-torch chunked reference (fla/ops/{folder}/naive.py is step by step)"
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        return None, "fla not installed"
    path = Path(spec.origin).parent / "ops" / folder / "naive.py"
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{folder}", path)
    if module_spec is None or not path.is_file():
        return None, f"fla has no {path.relative_to(Path(spec.origin).parent)}"
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as e:  # e.g. einops missing
        return None, f"fla's naive reference does not import: {e}"
    return getattr(module, name), ""


def inputs(T: int, batch: int = B, heads: int = H, key: int = DIM, value: int = DIM,
           seed: int = 0, op: str = "gated_delta_rule") -> dict[str, torch.Tensor]:
    """Random operator inputs on the CPU: q, k (L2-normalised), v, g (log-decay, about 0.95 per step), beta; for
    ``kda`` g per key channel, for ``gated_delta_product`` k, v and beta ``HOUSEHOLDER`` per token."""
    g = torch.Generator().manual_seed(seed)
    steps = T * HOUSEHOLDER if op == "gated_delta_product" else T
    channels = (key,) if op == "kda" else ()
    return {
        "q": torch.randn(batch, T, heads, key, generator=g).requires_grad_(),
        "k": F.normalize(torch.randn(batch, steps, heads, key, generator=g), dim=-1).requires_grad_(),
        "v": torch.randn(batch, steps, heads, value, generator=g).requires_grad_(),
        "g": F.logsigmoid(torch.randn(batch, T, heads, *channels, generator=g) + 3).requires_grad_(),
        "beta": torch.rand(batch, steps, heads, generator=g).requires_grad_(),
    }


def calls(op: str, x: dict, fla_fn: Callable | None) -> dict[str, Callable[[], torch.Tensor]]:
    """The implementations of ``op`` on the same inputs, each returning its output."""
    chunked, recurrent, _, _ = OPS[op]
    scale = DIM**-0.5
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    if recurrent is None:
        out = {name: (lambda b=name: chunked(q, k, v, g, beta, scale=scale, backend=b, chunk_size=CHUNK)[0])
               for name in ("chunked", "recurrent")}
        if fla_fn is not None:
            out["fla_naive"] = lambda: fla_fn(q, k, v, g, beta, scale=scale, chunk_size=CHUNK)[0]
    elif op == "gated_delta_rule":
        out = {"chunked": lambda: chunked(q, k, v, g, beta, scale, None, CHUNK)[0],
               "recurrent": lambda: recurrent(q, k, v, g, beta, scale)[0]}
        if fla_fn is not None:  # note the order: g before beta here, unlike fla's recurrent reference
            out["fla_naive"] = lambda: fla_fn(q, k, v, g, beta, chunk_size=CHUNK, scale=scale)[0]
    else:
        out = {"chunked": lambda: chunked(q, k, v, g, scale, None, CHUNK)[0],
               "recurrent": lambda: recurrent(q, k, v, g, scale)[0]}
        if fla_fn is not None:
            out["fla_naive"] = lambda: fla_fn(q, k, v, g, chunk_size=CHUNK, scale=scale)[0]
    return out


def time_fwd_bwd(fns: dict[str, Callable[[], torch.Tensor]], x: dict, repeats: int) -> dict[str, float]:
    """Minimum fwd+bwd seconds of each function, repeats taken round-robin."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            for t in x.values():
                t.grad = None
            start = time.perf_counter()
            fn().sum().backward()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def check(fns: dict[str, Callable[[], torch.Tensor]]) -> float:
    """Largest relative error of the other implementations' outputs against the step-by-step one."""
    with torch.no_grad():
        ref = fns["recurrent"]()
        return max(((fn() - ref).norm() / ref.norm()).item() for name, fn in fns.items() if name != "recurrent")


def run(quick: bool) -> dict:
    lengths = (64, 128, 256) if quick else (1024, 2048, 4096, 8192, 16384)
    at = 256 if quick else 4096  # where the step-by-step reference is timed
    repeats = 2 if quick else 3
    rows, notes = [], []
    for op, (_, _, folder, name) in OPS.items():
        fla_fn, why = fla_naive(folder, name)
        if fla_fn is None:
            notes.append(f"{op}: {why}; no fla comparison.")
        t_small = 256 if op == "kda" else 200  # fla's naive_chunk_kda takes whole chunks only
        small = inputs(t_small, seed=1, op=op)
        notes.append(f"{op}: outputs agree with the step-by-step reference to "
                     f"{check(calls(op, small, fla_fn)):.1e} (T={t_small}).")
        previous = {}
        for T in lengths:
            x = inputs(T, op=op)
            fns = calls(op, x, fla_fn)
            if T != at:
                del fns["recurrent"]
            times = time_fwd_bwd(fns, x, repeats)
            row = {"op": op, "T": T, "chunked s": times["chunked"]}
            if "chunked" in previous:
                row["chunked ×/doubling"] = times["chunked"] / previous["chunked"]
            if "fla_naive" in times:
                row["fla naive s"] = times["fla_naive"]
                row["fla naive / chunked"] = times["fla_naive"] / times["chunked"]
                if "fla_naive" in previous:
                    row["fla naive ×/doubling"] = times["fla_naive"] / previous["fla_naive"]
            if "recurrent" in times:
                row["step-by-step s"] = times["recurrent"]
                row["step-by-step / chunked"] = times["recurrent"] / times["chunked"]
            rows.append(row)
            previous = times
        notes.append(summary(op, [r for r in rows if r["op"] == op], at))
    columns = ["op", "T", "chunked s", "chunked ×/doubling", "step-by-step s", "step-by-step / chunked",
               "fla naive s", "fla naive / chunked", "fla naive ×/doubling"]
    return {
        "title": f"(b) Recurrent operators, chunked fwd+bwd (B={B}, H={H}, head width {DIM}, chunk {CHUNK}, fp32)",
        "columns": columns, "rows": rows, "notes": " ".join(notes),
    }


def summary(op: str, rows: list[dict], at: int) -> str:
    """One sentence per op: each measured ratio against the issue's target."""
    steps = [r["chunked ×/doubling"] for r in rows if "chunked ×/doubling" in r]
    overall = (rows[-1]["chunked s"] / rows[0]["chunked s"]) ** (1 / len(steps))  # geometric mean per doubling
    (ref,) = [r for r in rows if r["T"] == at]
    parts = [f"{ref['step-by-step / chunked']:.0f}× faster than step-by-step at T={at} "
             f"(target ≥ {TARGETS['vs_recurrent']:.0f}×)",
             f"{overall:.2f}× per doubling of T from {rows[0]['T']} to {rows[-1]['T']} (target ≤ {TARGETS['growth']}×; "
             f"single doublings {min(steps):.2f}-{max(steps):.2f}×)"]
    if "fla naive / chunked" in ref:
        slowest = min(r["fla naive / chunked"] for r in rows if "fla naive / chunked" in r)
        parts.append(f"{slowest:.2f}× or more faster than fla's naive chunked reference (target ≥ 1×)")
    return f"{op}: " + "; ".join(parts) + "."
