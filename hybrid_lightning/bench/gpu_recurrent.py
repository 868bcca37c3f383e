"""B6: on a CUDA GPU, flash-linear-attention's kernels against the torch chunked path.

    python -m hybrid_lightning.bench.gpu_recurrent [--quick] [--out FILE.json]
    TRITON_INTERPRET=1 python -m hybrid_lightning.bench.gpu_recurrent --interpret

``--interpret`` runs the same checks on CPU tensors through Triton's interpreter (the ``fla-cpu``
extra; ``hybrid_lightning/interpreter.py``), at tiny shapes in fp32, with fp32 tolerances: the kernels'
arguments, layouts, states and gradients checked before any GPU is at hand.

For each operator (on bf16 inputs; the reference computes in fp32 on the same values) and each
recurrent mixer (under bf16 autocast, the same weights through both backends) it compares outputs,
final states and every gradient, checks that the fla path fed in pieces with carried state
equals one call, and that packed documents through fla's ``cu_seqlens`` equal each document run alone
(the chunked path's ``by_document``), outputs and gradients. Errors are relative: ||a - b|| / ||b||. A few
minutes on one H200; exit status 0 when every check passes, 1 when one fails, 2 when there is no CUDA device
or fla.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from hybrid_lightning.bench.recurrent import inputs
from hybrid_lightning.fileio import refuse_existing
from hybrid_lightning.interpreter import interpreting, patch
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.ops import fla_available, gated_delta_rule, gated_linear_attention
from hybrid_lightning.plan import layer_plan, resolve_model_config

# bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 0.002 per value); sums of thousands of such
# terms in the kernels land around 1e-2 at worst. A wrong kernel call (swapped g and beta, a missing
# scale) gives errors of order 1.
OUTPUT_TOL = 2e-2
GRAD_TOL = 4e-2
FP32_TOL = 1e-4  # under the interpreter, in fp32: the chunked path's own agreement with the recurrence
RECURRENT = tuple(k.name for k in KINDS.values() if k.recurrent)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def op_inputs(B, T, H, K, V, device, seed=0) -> dict[str, torch.Tensor]:
    """The benchmark's random inputs plus an initial state, on ``device``, without gradients."""
    x = inputs(T, B, H, K, V, seed)
    x["state"] = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(seed)) * 0.1
    return {n: t.detach().to(device) for n, t in x.items()}


def call_op(op: str, x: dict, backend: str):
    scale = x["q"].shape[-1] ** -0.5
    if op == "gated_delta_rule":
        return gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale, state=x["state"],
                                backend=backend)
    return gated_linear_attention(x["q"], x["k"], x["v"], x["g"], scale=scale, state=x["state"], backend=backend)


def op_checks(device: str, candidate: str, reference: str, dtype: torch.dtype, shapes,
              tol: tuple[float, float] = (OUTPUT_TOL, GRAD_TOL)) -> list[dict]:
    """Each operator through ``candidate`` on ``dtype`` inputs against ``reference`` in fp32 on the same
    values, from a random initial state; ``tol`` = (outputs and final states, gradients)."""
    rows = []
    for op in ("gated_linear_attention", "gated_delta_rule"):
        for B, T, H, K, V in shapes:
            base = op_inputs(B, T, H, K, V, device)
            results = {}
            for backend, cast in ((candidate, dtype), (reference, torch.float32)):
                x = {n: t.to(dtype).to(cast).requires_grad_() for n, t in base.items()}
                x["g"], x["state"] = (x["g"].float().detach().requires_grad_(),
                                      x["state"].float().detach().requires_grad_())
                o, s = call_op(op, x, backend)
                w = torch.randn(o.shape, generator=torch.Generator(device="cpu").manual_seed(1)).to(device)
                ((o.float() * w).sum() + s.float().pow(2).sum()).backward()
                used = [n for n in x if op == "gated_delta_rule" or n != "beta"]
                results[backend] = (o, s, {n: x[n].grad for n in used})
            (o_c, s_c, g_c), (o_r, s_r, g_r) = results[candidate], results[reference]
            grad = max(rel(g_c[n], g_r[n]) for n in g_r)
            out, state = rel(o_c, o_r), rel(s_c, s_r)
            rows.append({"check": f"{op} B={B} T={T} H={H} K={K} V={V}", "output": out, "state": state, "grad": grad,
                         "ok": out <= tol[0] and state <= tol[0] and grad <= tol[1]})
    return rows


