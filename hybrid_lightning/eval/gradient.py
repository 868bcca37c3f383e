"""Gradient influence by token distance (Qiao et al. 2026, arXiv 2606.15378, Finding 2; the authors'
``src/gradient/run_gradient_influence.py`` in thunlp/rethinking-hybrid-attention, whose definitions this follows).

Per text, truncated to its first ``context`` tokens: the target is the sum over the vocabulary of the logits
averaged over the last ``last`` positions (20; all positions of a shorter text); its gradient with respect to the
input embeddings (the embedding layer's output, a leaf) gives one L2 norm per position; the norms are summed by
distance to the last token (0 = the last token) over the texts that reach it, and averaged there. fp32, no
autocast (the authors' script forces fp32 on CPU). Given the same token ids, the script on an export of the same
checkpoint gives these numbers (run side by side on an SWA and a Lightning hybrid: bit-identical curves,
docs/evaluation.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hybrid_lightning.eval.scoring import evaluating
from hybrid_lightning.records import row

TARGET_LAST = 20  # positions whose logits are averaged (the paper's N_tau)
TEXT_KEYS = ("input", "prompt", "text", "context")  # the fields a JSON-lines row's text is read from, in order


@dataclass(frozen=True)
class Curve:
    """Gradient influence against distance: (context,) arrays indexed by distance (0 = the last token)."""

    mean: np.ndarray  # float64, NaN where no text reaches the distance
    sums: np.ndarray  # float64
    counts: np.ndarray  # int64


def read_texts(path: str | Path, max_samples: int) -> list[str]:
    """The first ``max_samples`` texts of a ``.jsonl`` file (each row's first non-empty ``TEXT_KEYS`` field) or a
    ``.txt`` file (its non-empty lines, stripped), as the authors' script reads them."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".txt") or not path.is_file():
        raise ValueError(f"--texts {path}: give a .jsonl or .txt file")
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and path.suffix == ".txt":
            texts.append(line)
        elif line:
            found = json.loads(line)
            texts += [found[k] for k in TEXT_KEYS if isinstance(found.get(k), str) and found[k].strip()][:1]
        if len(texts) >= max_samples:
            break
    return texts


def embedding_gradient(model, ids: torch.Tensor, last: int = TARGET_LAST) -> torch.Tensor:
    """ids (T,) -> (T,) float32: the L2 norm at each position of d(target)/d(input embedding), the target the sum
    of the logits averaged over the last ``last`` positions. The embedding layer's output is replaced by a leaf
    (a forward hook), so the model itself is unchanged."""
    leaf = model.embed(ids[None]).detach().requires_grad_(True)  # (1, T, D)
    hook = model.embed.register_forward_hook(lambda module, args, out: leaf)
    try:
        with torch.enable_grad():
            logits = model(ids[None])  # (1, T, V)
            target = logits[:, -min(last, ids.shape[0]) :].mean(dim=1).sum()
            (grad,) = torch.autograd.grad(target, leaf)
    finally:
        hook.remove()
    return torch.linalg.vector_norm(grad[0].float(), ord=2, dim=-1)


def influence_curve(model, texts: list[np.ndarray], context: int, last: int = TARGET_LAST) -> Curve:
    """The curve over ``texts`` (token ids each, truncated to ``context``; texts under 2 tokens skipped)."""
    device = next(model.parameters()).device
    sums, counts = np.zeros(context, np.float64), np.zeros(context, np.int64)
    with evaluating(model):
        for ids in texts:
            ids = np.asarray(ids[:context], dtype=np.int64)
            if len(ids) < 2:
                continue
            norms = embedding_gradient(model, torch.from_numpy(ids).to(device), last).cpu().numpy()  # (T,)
            sums[: len(ids)] += norms[::-1]  # distance d is position T-1-d
            counts[: len(ids)] += 1
    mean = np.full(context, np.nan)
    np.divide(sums, counts, out=mean, where=counts > 0)
    return Curve(mean, sums, counts)


def curve_rows(curve: Curve, part: str | None, tokens: int | None, step: int, seen: int) -> list[dict]:
    """The ``gradient`` rows of a curve made under a restriction (None: unrestricted)."""
    return [row("gradient", layers=part, receptive_field=tokens, step=step, tokens=seen, distance=d,
                mean_grad_norm=None if np.isnan(m) else float(m), sum_grad_norm=float(s), sample_count=int(n))
            for d, (m, s, n) in enumerate(zip(curve.mean, curve.sums, curve.counts))]


def binned(curve: Curve, edges: list[int]) -> list[tuple[int, int, float | None]]:
    """(lo, hi, mean of the curve's means over distances lo <= d < hi) per pair of consecutive ``edges``."""
    out = []
    for lo, hi in zip(edges, edges[1:]):
        part = curve.mean[lo:hi]
        part = part[~np.isnan(part)]
        out.append((lo, hi, float(part.mean()) if len(part) else None))
    return out


def held_out_texts(tokens: np.ndarray, samples: int, context: int) -> list[np.ndarray]:
    """``samples`` windows of ``context`` tokens of the held-out stream, evenly spaced (as the evaluation's
    per-position sequences are chosen)."""
    starts = np.linspace(0, max(0, len(tokens) - context), samples).astype(np.int64)
    return [np.asarray(tokens[s : s + context], dtype=np.int64) for s in starts]


def gradient_checkpoint(run_dir: str | Path, limits: list[tuple[str, int]] = (), ckpt: str | Path | None = None,
                        texts: str | Path | None = None, samples: int = 16, context: int | None = None,
                        last: int = TARGET_LAST) -> tuple[dict, dict]:
    """Gradient influence of a checkpoint of ``run_dir`` (``eval.offline.load_checkpoint``), unrestricted and
    under each of ``limits`` ((layers, R) pairs), over the first ``samples`` texts of the file ``texts`` (read as
    the authors' script reads it, encoded by the run's tokenizer) or, without one, ``samples`` held-out windows;
    ``context`` tokens each (default: the run's ``train.seq_len``). Writes ``eval/gradient_step_<k>.json``; returns
    it and the curves by restriction."""
    from hybrid_lightning.eval.offline import load_checkpoint
    from hybrid_lightning.model.restrict import applicable, receptive_field
    from hybrid_lightning.rundir.evals import write_eval_record

    run = load_checkpoint(run_dir, ckpt)
    context = context or run.cfg.train.seq_len
    if texts is None:
        ids, source = held_out_texts(run.data.val_tokens, samples, context), "held-out"
    else:
        ids, source = [run.data.tokenizer.encode(t) for t in read_texts(texts, samples)], str(texts)
    curves, rows = {}, []
    for part, tokens in [(None, None), *applicable(run.model, limits)]:
        with receptive_field(run.model, part, tokens):
            curves[part, tokens] = influence_curve(run.model, ids, context, last)
        rows += curve_rows(curves[part, tokens], part, tokens, run.step, run.tokens)
    record = {"step": run.step, "tokens": run.tokens, "context": context, "target_last": last, "texts": source,
              "samples": len(ids), "gradient": rows}
    write_eval_record(Path(run_dir), "gradient", record, {"gradient": ("layers", "receptive_field", "distance")})
    return record, curves


def gradient_table(record: dict, curves: dict) -> str:
    """Mean gradient norm by distance, in bins doubling in width, one column per restriction."""
    context = record["context"]
    edges = [0] + [2**i for i in range(int(np.log2(context)) + 1)]
    edges = sorted(set(edges + [context]))
    names = [f"{part or 'none'}:{tokens}" if part else "none" for part, tokens in curves]
    lines = [f"step {record['step']}  {record['samples']} texts of up to {context} tokens ({record['texts']})",
             f"{'distance':>16}" + "".join(f"{n:>16}" for n in names)]
    columns = [binned(c, edges) for c in curves.values()]
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        cells = ["-" if col[i][2] is None else f"{col[i][2]:.4g}" for col in columns]
        lines.append(f"{f'{lo}-{hi - 1}':>16}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)
