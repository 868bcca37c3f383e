"""``hybrid-lightning trace RUN_DIR --niah FILE``: the paper's tracing of retrieval heads over training, after the
run (heads/mass.py has the measures and their sources); ``live_trace`` is the same during training (``eval.trace:``,
training/evaluation.py), each step's own top heads against the initialisation. After the run the target heads are
chosen once, on the run's final (newest valid) checkpoint, by attention mass; then every kept checkpoint of
``checkpoints/`` (``step_<N>.ckpt``, ``last.ckpt``), oldest first, gets the attention mass of every head and, for
the target heads, the entropy of their last queries and the distance of their Q/K rows to a reference checkpoint
(default: the oldest kept one).

Writes ``tracing/step_<k>.json`` per checkpoint (``records.TRACING``: ``mass`` rows for every attention head,
``trace`` rows for the target heads) and TensorBoard scalars in ``tracing/`` under ``records.TRACING_TAGS``
(``tracing/entropy_norm/L<l>.H<h>``, ``tracing/qk_rel_l2/...``, ``tracing/mass/...`` and their means over the
target heads), at each checkpoint's step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hybrid_lightning import records
from hybrid_lightning.config import EvalConfig
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.fileio import write_atomic
from hybrid_lightning.heads.mass import (
    MAX_SAMPLES,
    MAX_TOKENS,
    TARGET_HEADS,
    NiahSample,
    entropies,
    mass_scores,
    needle_positions,
    qk_distances,
    read_niah,
    target_heads,
)
from hybrid_lightning.probes.files import spread_depths
from hybrid_lightning.probes.tasks import GenContext, make_sample
from hybrid_lightning.rundir import CKPT_DIR, CKPT_SUFFIX, TRACING_DIR, tracing_path
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid, given_checkpoint, read_checkpoint_meta
from hybrid_lightning.rundir.evals import traced_heads

TB_MEASURES = ("mass", "entropy", "entropy_norm", "qk_l2", "qk_rel_l2")  # the scalars logged per target head


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """The run's valid checkpoints, one per stored step (``last.ckpt`` where it ties), oldest first; a
    ``ValueError`` when there is none."""
    folder = Path(run_dir) / CKPT_DIR
    files = sorted(folder.glob(f"*{CKPT_SUFFIX}")) if folder.is_dir() else []
    by_step = {}
    for path in sorted(files, key=lambda p: p.name == "last.ckpt"):
        if not path.name.startswith(".") and checkpoint_is_valid(path):
            by_step[read_checkpoint_meta(path)["step"]] = path
    if not by_step:
        raise ValueError(f"{run_dir}: no valid checkpoint in {CKPT_DIR}/ to trace")
    return [by_step[s] for s in sorted(by_step)]


def trace_run(run_dir: str | Path, niah: str | Path, k: int = TARGET_HEADS, max_samples: int = MAX_SAMPLES,
              max_tokens: int = MAX_TOKENS, reference: str | Path | None = None,
              heads: list[tuple[int, int]] = ()) -> list[dict]:
    """Traces the final checkpoint's top ``k`` heads (or the given ``heads``, (layer, head) pairs) back over the
    kept checkpoints of ``run_dir`` on the NIAH rows of ``niah`` (``read_niah``); Q/K distances to ``reference``
    (a checkpoint file; default the oldest kept). Writes the records and scalars; returns the records, oldest
    first."""
    from hybrid_lightning.plan import load_trained
    from hybrid_lightning.plan.resolve import read_run

    run_dir = Path(run_dir)
    cfg, plan = read_run(run_dir)
    samples = read_niah(niah, load_tokenizer(cfg.data.tokenizer), max_samples, max_tokens)
    kept = kept_checkpoints(run_dir)
    ref_path = given_checkpoint(reference) if reference is not None else kept[0]

    def load(path: Path) -> tuple:  # (model, step, tokens)
        model, state = load_trained(plan, path)
        return model.eval(), int(state["global_step"]) - plan.step_offset, int(state["tokens_seen"])

    final = load(kept[-1])
    scores, _ = mass_scores(final[0], samples)
    chosen = list(heads) or target_heads(scores, k)
    check_heads(final[0], chosen)
    ref = final if ref_path == kept[-1] else load(ref_path)
    out = []
    for path in kept:  # the final and reference models kept, each other checkpoint loaded in turn
        model, step, tokens = final if path == kept[-1] else ref if path == ref_path else load(path)
        record = trace_checkpoint(model, ref[0], samples, chosen, step=step, tokens=tokens, final_step=final[1],
                                  reference_step=ref[1]) | {"checkpoint": path.name}
        tracing_path(run_dir, step).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(tracing_path(run_dir, step), json.dumps(record, indent=1))
        out.append(record)
    log_scalars(run_dir / TRACING_DIR, out)
    return out


def check_heads(model, heads: list[tuple[int, int]]) -> None:
    """A ``ValueError`` naming a (layer, head) that is not an attention head of ``model``."""
    from hybrid_lightning.model.observe import attention_layers

    layers = dict(attention_layers(model))
    for layer, head in heads:
        if layer not in layers or not 0 <= head < layers[layer].n_heads:
            raise ValueError(f"--heads {layer}.{head}: not an attention head (attention layers: {sorted(layers)})")


def trace_checkpoint(model, reference, samples, heads: list[tuple[int, int]], scored: tuple | None = None,
                     **where: int) -> dict:
    """One checkpoint's record: ``mass`` rows of every attention head, ``trace`` rows of ``heads`` (Q/K distances
    to the model ``reference``), and the samples used; ``scored``: ``mass_scores`` of ``model`` where computed
    already; ``where``: its ``step``, ``tokens``, ``final_step`` and ``reference_step``."""
    from hybrid_lightning.model.observe import attention_layers

    scores, used = scored or mass_scores(model, samples)
    spec = {i: model.plan[i] for i, _ in attention_layers(model)}
    step, tokens = where["step"], where["tokens"]
    mass = [records.row("mass", step=step, tokens=tokens, layer=i, head=h, mixer=spec[i].mixer,
                        window=model.layers[i].mixer.head_window(h),
                        mass=float(scores[i, h]), target=(i, h) in heads)
            for i in spec for h in range(model.layers[i].mixer.n_heads)]
    ent, dist = entropies(model, samples, heads), qk_distances(model, reference, heads)
    trace = [records.row("trace", **where, layer=i, head=h, entropy=ent[(i, h)][0], entropy_norm=ent[(i, h)][1],
                         **dist[(i, h)]) for i, h in heads]
    return where | {"samples": len(samples), "samples_used": used, "mass": mass, "trace": trace}


def log_scalars(folder: Path, traced: list[dict]) -> None:
    """TensorBoard scalars of the traced records in ``folder`` (its earlier event files replaced)."""
    from torch.utils.tensorboard import SummaryWriter

    for old in folder.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(str(folder))
    for record in traced:
        for tag, value in trace_scalars(record, records.TRACING_TAGS).items():
            writer.add_scalar(tag, value, record["step"])
    writer.close()


def trace_scalars(record: dict, prefix: str) -> dict[str, float]:
    """A traced record's scalars: ``<prefix>/<measure>/L<l>.H<h>`` per target head and ``<prefix>/<measure>``, their
    mean, for each of ``TB_MEASURES``."""
    rows = traced_heads(record)
    out = {}
    for measure in TB_MEASURES:
        out |= {f"{prefix}/{measure}/L{r['layer']}.H{r['head']}": r[measure] for r in rows}
        if rows:
            out[f"{prefix}/{measure}"] = float(np.mean([r[measure] for r in rows]))
    return out


def trace_samples(cfg: EvalConfig, tokenizer, held_out: np.ndarray) -> list[NiahSample]:
    """The ``eval.trace`` probes as NIAH samples: ``samples`` prompts of ``task`` at ``length`` tokens (prompt and
    answer), needle depths spread evenly over [0, 1], seeded by ``eval.seed`` (the generators of ``eval``: the
    same prompt for the same task, length, depth and index); the needle is every occurrence of the answer in the
    prompt (``needle_positions``)."""
    t = cfg.trace
    ctx = GenContext(tokenizer, held_out, None, cfg.vt_example)
    out = []
    for i, depth in enumerate(spread_depths(t.samples)):
        s = make_sample(t.task, ctx, t.length, float(depth), i, cfg.seed)
        out.append(NiahSample(s.prompt, needle_positions(s.prompt, [tokenizer.decode(s.answer.tolist())], tokenizer)))
    return out


def initialisation(plan, seed: int):
    """The model as training initialises it (built right after seeding with ``seed``: trainer.build_trainer), in
    eval mode, built without touching the global random state."""
    from hybrid_lightning.plan.build import build_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(plan).eval()


def live_trace(model, initial, samples: list[NiahSample], top: int, *, step: int, tokens: int) -> dict:
    """The record of one step traced during training: ``trace_checkpoint`` of ``model`` with its own ``top`` heads
    by attention mass as the target heads (``final_step`` is the step itself) and the Q/K distances to ``initial``,
    the model at initialisation (``reference_step`` 0)."""
    scored = mass_scores(model, samples)
    heads = target_heads(scored[0], top)
    return trace_checkpoint(model, initial, samples, heads, scored, step=step, tokens=tokens, final_step=step,
                            reference_step=0)


def trace_table(traced: list[dict]) -> str:
    """The console's table: per checkpoint and target head, mass, normalised entropy and relative Q/K distance."""
    lines = [f"{'step':>8} {'head':>7} {'mass':>8} {'entropy':>8} {'ent/log':>8} {'qk_rel_l2':>10}"]
    for record in traced:
        for r in traced_heads(record):
            name = f"L{r['layer']}.H{r['head']}"
            lines.append(f"{record['step']:>8} {name:>7} "
                         f"{r['mass']:>8.4f} {r['entropy']:>8.4f} {r['entropy_norm']:>8.4f} "
                         f"{r['qk_rel_l2']:>10.4f}")
    return "\n".join(lines)
