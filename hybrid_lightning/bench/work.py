"""Section (c), continued: CPU time per unit of work at the CPU replica's shape.

One CPU thread, fp32, the model and sequence of ``ablations/cpu_replica.yaml`` (d=64, 4 layers, 4 heads,
batch 8 x 512): the CPU time of a training step (forward, loss, backward, clipping, AdamW) of full attention
and of each recurrent hybrid (3 : 1, parameter-matched), interleaved in one process, divided by the run
plan's training FLOPs of that step (``plan/count.py``). Each recurrent hybrid runs twice: with its operator in
plain torch (``model.recurrent_backend: chunked``, the CPU default) and under ``torch.compile`` (``compiled``,
its compilation in the warm-up step). The recurrent hybrids are asked to do their work at most ``TARGET``
times slower per FLOP than full attention.
"""

from __future__ import annotations

from hybrid_lightning.bench.measure import interleaved_medians, one_thread
from hybrid_lightning.bench.training import CPU_BATCH, architectures, random_batch, seeded_step
from hybrid_lightning.plan.count import count

SIZE, SEQ_LEN = {"n_layers": 4, "d_model": 64, "n_heads": 4}, 512  # ablations/cpu_replica.yaml's model and sequence
TARGET = 1.3  # a recurrent hybrid's CPU time per FLOP at most 1.3x full attention's


def run(quick: bool) -> dict:
    T, reps = (32, 1) if quick else (SEQ_LEN, 9)
    batch = random_batch(CPU_BATCH, T)
    steps, flops = {}, {}
    with one_thread():
        for name, arch in architectures(()).items():  # no SWA windows: full attention and the recurrent hybrids
            for backend in ("chunked",) if name == "full" else ("chunked", "compiled"):
                step = seeded_step({**SIZE, **arch, "recurrent_backend": backend})
                key = (name, backend)
                flops[key] = count(step.model.opts, step.model.plan, (T,)).flops[T] * CPU_BATCH * T
                steps[key] = (lambda s: lambda: s(batch))(step)
                steps[key]()  # warm-up (and compilation)
        secs = interleaved_medians(steps, reps)
    full = ("full", "chunked")
    per_flop = {key: secs[key].cpu / flops[key] / (secs[full].cpu / flops[full]) for key in steps}
    size = f"d={SIZE['d_model']}, {SIZE['n_heads']} heads, batch {CPU_BATCH} x {T}"
    rows = [{"architecture": key[0], "setting": size if key == full else f"{size}, operator {key[1]}",
             "CPU ms/step": 1e3 * secs[key].cpu, "GFLOP/step": flops[key] / 1e9,
             "step / full's": secs[key].cpu / secs[full].cpu, "work / full's": flops[key] / flops[full],
             "time per FLOP / full's": per_flop[key]} for key in steps]
    ranges = {backend: [per_flop[key] for key in steps if key != full and key[1] == backend]
              for backend in ("chunked", "compiled")}
    notes = (f"One thread, fp32, CPU time per training step, medians of {reps} interleaved steps after a warm-up; "
             "FLOPs are the run plan's. The recurrent hybrids take " + ", ".join(
                 f"{min(r):.2f}-{max(r):.2f}x full attention's CPU time per FLOP with the operator {backend}"
                 for backend, r in ranges.items()) + f" (target <= {TARGET}).")
    return {"title": "(c) Training: CPU time per FLOP at the CPU replica's shape",
            "columns": ["architecture", "setting", "CPU ms/step", "GFLOP/step", "step / full's", "work / full's",
                        "time per FLOP / full's"],
            "rows": rows, "notes": notes}
