"""Section (a): sliding-window attention against full causal attention, forward + backward.

For each sequence length T, full causal attention and SWA with each window W run side by side
(round-robin repetitions, medians) through ``attend(backend="auto")``: on CPU SDPA's flash kernel for
full attention and the blocked kernel for windows; on CUDA flash-attn or FlexAttention. One batch of
8 heads of 64 dimensions, fp32 on CPU and bf16 on CUDA. Peak memory is what one forward + backward
allocates beyond its inputs.
"""

from __future__ import annotations

import torch

from hybrid_lightning.bench.measure import interleaved_medians, peak_memory
from hybrid_lightning.model.attention import attend

WINDOWS = (128, 512, 2048)
LENGTHS = (1024, 2048, 4096, 8192, 16384)
HEADS, HEAD_DIM = 8, 64
TARGET = {"window": 512, "length": 16384, "speedup": 6.0, "doubling": 2.2}  # acceptance G1 of issue #8


def fwd_bwd(T: int, window: int | None, device: torch.device, dtype: torch.dtype):
    """A function running attention forward + backward on fixed random (1, 8, T, 64) inputs."""
    g = torch.Generator(device=device).manual_seed(T)
    q, k, v, grad = (torch.randn(1, HEADS, T, HEAD_DIM, generator=g, device=device, dtype=dtype) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    return lambda: torch.autograd.grad(attend(q, k, v, window=window), (q, k, v), grad)


def visible_pairs(T: int, window: int | None) -> int:
    """(query, key) pairs that attention must score: sum over t < T of min(t + 1, W)."""
    W = min(window or T, T)
    return W * (W + 1) // 2 + (T - W) * W


def run(quick: bool) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths, windows, reps = ((256, 512, 1024), (32, 64), 1) if quick else (LENGTHS, WINDOWS, 5)
    kinds = {"full": None, **{f"SWA-{w}": w for w in windows}}
    cases = {(T, name): fwd_bwd(T, w, device, dtype) for T in lengths for name, w in kinds.items()}
    mem = {case: peak_memory(fn, device) for case, fn in cases.items()}  # also the warm-up call
    # One round-robin over every length too, so that the growth with T is measured side by side as well.
    secs = interleaved_medians(cases, reps)
    rows = []
    for T, name in cases:
        w, half, t = kinds[name], (T // 2, name), secs[T, name]
        grown = half in secs
        rows.append({
            "T": T, "attention": name, "wall s": t.wall, "CPU s": t.cpu,
            "full / this": secs[T, "full"].wall / t.wall, "full / this (CPU)": secs[T, "full"].cpu / t.cpu,
            "vs T/2": t.wall / secs[half].wall if grown else "",
            "vs T/2 (CPU)": t.cpu / secs[half].cpu if grown else "",
            "work vs T/2": visible_pairs(T, w) / visible_pairs(T // 2, w) if grown else "",
            "peak MiB": mem[T, name] / 2**20, "memory vs T/2": mem[T, name] / mem[half] if grown and mem[half] else "",
        })
    return {
        "title": "(a) Sliding-window vs full causal attention, forward + backward",
        "columns": list(rows[0]),
        "rows": rows,
        "notes": _notes(rows, device, dtype, reps),
    }


def _notes(rows: list[dict], device: torch.device, dtype: torch.dtype, reps: int) -> str:
    lines = [
        f"B=1, H={HEADS}, Dh={HEAD_DIM}, {str(dtype).removeprefix('torch.')} on {device.type}, backend auto; "
        f"median of {reps} round-robin repetitions over every row. 'CPU s' is this process's CPU time, which other "
        "processes on a shared machine do not inflate (with one torch thread it is the work done). 'full / this' is "
        "the speed-up over full causal attention at the same T; 'vs T/2' is the ratio to the row with half the "
        "length (2 = linear); 'work vs T/2' is that ratio for the number of (query, key) pairs the attention must "
        "score, the growth an ideal kernel would show: above 2 while the first W positions, which see fewer keys, "
        "are a large share of T."
    ]
    swa = [r for r in rows if r["attention"] == f"SWA-{TARGET['window']}"]
    at = [r for r in swa if r["T"] == TARGET["length"]]
    if at:
        grown = [r for r in swa if r["vs T/2"] != ""]
        doublings = ", ".join(
            f"{r['T'] // 2}->{r['T']}: {r['vs T/2']:.2f} ({r['vs T/2 (CPU)']:.2f} CPU, work {r['work vs T/2']:.2f})"
            for r in grown
        )
        memory = ", ".join(f"{r['memory vs T/2']:.2f}" for r in grown)
        lines.append(
            f"G1: SWA-{TARGET['window']} at T={TARGET['length']} is {at[0]['full / this']:.2f}x faster than full "
            f"({at[0]['full / this (CPU)']:.2f}x in CPU time; target >= {TARGET['speedup']}); its time per doubling of "
            f"T: {doublings} (target <= {TARGET['doubling']}); its peak memory per doubling: {memory}."
        )
    return "\n\n".join(lines)
