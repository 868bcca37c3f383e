"""Retrieval-head probes with a copy source near the answer, so that sliding-window heads *can* score.

In a needle-in-a-haystack probe every copy source lies at least the question's length before the
answer (at 512 tokens with 16-token answers, 71 tokens or more back): a head of a window W below that
can never score, and "retrieval heads lie in full-attention layers" would follow from geometry alone.
An *echo* probe is the task's probe with its answer stated once more and asked again after a short
cue::

    <the task's prompt> <answer> \\nAgain: <answer>

The second answer can be copied from the needle (far) or from the echo (``len(answer) + len(cue) - 1``
tokens back: 22 for a 16-token answer and byte tokens, inside a window of 32). The echo is counted
among the needles (Wu et al.'s token test looks there too) and, as every statement of the answer's
value, among its copy sources (``heads.answer_targets``). Which sources a head of window W can reach,
row by row, is recorded with its scores (``reach_steps``, ``reach_score`` in heads/retrieval.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_lightning.probes.tasks import GenContext, Sample, make_sample

ECHO_CUE = "\nAgain:"
MAX_TRIES = 8  # redraws of the inner probe until prompt + echo + cue + answer is exactly the length


def echo_sample(task: str, ctx: GenContext, length: int, depth: float, index: int, seed: int = 0) -> Sample:
    """The echo probe of ``make_sample(task, ...)``, exactly ``length`` tokens long: the task's probe
    drawn at a length that leaves room for the echo and the cue."""
    cue = np.asarray(ctx.tok.encode(ECHO_CUE), np.int64)
    extra = len(cue)
    for _ in range(MAX_TRIES):  # the answer's length may depend on the draw (subword tokenizers)
        inner = make_sample(task, ctx, length - extra, depth, index, seed)
        if len(inner.answer) + len(cue) == extra:
            break
        extra = len(inner.answer) + len(cue)
    else:
        raise ValueError(f"eval.heads.echo: no {task} probe of {length} tokens with its echo")
    echo = (len(inner.prompt), len(inner.prompt) + len(inner.answer))
    sample = dataclasses.replace(inner, length=length, prompt=np.concatenate([inner.prompt, inner.answer, cue]),
                                 needle_spans=inner.needle_spans + (echo,))
    assert len(sample.prompt) + len(sample.answer) == length
    return sample


def make_probe(spec: tuple, ctx: GenContext, seed: int) -> Sample:
    """The probe of a heads spec (task, length, depth, index, echo)."""
    task, length, depth, index, echo = spec
    return (echo_sample if echo else make_sample)(task, ctx, length, depth, index, seed)
