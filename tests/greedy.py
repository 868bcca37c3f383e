"""Generation-scored exact match, for the tests of the export: greedy decoding through the model's
incremental states, the decoded text compared with the answer. This is how clients that only generate
(lm-evaluation-harness's ``generate_until`` tasks, RULER's scripts) score a probe; the teacher-forced
exact match of ``eval/scoring.py`` equals it whenever the answer's tokens are what the tokenizer makes
of the answer text.

Probes come as ``hybrid-lightning probes`` writes them (``{"text", "task", "length", "depth",
"answer"}`` lines, ``text`` ending with ``answer``); the prompt is ``text`` without the answer.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from hybrid_lightning.eval.scoring import evaluating


@torch.no_grad()
def greedy_generate(model, prompt: torch.Tensor, max_new_tokens: int, stop_id: int | None = None,
                    chunk: int = 2048) -> torch.Tensor:
    """Greedy continuation of ``prompt`` (B, T) by a ``HybridLM``: the prompt goes in pieces of ``chunk``
    tokens, then one token per step, all through ``model.new_states()`` (time linear in the generated
    length). Returns (B, n) ids, n <= ``max_new_tokens``: a sequence that emitted ``stop_id`` repeats it
    until every sequence has, then generation stops (as ``transformers``' ``generate`` pads finished rows)."""
    states = model.new_states()
    for s in range(0, prompt.shape[1], chunk):
        logits = model(prompt[:, s : s + chunk], states)  # (B, t, V)
    out: list[torch.Tensor] = []
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    while len(out) < max_new_tokens and not done.all():
        token = logits[:, -1].argmax(dim=-1)  # (B,)
        if stop_id is not None:
            token = token.masked_fill(done, stop_id)
            done |= token == stop_id
        out.append(token)
        if len(out) < max_new_tokens:
            logits = model(token[:, None], states)
    return torch.stack(out, dim=1) if out else prompt.new_zeros(prompt.shape[0], 0)


def score_probes(model, tokenizer, probes: list[dict], chunk: int = 2048) -> list[dict]:
    """Greedy-generation exact match of every probe: as many tokens as the answer takes, stopped at the
    end-of-document token, decoded and compared with the answer. Returns one record per probe:
    ``task``, ``length``, ``depth``, ``generated`` (text) and ``exact`` (0 or 1)."""
    device = next(model.parameters()).device
    records = []
    with evaluating(model):
        for p in probes:
            prompt = torch.from_numpy(tokenizer.encode(p["prompt"])).to(device)[None]  # (1, T)
            ids = greedy_generate(model, prompt, len(tokenizer.encode(p["answer"])), tokenizer.eos_id, chunk)
            text = tokenizer.decode(ids[0].tolist())
            records.append({"task": p["task"], "length": p["length"], "depth": p["depth"], "generated": text,
                            "exact": int(text == p["answer"])})
    return records


def exact_match_by_task(records: list[dict]) -> dict[str, float]:
    """Mean exact match per task and over all records (key ``all``)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for r in records:
        groups[r["task"]].append(r["exact"])
        groups["all"].append(r["exact"])
    return {task: sum(v) / len(v) for task, v in groups.items()}
