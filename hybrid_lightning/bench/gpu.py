"""The GPU check, sized for ~10 minutes on one H200: ``python -m hybrid_lightning.bench.gpu [--out DIR]``.

``--rehearse`` runs every section on the CPU at tiny shapes through the same code, the device choosing
autocast, the optimizer's fused kernel, synchronisation and the backends: on a GPU the script then has
nothing left to discover but numbers.

1. Correctness in bf16: the attention backends that run on CUDA (flash-attn when installed, FlexAttention,
   SDPA) against the fp32 reference on the same bf16 inputs, outputs and gradients, full attention,
   windows and head-wise layers (some heads full, the others windowed), with and without cached keys before
   the queries.
2. MFU of training a ~125M-parameter model (GPT-2-small shape: 12 layers, d=768, vocab 50304, tied) at
   T=4096 in bf16 autocast: full attention, the SWA-512 hybrid and the Gated DeltaNet hybrid, eager and
   ``torch.compile``; a configuration that raises is a row of its own, naming the exception.
3. A short ``hybrid-lightning train`` killed after a checkpoint and resumed, checked exact
   (``hybrid_lightning.bench.gpu_resume``).
4. The recurrent mixers' fla kernels against their references: ``hybrid_lightning.bench.gpu_recurrent.main()``,
   when that module is installed; last, since fla autotunes its kernels at their first call (minutes).
   On the CPU (``--rehearse``) the same checks run through Triton's interpreter, in a process of their own.

The results so far are written after each section, so a run stopped at a time limit keeps them.
Writes ``gpu.json`` and ``gpu.md`` (``rehearsal.json``, ``rehearsal.md`` with ``--rehearse``) to the
output folder; exits 1 when a check fails and 2 when no CUDA device is visible (without ``--rehearse``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_lightning.bench.__main__ import DEFAULT_OUT, MARKER, markdown
from hybrid_lightning.bench.gpu_resume import resume_check
from hybrid_lightning.bench.measure import sync
from hybrid_lightning.bench.training import PlainStep
from hybrid_lightning.fileio import write_owned
from hybrid_lightning.model.attention import HAS_FLASH_ATTN, attend
from hybrid_lightning.model.mixers.headwise import attend_heads
from hybrid_lightning.model.ops.common import auto_choice as auto_recurrent
from hybrid_lightning.model.ops.common import fla_error
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.count import count
from hybrid_lightning.plan.precision import peak_bf16_tflops

TOLERANCE = 2e-2  # relative RMS error allowed in bf16 (its unit roundoff is 2**-8 = 3.9e-3)
# (T, window, cached keys before the queries, heads, kv heads): full, windows, a ragged T, GQA, a KV cache, and
# head-wise layers (a window per head) whose groups split the GQA groups or follow them
HEADWISE = (None, 128) * 4, (None,) * 4 + (300,) * 4
CASES = [(1024, None, 0, 8, 8), (2048, 128, 0, 8, 8), (4096, 512, 0, 8, 2), (1000, 300, 0, 8, 4), (256, 64, 200, 8, 8),
         (2048, HEADWISE[0], 0, 8, 2), (1000, HEADWISE[1], 200, 8, 2)]
MFU_MODEL = {"n_layers": 12, "d_model": 768, "n_heads": 12, "vocab_size": 50304, "tie_embeddings": True}
MFU_SEQ, MFU_BATCH, MFU_WARMUP, MFU_STEPS = 4096, 8, 3, 10


@dataclass(frozen=True)
class Sizes:
    """The shapes of one run of the check."""

    cases: list  # attention correctness cases, as CASES
    model: dict  # the MFU model
    seq: int
    batch: int
    warmup: int
    steps: int
    window: int  # of the SWA hybrid's MFU row
    compiled: int  # how many MFU architectures (in order) also run under torch.compile


GPU = Sizes(CASES, MFU_MODEL, MFU_SEQ, MFU_BATCH, MFU_WARMUP, MFU_STEPS, 512, 3)
REHEARSAL = Sizes([(64, None, 0, 4, 4), (96, 16, 0, 4, 2), (50, 20, 10, 4, 2), (96, (None, 16) * 2, 10, 4, 2)],
                  {"n_layers": 4, "d_model": 64, "n_heads": 2, "vocab_size": 257, "tie_embeddings": True},
                  128, 2, 1, 2, 32, 1)  # compiling takes 1-4 minutes a model on one CPU core


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def backend_errors(backend: str, T: int, window: int | None | tuple, past: int, heads: int, kv_heads: int,
                   device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Relative RMS errors of ``backend`` against the fp32 reference on the same ``dtype`` inputs:
    the output and the gradients of q, k and v. Shapes: q (2, heads, T, 64), k and v (2, kv_heads, past+T, 64).
    ``window``: one for every head, or a head-wise layer's, one per head (``attend_heads``)."""
    g = torch.Generator(device=device).manual_seed(T + past)
    q = torch.randn(2, heads, T, 64, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, past + T, 64, generator=g, device=device, dtype=dtype) for _ in range(2))
    grad = torch.randn(2, heads, T, 64, generator=g, device=device, dtype=dtype)
    results = []
    for b, cast in ((backend, dtype), ("reference", torch.float32)):
        inputs = [t.to(cast).requires_grad_() for t in (q, k, v)]
        if isinstance(window, tuple):
            out = attend_heads(*inputs, window, backend=b)
        else:
            out = attend(*inputs, window=window, backend=b)
        results.append((out, *torch.autograd.grad(out, inputs, grad.to(cast))))
    names = ("out", "dq", "dk", "dv")
    return {name: rel_rms(a, b) for name, a, b in zip(names, *results)}


