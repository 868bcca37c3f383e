"""Whether the probes a run's ``eval:`` section asks for can be built, checked once before anything trains:
the run plan records what this returns, and the offline commands check the settings their overrides make.
Needs the tokenizer only (the haystack is noise text here), no held-out data and no model."""

from __future__ import annotations

import itertools
import re

from hybrid_lightning.config import EvalConfig
from hybrid_lightning.probes.haystack import NOISE
from hybrid_lightning.probes.near import make_probe
from hybrid_lightning.probes.tasks import GenContext, check_tasks, make_sample


def check_lengths(cfg: EvalConfig, tokenizer) -> None:
    """Raises ``ValueError`` (naming eval.lengths or eval.value_tokens) when a probe cannot be built,
    e.g. a length too short for a task's fixed text, or a task that does not exist."""
    check_tasks(cfg.tasks)
    ctx = GenContext(tokenizer, tokenizer.encode(NOISE * 8), cfg.value_tokens, cfg.vt_example)
    for task, length in itertools.product(cfg.tasks, cfg.lengths):
        make_sample(task, ctx, length, 0.5, 0, cfg.seed)


def check_heads_probes(cfg: EvalConfig, tokenizer) -> None:
    """``check_lengths`` for the ``eval.heads`` probes and their echo probes; the error names eval.heads.* keys."""
    h = cfg.heads
    try:
        probes = cfg.model_copy(update={"tasks": h.tasks, "lengths": h.lengths, "value_tokens": h.value_tokens})
        check_lengths(probes, tokenizer)
        if h.echo:
            ctx = GenContext(tokenizer, tokenizer.encode(NOISE * 8), h.value_tokens, cfg.vt_example)
            for task, length in itertools.product(h.tasks, h.lengths):
                make_probe((task, length, 0.5, 0, True), ctx, cfg.seed)
    except ValueError as e:
        raise ValueError(re.sub(r"^eval\.", "eval.heads.", str(e))) from None


def check_probes(cfg: EvalConfig, tokenizer, seq_len: int) -> dict:
    """Checks the probes of each enabled evaluation (long-context, heads; a ``ValueError`` naming the key);
    returns what the run plan records of them: per evaluation its tasks, and its lengths within and beyond
    the training length ``seq_len``."""
    checked = {}
    for name, section, check in (("eval", cfg, check_lengths), ("heads", cfg.heads, check_heads_probes)):
        if section.every_n_steps or section.at_end:
            check(cfg, tokenizer)
            checked[name] = {"tasks": list(section.tasks), "within": [n for n in section.lengths if n <= seq_len],
                             "beyond": [n for n in section.lengths if n > seq_len]}
    return checked