def mixer_checks(device: str, candidate: str, reference: str, dtype: torch.dtype, T: int, d_model: int,
                 tol: tuple[float, float] = (OUTPUT_TOL, GRAD_TOL)) -> list[dict]:
    """Each recurrent mixer, same weights, through both backends (under ``dtype`` autocast unless fp32):
    outputs, every parameter's gradient and the final states it carries; then the candidate fed in three
    pieces with carried state against its own full forward; then packed documents (``documents_check``)."""
    rows = []
    for name in RECURRENT:
        cfg = resolve_model_config({"d_model": d_model, "n_heads": max(1, d_model // 64), "n_layers": 4,
                                    "pattern": "EEEF", "mixer": name})
        torch.manual_seed(0)
        spec = layer_plan(cfg)[1]
        mixer = KINDS[name].mixer_class()(spec.options, spec).to(device)
        x = torch.randn(2, T, d_model, generator=torch.Generator(device="cpu").manual_seed(2)).to(device)
        finals = {}
        y_c, out, grad = compare_backends(mixer, x, candidate, reference, dtype, finals=finals)
        final = max(rel(finals[candidate][n], t) for n, t in finals[reference].items() if torch.is_tensor(t))
        state, pieces = {}, []
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            for piece in x.split([T // 3, 1, T - T // 3 - 1], dim=1):
                pieces.append(mixer(piece, state))
        piecewise = rel(torch.cat(pieces, 1), y_c)
        doc_out, doc_grad = documents_check(mixer, x, candidate, reference, dtype)
        rows.append({"check": f"mixer {name} T={T} d_model={d_model}", "output": out, "grad": grad, "state": final,
                     "pieces": piecewise, "documents": doc_out, "documents_grad": doc_grad,
                     "ok": max(out, final, piecewise, doc_out) <= tol[0] and max(grad, doc_grad) <= tol[1]})
    return rows


def compare_backends(mixer, x: torch.Tensor, candidate: str, reference: str, dtype: torch.dtype,
                     doc_ids: torch.Tensor | None = None,
                     finals: dict | None = None) -> tuple[torch.Tensor, float, float]:
    """The mixer's forward (on ``doc_ids``' documents, if given) and backward through ``candidate`` and
    ``reference``, same weights, under ``dtype`` autocast unless fp32: (the candidate's output, the output
    error, the worst parameter-gradient error). ``finals``, when given, gets each backend's carried states."""
    results = {}
    for backend in (candidate, reference):
        mixer.backend = backend
        mixer.zero_grad()
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
            y = mixer(x, None, doc_ids)
            if finals is not None:
                finals[backend] = {}
                with torch.no_grad():
                    mixer(x, finals[backend])
        y.float().pow(2).mean().backward()
        results[backend] = (y.detach(), {n: p.grad.clone() for n, p in mixer.named_parameters()})
    mixer.backend = candidate
    (y_c, g_c), (y_r, g_r) = results[candidate], results[reference]
    return y_c, rel(y_c, y_r), max(rel(g_c[n], g_r[n]) for n in g_r)


def documents_check(mixer, x: torch.Tensor, candidate: str, reference: str, dtype: torch.dtype) -> tuple[float, float]:
    """Packed documents (a first row of three, one of them a single token; a second row of one) through
    ``candidate`` (fla: one call with ``cu_seqlens``) against ``reference`` (each document alone):
    (output error, worst parameter-gradient error)."""
    T = x.shape[1]
    doc_ids = torch.stack([torch.repeat_interleave(torch.arange(3), torch.tensor([T // 3, 1, T - T // 3 - 1])),
                           torch.zeros(T, dtype=torch.long)]).to(x.device)
    return compare_backends(mixer, x, candidate, reference, dtype, doc_ids)[1:]


def timings(device: str, T: int) -> list[dict]:
    """fwd+bwd seconds of fla and the torch chunked path (median of 5 after a warm-up), for the record."""
    rows = []
    for op in ("gated_linear_attention", "gated_delta_rule"):
        base = op_inputs(4, T, 16, 128, 128, device)
        row = {"check": f"time {op} B=4 T={T} H=16 K=V=128"}
        for backend, dtype in (("fla", torch.bfloat16), ("chunked", torch.float32)):
            x = {n: t.to(dtype).requires_grad_() for n, t in base.items()}
            x["g"] = x["g"].float().detach().requires_grad_()
            times = []
            for _ in range(6):
                torch.cuda.synchronize()
                start = time.perf_counter()
                call_op(op, x, backend)[0].float().sum().backward()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            row[f"{backend} s"] = sorted(times[1:])[2]
        rows.append(row)
    return rows


def interpreter_rows() -> list[dict]:
    """The checks on CPU through Triton's interpreter, fp32: operators at a ragged T with K != V from an
    initial state, then every recurrent mixer. About a minute on one core."""
    tol = (FP32_TOL, FP32_TOL)
    rows = op_checks("cpu", "fla", "chunked", torch.float32, [(2, 37, 2, 16, 32), (1, 70, 1, 32, 16)], tol)
    return rows + mixer_checks("cpu", "fla", "chunked", torch.float32, T=40, d_model=64, tol=tol)


def main(argv: list[str] | tuple[str, ...] = ()) -> int:
    """Runs every check; ``argv`` are this script's options (none = the full run), not ``sys.argv``,
    so another script may call ``main()``."""
    p = argparse.ArgumentParser(prog="python -m hybrid_lightning.bench.gpu_recurrent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller shapes")
    p.add_argument("--interpret", action="store_true", help="on CPU through Triton's interpreter (TRITON_INTERPRET=1)")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(list(argv))
    if args.out:
        refuse_existing(args.out, "--out")
    if args.interpret and not (interpreting() and fla_available()):
        print("gpu_recurrent --interpret: needs TRITON_INTERPRET=1 in the environment and the fla-cpu extra "
              "(pip install -e '.[fla-cpu]')", file=sys.stderr)
        return 2
    if args.interpret:
        patch()  # this process's explicit opt-in (hybrid_lightning/interpreter.py)
    if not args.interpret and (not torch.cuda.is_available() or not fla_available()):
        print("gpu_recurrent: needs a CUDA device and flash-linear-attention (pip install -e '.[gpu]')",
              file=sys.stderr)
        return 2
    rows = interpreter_rows() if args.interpret else gpu_rows(args.quick)
    for row in rows:
        print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.out:
        device = "CPU (Triton interpreter)" if args.interpret else torch.cuda.get_device_name()
        args.out.write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    failed = [r["check"] for r in rows if r.get("ok") is False]
    tols = (f"output and state {FP32_TOL}, grad {FP32_TOL}" if args.interpret
            else f"output {OUTPUT_TOL}, grad {GRAD_TOL}")
    print(f"gpu_recurrent: {len(failed)} of {sum('ok' in r for r in rows)} checks failed {failed}" if failed
          else f"gpu_recurrent: all {sum('ok' in r for r in rows)} checks passed (tolerances: {tols})")
    return 1 if failed else 0


def gpu_rows(quick: bool) -> list[dict]:
    """The checks on the CUDA device in bf16, then the timings."""
    shapes = [(2, 300, 4, 64, 64)] if quick else [(2, 1000, 4, 64, 64), (1, 4096, 8, 128, 128), (3, 37, 2, 64, 128)]
    rows = op_checks("cuda", "fla", "chunked", torch.bfloat16, shapes)
    rows += mixer_checks("cuda", "fla", "chunked", torch.bfloat16, T=300 if quick else 2000,
                         d_model=256 if quick else 1024)
    return rows + timings("cuda", 2048 if quick else 8192)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
