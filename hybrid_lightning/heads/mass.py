"""Retrieval heads by attention mass, and the measures that trace them over training, as the paper's authors define
them (*Rethinking the Role of Efficient Attention in Hybrid Architectures*, arXiv 2606.15378; their code,
github thunlp/rethinking-hybrid-attention, ``src/tracing/find_retrieval_heads.py``,
``compute_attention_metrics.py``, ``compute_weight_distance.py``).

- **Attention mass** (``mass_scores``): on needle-in-a-haystack prompts (rows with ``input`` and ``outputs``, the
  prompt cut to its first ``max_tokens`` tokens), the query is the token at position len - 2; a head's score is
  the attention probability that query puts on the needle's tokens (every occurrence in the prompt of the token
  ids of each answer, also written ``" X"``, ``"X."``, ``" X."``, ``": X"``, ``": X."``), averaged over the
  samples where the needle is found. The target heads are the top K (4) over all layers (``target_heads``).
- **Entropy** (``entropies``): at each of the last 4 query positions p, the head's probabilities over keys 0..p
  (renormalised, floored at eps = 1e-12, as theirs), their entropy, and that divided by log(p + 1) (the keys a
  full-attention query sees, also for a window); means over queries and samples.
- **Q/K distance** (``qk_distances``): the L2 (Frobenius) norm of the difference between two checkpoints of the
  head's rows of the query projection and of its KV group's rows of the key projection, and each divided by the
  reference's norm (+ eps); ``qk_*`` sum the q and k terms.

Unlike Wu et al.'s copy score (heads/retrieval.py), which asks at every teacher-forced answer step whether a head's
top-1 key is the needle token being produced, the mass score looks at one query before the answer and counts
probability, not argmax: a head that spreads its attention over the needle scores its whole share, and no answer
token is needed. Only attention layers (full and sliding-window) are scored; the others are NaN.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hybrid_lightning.model.observe import attention_layers, observe

NEEDLE_FORMS = ("{}", " {}", "{}.", " {}.", ": {}", ": {}.")  # how an answer may stand in the prompt
QUERY_FROM_END = 2  # the query is the token at position len - 2
TARGET_HEADS = 4
MAX_SAMPLES = 200
MAX_TOKENS = 8192
TAIL_QUERIES = 4  # entropy at the last 4 query positions
EPS = 1e-12


@dataclass(frozen=True)
class NiahSample:
    ids: np.ndarray  # (T,) prompt tokens, at most max_tokens
    needle: np.ndarray  # sorted positions of the needle's tokens in ids (empty: not found)


def read_niah(path: str | Path, tok, max_samples: int = MAX_SAMPLES, max_tokens: int = MAX_TOKENS) -> list[NiahSample]:
    """The first ``max_samples`` rows of a JSON-lines file of ``{"input": prompt, "outputs": [answer, ...]}``
    (RULER's and the authors' format; ``outputs`` may be one string), tokenized with ``tok`` (a package tokenizer)
    and cut to ``max_tokens``; a ``ValueError`` naming the file and line for a row without them."""
    if not Path(path).is_file():
        raise ValueError(f"--niah: file not found: {path}")
    samples = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if len(samples) >= max_samples:
            break
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("input"), str) or "outputs" not in row:
            raise ValueError(f"{path}:{n}: a NIAH row needs 'input' (the prompt) and 'outputs' (its answers)")
        ids = np.asarray(tok.encode(row["input"]), dtype=np.int64)[:max_tokens]
        samples.append(NiahSample(ids, needle_positions(ids, answers(row["outputs"]), tok)))
    return samples


def answers(outputs) -> list[str]:
    """The answers of a row's ``outputs`` (a list, or one string, stripped), blank ones left out, first
    occurrences kept."""
    items = [str(x) for x in outputs if str(x).strip()] if isinstance(outputs, list) else [str(outputs).strip()]
    return list(dict.fromkeys(x for x in items if x.strip()))


def needle_positions(ids: np.ndarray, needles: list[str], tok) -> np.ndarray:
    """Sorted positions in ``ids`` (T,) covered by an occurrence of the tokens of any needle in any of its
    ``NEEDLE_FORMS``."""
    found = set()
    for needle in needles:
        for form in NEEDLE_FORMS:
            pattern = np.asarray(tok.encode(form.format(needle)), dtype=np.int64)
            if not 0 < len(pattern) <= len(ids):
                continue
            windows = np.lib.stride_tricks.sliding_window_view(ids, len(pattern))  # (T - n + 1, n)
            for start in np.flatnonzero((windows == pattern).all(axis=1)):
                found.update(range(start, start + len(pattern)))
    return np.asarray(sorted(found), dtype=np.int64)


@torch.no_grad()
def mass_scores(model, samples: list[NiahSample]) -> tuple[np.ndarray, int]:
    """((n_layers, H) mean attention mass of the query at len - 2 on the needle, NaN for layers without
    attention; the number of samples whose needle was found, which the mean is over)."""
    scored = dict(attention_layers(model))
    n_heads = max((m.n_heads for m in scored.values()), default=0)
    sums = np.zeros((len(model.layers), n_heads))
    used = 0
    device = next(model.parameters()).device
    for s in samples:
        if not len(s.needle):
            continue
        query = min(max(0, len(s.ids) - QUERY_FROM_END), len(s.ids) - 1)
        ids = torch.as_tensor(s.ids[: query + 1], device=device)[None]  # the query last: a causal prefix
        maps = observe(model, ids, rows=1).attentions  # per layer (1, H, 1, query + 1)
        keys = torch.as_tensor(s.needle[s.needle <= query], device=device)
        for i in scored:
            sums[i] += maps[i][0, :, 0, keys].sum(-1).double().cpu().numpy()
        used += 1
    if not used:
        raise ValueError("no NIAH sample's needle was found in its prompt (with this tokenizer); check 'outputs'")
    sums /= used
    sums[[i for i in range(len(model.layers)) if i not in scored]] = np.nan
    return sums, used


def target_heads(scores: np.ndarray, k: int = TARGET_HEADS) -> list[tuple[int, int]]:
    """The ``k`` (layer, head) pairs of highest score over all layers, ties in (layer, head) order."""
    flat = [(float(s), layer, head) for (layer, head), s in np.ndenumerate(scores) if not np.isnan(s)]
    return [(layer, head) for _, layer, head in sorted(flat, key=lambda t: -t[0])[:k]]


@torch.no_grad()
def entropies(model, samples: list[NiahSample], heads: list[tuple[int, int]],
              tail: int = TAIL_QUERIES) -> dict[tuple[int, int], tuple[float, float]]:
    """(layer, head) -> (entropy, entropy / log(keys seen)) of its attention at the last ``tail`` queries, means
    over queries and samples (every sample, needle found or not)."""
    device = next(model.parameters()).device
    values = {h: [] for h in heads}
    for s in samples:
        T = len(s.ids)
        rows = min(tail, T)
        maps = observe(model, torch.as_tensor(s.ids, device=device)[None], rows=rows).attentions
        for layer, head in heads:
            for r in range(rows):
                p = T - rows + r  # the query's position: it sees keys 0..p
                probs = maps[layer][0, head, r, : p + 1].float()
                probs = (probs / (probs.sum() + EPS)).clamp(min=EPS)
                entropy = -(probs * probs.log()).sum().item()
                values[(layer, head)].append((entropy, entropy / float(np.log(p + 1))))
    return {h: tuple(float(x) for x in np.mean(v, axis=0)) for h, v in values.items()}


def head_rows(model, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of layer ``layer``'s query projection that make head ``head``'s queries (Dh, D), and those of its
    key projection that make its KV group's keys (Dh, D)."""
    mixer = model.layers[layer].mixer
    kv = head // (mixer.n_heads // mixer.n_kv)
    Dh = mixer.head_dim
    return mixer.wq.weight[head * Dh:(head + 1) * Dh].float(), mixer.wk.weight[kv * Dh:(kv + 1) * Dh].float()


@torch.no_grad()
def qk_distances(model, reference, heads: list[tuple[int, int]]) -> dict[tuple[int, int], dict[str, float]]:
    """(layer, head) -> ``q_l2``, ``k_l2`` (norms of the differences to ``reference``, a model of the same plan),
    ``q_rel_l2``, ``k_rel_l2`` (each over the reference's norm + eps), ``qk_l2`` and ``qk_rel_l2`` (their sums)."""
    out = {}
    for layer, head in heads:
        d = {}
        for name, now, ref in zip("qk", head_rows(model, layer, head), head_rows(reference, layer, head), strict=True):
            d[f"{name}_l2"] = torch.linalg.norm(now - ref).item()
            d[f"{name}_rel_l2"] = d[f"{name}_l2"] / (torch.linalg.norm(ref).item() + EPS)
        out[(layer, head)] = d | {"qk_l2": d["q_l2"] + d["k_l2"], "qk_rel_l2": d["q_rel_l2"] + d["k_rel_l2"]}
    return out
