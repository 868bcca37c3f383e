"""The benchmark suite: ``python -m hybrid_lightning.bench [SECTION ...] [--quick] [--out DIR]``.

Each section is a module ``hybrid_lightning.bench.<name>`` with
``run(quick: bool) -> dict`` returning ``{"title": str, "columns": [str], "rows": [dict], "notes": str}``.
Every figure a section reports is a ratio or a measurement taken side by side in the same
process, so the machine's noise affects both sides alike. The runner writes one JSON file per
section and a markdown table of all of them.
"""

from __future__ import annotations

# section name -> what it measures; each is a module of this package with a run(quick) function
SECTIONS: dict[str, str] = {
    "attention": "(a) sliding-window vs full causal attention: time and peak memory, forward + backward",
    "recurrent": "(b) chunked recurrent operators vs step-by-step and vs fla's pure-torch chunked reference",
    "training": "(c) training tokens/s of the seven architectures; per-mixer CPU steps on one thread, fp32 and bf16; "
                "Lightning vs a plain PyTorch loop",
    "work": "(c) continued: CPU time per FLOP of each recurrent hybrid against full attention's at the CPU replica's "
            "shape",
    "eval": "(d) cost of one call of each evaluation callback (long-context, retrieval heads) at its defaults, in "
            "training steps",
    "data": "(e) data prepare: throughput vs the tokenizer's batch speed, 1 -> 2 workers, peak memory, time to the "
            "first batch",
    "memory": "(f) peak memory of a training step with and without activation checkpointing, measured and estimated",
}
