"""The GPU check, sized for ~10 minutes on one H200: ``python -m hybrid_lightning.bench.gpu [--out DIR]``.

1. Correctness in bf16: the attention backends that run on CUDA (flash-attn when installed, FlexAttention,
   SDPA) against the fp32 reference on the same bf16 inputs, outputs and gradients, full attention and
   windows, with and without cached keys before the queries.
2. The recurrent mixers' fla kernels against their references: ``hybrid_lightning.bench.gpu_recurrent.main()``,
   when that module is installed.
3. MFU of training a ~125M-parameter model (GPT-2-small shape: 12 layers, d=768, vocab 50304, tied) at
   T=4096 in bf16 autocast: full attention and the SWA-512 hybrid, eager and ``torch.compile``.

Writes ``gpu.json`` and ``gpu.md`` to the output folder; exits 1 when a correctness check fails and 2
when no CUDA device is visible.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

from hybrid_lightning.bench.__main__ import DEFAULT_OUT, markdown
from hybrid_lightning.bench.training import PlainStep
from hybrid_lightning.model import build_model, count_params, model_flops_per_token
from hybrid_lightning.model.attention import HAS_FLASH_ATTN, attend

TOLERANCE = 2e-2  # relative RMS error allowed in bf16 (its unit roundoff is 2**-8 = 3.9e-3)
# (T, window, cached keys before the queries, heads, kv heads): full, windows, a ragged T, GQA, a KV cache
CASES = [(1024, None, 0, 8, 8), (2048, 128, 0, 8, 8), (4096, 512, 0, 8, 2), (1000, 300, 0, 8, 4), (256, 64, 200, 8, 8)]
MFU_MODEL = {"n_layers": 12, "d_model": 768, "n_heads": 12, "vocab_size": 50304, "tie_embeddings": True}
MFU_SEQ, MFU_BATCH, MFU_WARMUP, MFU_STEPS = 4096, 8, 3, 10
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1}  # dense, no sparsity


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def backend_errors(backend: str, T: int, window: int | None, past: int, heads: int, kv_heads: int,
                   device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Relative RMS errors of ``backend`` against the fp32 reference on the same ``dtype`` inputs:
    the output and the gradients of q, k and v. Shapes: q (2, heads, T, 64), k and v (2, kv_heads, past+T, 64)."""
    g = torch.Generator(device=device).manual_seed(T + past)
    q = torch.randn(2, heads, T, 64, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, past + T, 64, generator=g, device=device, dtype=dtype) for _ in range(2))
    grad = torch.randn(2, heads, T, 64, generator=g, device=device, dtype=dtype)
    results = []
    for b, cast in ((backend, dtype), ("reference", torch.float32)):
        inputs = [t.to(cast).requires_grad_() for t in (q, k, v)]
        out = attend(*inputs, window=window, backend=b)
        results.append((out, *torch.autograd.grad(out, inputs, grad.to(cast))))
    names = ("out", "dq", "dk", "dv")
    return {name: rel_rms(a, b) for name, a, b in zip(names, *results)}


def correctness(device: torch.device) -> list[dict]:
    backends = ["sdpa", "flex"] + (["flash"] if HAS_FLASH_ATTN else [])
    rows = []
    for backend in backends:
        for T, window, past, heads, kv_heads in CASES:
            errors = backend_errors(backend, T, window, past, heads, kv_heads, device)
            rows.append({"backend": backend, "T": T, "window": window or "full", "cached keys": past,
                         "heads / kv": f"{heads}/{kv_heads}", **errors, "ok": max(errors.values()) <= TOLERANCE})
    return rows


def recurrent() -> object:
    """The fla check of the recurrent mixers, when its module is installed."""
    if importlib.util.find_spec("hybrid_lightning.bench.gpu_recurrent") is None:
        return "hybrid_lightning.bench.gpu_recurrent is not installed: no recurrent check"
    return importlib.import_module("hybrid_lightning.bench.gpu_recurrent").main()


def mfu(device: torch.device, peak_tflops: float | None) -> list[dict]:
    rows = []
    batch = torch.randint(0, MFU_MODEL["vocab_size"], (MFU_BATCH, MFU_SEQ + 1), device=device)
    for name, arch in (("full", {"pattern": "F"}), ("SWA-512 hybrid", {"pattern": "EEEF", "window": 512})):
        for compiled in (False, True):
            torch.manual_seed(0)
            model = build_model({**MFU_MODEL, **arch}).to(device)
            if compiled:
                model.compile()
            step = PlainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True), None, 1.0)
            t_compile = time.perf_counter()
            for _ in range(MFU_WARMUP):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    step(batch)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(MFU_STEPS):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    step(batch)
            torch.cuda.synchronize()
            secs = (time.perf_counter() - t0) / MFU_STEPS
            tokens = MFU_BATCH * MFU_SEQ
            tflops = model_flops_per_token(model, MFU_SEQ) * tokens / secs / 1e12
            rows.append({
                "model": name, "compile": compiled, "params": count_params(model)["total"],
                "step s": secs, "tokens/s": tokens / secs, "model TFLOP/s": tflops,
                "MFU": tflops / peak_tflops if peak_tflops else "peak unknown: pass --peak-tflops",
                "warm-up s": t0 - t_compile,
            })
            del model, step
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid_lightning.bench.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (default: known for H100/H200/A100/L40S)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m hybrid_lightning.bench.gpu: error: needs a CUDA GPU, and torch sees none "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda})", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    t0 = time.perf_counter()
    checks = correctness(device)
    result = {
        "device": name, "torch": torch.__version__, "flash_attn": HAS_FLASH_ATTN, "peak_bf16_tflops": peak,
        "correctness": checks, "recurrent": recurrent(), "mfu": mfu(device, peak),
    }
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(result, indent=1, default=str))
    tables = [
        markdown({"title": f"Attention backends vs the fp32 reference in bf16 ({name})",
                  "columns": list(checks[0]), "rows": checks,
                  "notes": f"Relative RMS error of the output and of each gradient; ok when all <= {TOLERANCE}."}),
        markdown({"title": f"Training MFU, {MFU_BATCH} x {MFU_SEQ} tokens, bf16 autocast ({name})",
                  "columns": list(result["mfu"][0]), "rows": result["mfu"],
                  "notes": f"Mean step time over {MFU_STEPS} steps after {MFU_WARMUP} warm-up steps; "
                           f"peak {peak} TFLOP/s; FLOPs per token as in model_flops_per_token."}),
        f"## Recurrent mixers (fla)\n\n```\n{json.dumps(result['recurrent'], indent=1, default=str)}\n```\n",
    ]
    (args.out / "gpu.md").write_text("# GPU check\n\n" + "\n".join(tables) + f"\n_{result['seconds']} s_\n")
    print("\n".join(tables))
    return 0 if all(row["ok"] for row in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