def attention_backends(device: torch.device) -> list[str]:
    """The backends that train on ``device`` (FlexAttention trains on CUDA only; ``blocked`` is the CPU path)."""
    if device.type == "cuda":
        return ["sdpa", "flex"] + (["flash"] if HAS_FLASH_ATTN else [])
    return ["sdpa", "blocked"]


def correctness(device: torch.device, cases: list) -> list[dict]:
    rows = []
    for backend in attention_backends(device):
        for T, window, past, heads, kv_heads in cases:
            errors = backend_errors(backend, T, window, past, heads, kv_heads, device)
            shown = "head-wise " + "/".join(str(w or "full") for w in window) if isinstance(window, tuple) else window
            rows.append({"backend": backend, "T": T, "window": shown or "full", "cached keys": past,
                         "heads / kv": f"{heads}/{kv_heads}", **errors, "ok": max(errors.values()) <= TOLERANCE})
    return rows


def recurrent(device: torch.device) -> object:
    """The fla check of the recurrent mixers: in this process on CUDA; on the CPU through Triton's
    interpreter in a process of its own (``TRITON_INTERPRET`` must be set before triton is imported)."""
    if importlib.util.find_spec("hybrid_lightning.bench.gpu_recurrent") is None:
        return "hybrid_lightning.bench.gpu_recurrent is not installed: no recurrent check"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        if device.type == "cuda":
            status = importlib.import_module("hybrid_lightning.bench.gpu_recurrent").main(["--out", str(out)])
            error = [f"fla: {fla_error()}" if fla_error() else "no rows written"]
        else:
            proc = subprocess.run([sys.executable, "-m", "hybrid_lightning.bench.gpu_recurrent", "--interpret",
                                   "--out", str(out)],
                                  capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"})
            status, error = proc.returncode, proc.stderr.strip().splitlines()[-1:]
        if not out.exists():
            return {"exit status": status, "error": error}
        return {"exit status": status, "rows": json.loads(out.read_text())["rows"]}


def mfu_archs(window: int) -> list[tuple[str, dict]]:
    return [("full", {"pattern": "F"}), (f"SWA-{window} hybrid", {"pattern": "EEEF", "window": window}),
            ("gated_deltanet hybrid", {"pattern": "EEEF", "mixer": "gated_deltanet", "match_params": "F"})]


def mfu(device: torch.device, peak_tflops: float | None, sizes: Sizes) -> tuple[list[dict], list[dict]]:
    """Training step time and model FLOP/s in bf16 autocast, per architecture, eager and compiled: (the rows, and
    one row per configuration that raised, naming its exception; the others still run)."""
    rows, errors = [], []
    batch = torch.randint(0, sizes.model["vocab_size"], (sizes.batch, sizes.seq + 1), device=device)
    for i, (name, arch) in enumerate(mfu_archs(sizes.window)):
        for compiled in (False, True)[: 1 + (i < sizes.compiled)]:
            try:
                rows.append(mfu_row(device, peak_tflops, sizes, batch, name, arch, compiled))
            except Exception as e:  # a kernel refusing this machine: the row says so, the other rows run
                errors.append({"model": name, "compile": compiled, "error": f"{type(e).__name__}: {e}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows, errors


def mfu_row(device: torch.device, peak_tflops: float | None, sizes: Sizes, batch: torch.Tensor, name: str,
            arch: dict, compiled: bool) -> dict:
    torch.manual_seed(0)
    model = build_model({**sizes.model, **arch}).to(device)
    if compiled:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    step = PlainStep(model, opt, None, 1.0)
    t_compile = time.perf_counter()
    for _ in range(sizes.warmup):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            step(batch)
    sync()
    t0 = time.perf_counter()
    for _ in range(sizes.steps):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = step(batch)
    sync()
    secs = (time.perf_counter() - t0) / sizes.steps
    tokens = sizes.batch * sizes.seq
    counts = count(model.opts, model.plan, (sizes.seq,))
    tflops = counts.flops[sizes.seq] * tokens / secs / 1e12
    return {
        "model": name, "compile": compiled,
        "recurrent": auto_recurrent(device.type == "cuda") if "mixer" in arch else "-", "params": counts.total,
        "step s": secs, "tokens/s": tokens / secs, "model TFLOP/s": tflops,
        "MFU": tflops / peak_tflops if peak_tflops else "peak unknown: pass --peak-tflops",
        "warm-up s": t0 - t_compile, "loss": loss,
    }


def checks(device: torch.device, sizes: Sizes, peak: float | None, save=lambda partial: None) -> dict:
    """Every section, in order; ``ok`` when every correctness check and the resume check pass. ``save`` is
    called with the sections done so far after each one, so a run stopped at its time limit keeps them.
    The recurrent section runs last: fla's kernels are autotuned on their first call (minutes)."""
    t0 = time.perf_counter()
    result = {"torch": torch.__version__, "flash_attn": HAS_FLASH_ATTN, "peak_bf16_tflops": peak}
    result["correctness"] = correctness(device, sizes.cases)
    save(result)
    result["mfu"], result["mfu errors"] = mfu(device, peak, sizes)
    save(result)
    with tempfile.TemporaryDirectory() as tmp:
        result["resume"] = resume_check(Path(tmp), "gpu" if device.type == "cuda" else "cpu")
    save(result)
    fla = result["recurrent"] = recurrent(device)
    fla_ok = isinstance(fla, dict) and fla.get("exit status") == 0
    result["ok"] = (all(r["ok"] for r in result["correctness"]) and fla_ok and result["resume"]["ok"]
                    and not result["mfu errors"] and all(r["loss"] == r["loss"] for r in result["mfu"]))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def report(result: dict, name: str, sizes: Sizes) -> str:
    checks_rows, mfu_rows = result["correctness"], result["mfu"]
    return "\n".join([
        markdown({"title": f"Attention backends vs the fp32 reference in bf16 ({name})",
                  "columns": list(checks_rows[0]), "rows": checks_rows,
                  "notes": f"Relative RMS error of the output and of each gradient; ok when all <= {TOLERANCE}."}),
        markdown({"title": f"Training MFU, {sizes.batch} x {sizes.seq} tokens, bf16 autocast ({name})",
                  "columns": list(mfu_rows[0]), "rows": mfu_rows,
                  "notes": f"Mean step time over {sizes.steps} steps after {sizes.warmup} warm-up steps; "
                           f"peak {result['peak_bf16_tflops']} TFLOP/s; FLOPs per token as in plan/count.py."}),
        *(f"MFU not measured for {e['model']} ({'compiled' if e['compile'] else 'eager'}): {e['error']}\n"
          for e in result["mfu errors"]),
        f"## Recurrent mixers (fla)\n\n```\n{json.dumps(result['recurrent'], indent=1, default=str)}\n```\n",
        f"## Killed and resumed\n\n```\n{json.dumps(result['resume'], indent=1)}\n```\n",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid_lightning.bench.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument("--peak-tflops", type=float,
                   help="the GPU's dense bf16 peak (default: known for H100/H200/A100/L40S)")
    p.add_argument("--rehearse", action="store_true", help="every section on the CPU at tiny shapes")
    args = p.parse_args(argv)
    if not args.rehearse and not torch.cuda.is_available():
        print("python -m hybrid_lightning.bench.gpu: error: needs a CUDA GPU, and torch sees none "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); --rehearse runs it on the CPU",
              file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.rehearse else "cuda")
    name = "CPU rehearsal" if args.rehearse else torch.cuda.get_device_name(device)
    peak = args.peak_tflops or peak_bf16_tflops(name)
    sizes = REHEARSAL if args.rehearse else GPU
    stem = "rehearsal" if args.rehearse else "gpu"

    def save(partial: dict) -> None:
        write_owned(args.out, MARKER, f"{stem}.json", json.dumps({"device": name, **partial}, indent=1, default=str),
                    "--out")

    result = {"device": name, **checks(device, sizes, peak, save)}
    write_owned(args.out, MARKER, f"{stem}.json", json.dumps(result, indent=1, default=str), "--out")
    tables = report(result, name, sizes)
    write_owned(args.out, MARKER, f"{stem}.md",
                f"# GPU check{' (rehearsal)' * args.rehearse}\n\n{tables}\n_{result['seconds']} s_\n", "--out")
    print(tables)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
