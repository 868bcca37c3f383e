"""Whether the probes a run's ``eval:`` section asks for can be built, checked once before anything trains:
the run plan records what this returns, and the offline commands check the settings their overrides make.
Needs the tokenizer only (the haystack is noise text here), no held-out data and no model."""

from __future__ import annotations

import itertools
import re

import numpy as np

from hybrid_lightning.config import EvalConfig
from hybrid_lightning.probes.haystack import NOISE
from hybrid_lightning.probes.near import make_probe
from hybrid_lightning.probes.tasks import GenContext, Sample, check_tasks, make_sample


def check_lengths(cfg: EvalConfig, tokenizer) -> None:
    """Raises ``ValueError`` (naming eval.lengths or eval.value_tokens) when a probe cannot be built,
    e.g. a length too short for a task's fixed text, or a task that does not exist."""
    check_tasks(cfg.tasks)
    ctx = GenContext(tokenizer, tokenizer.encode(NOISE * 8), cfg.value_tokens, cfg.vt_example)
    for task, length in itertools.product(cfg.tasks, cfg.lengths):
        make_sample(task, ctx, length, 0.5, 0, cfg.seed)


def nearest_source(sample: Sample) -> int:
    """Tokens from the position that predicts an answer token back to the nearest statement of that token
    (the needle's value, or a span repeating the whole answer, as an echo probe's echo): a window of W tokens
    (the current one included) reaches a copy source of that answer step where W - 1 >= this."""
    rows = len(sample.prompt) - 1 + np.arange(len(sample.answer))
    has = sample.answer_source >= 0
    distances = [rows[has] - sample.answer_source[has]]
    distances += [rows - (start + np.arange(len(sample.answer))) for start, end in sample.needle_spans
                  if end - start == len(sample.answer) and (sample.prompt[start:end] == sample.answer).all()]
    return int(min(d.min() for d in distances if len(d)))


def check_heads_probes(cfg: EvalConfig, tokenizer) -> int:
    """``check_lengths`` for the ``eval.heads`` probes and their echo probes; the error names eval.heads.* keys.
    Returns the smallest ``nearest_source`` of those probes (the echo's where there are echo probes)."""
    h = cfg.heads
    try:
        probes = cfg.model_copy(update={"tasks": h.tasks, "lengths": h.lengths, "value_tokens": h.value_tokens})
        check_lengths(probes, tokenizer)
        ctx = GenContext(tokenizer, tokenizer.encode(NOISE * 8), h.value_tokens, cfg.vt_example)
        return min(nearest_source(make_probe((task, length, 0.5, 0, echo), ctx, cfg.seed))
                   for task, length in itertools.product(h.tasks, h.lengths) for echo in {False, h.echo})
    except ValueError as e:
        raise ValueError(re.sub(r"^eval\.", "eval.heads.", str(e))) from None


def check_trace_probes(cfg: EvalConfig, tokenizer) -> None:
    """``check_lengths`` for the ``eval.trace`` probes; the error names eval.trace.* keys."""
    t = cfg.trace
    try:
        check_lengths(cfg.model_copy(update={"tasks": (t.task,), "lengths": (t.length,), "value_tokens": None}),
                      tokenizer)
    except ValueError as e:
        raise ValueError(re.sub(r"^eval\.(tasks|lengths)", lambda m: f"eval.trace.{m.group(1)[:-1]}", str(e))) from None


def check_probes(cfg: EvalConfig, tokenizer, seq_len: int) -> dict:
    """Checks the probes of the three evaluations (long-context, heads, tracing; a ``ValueError`` naming the key),
    whether or not they run: settings taken are settings checked. Returns what the run plan records of each enabled
    one: its tasks, and its lengths within and beyond the training length ``seq_len``; for the heads,
    ``nearest_source`` (``check_heads_probes``: a windowed head of window W can score only where W - 1 reaches it)."""
    checked = {}
    t = cfg.trace
    sections = (("eval", cfg, check_lengths, cfg.tasks, cfg.lengths),
                ("heads", cfg.heads, check_heads_probes, cfg.heads.tasks, cfg.heads.lengths),
                ("trace", t, check_trace_probes, (t.task,), (t.length,)))
    for name, section, check, tasks, lengths in sections:
        nearest = check(cfg, tokenizer)
        if section.every_n_steps or section.at_end:
            checked[name] = {"tasks": list(tasks), "within": [n for n in lengths if n <= seq_len],
                             "beyond": [n for n in lengths if n > seq_len]}
            if nearest is not None:
                checked[name]["nearest_source"] = nearest
    return checked
