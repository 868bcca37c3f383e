"""Probes as text documents (``hybrid-lightning probes``): a JSON-lines file with one probe and its
answer per line (``export_probes``), e.g. to train a small model on retrieval in the probes' own format,
or to score a model on them elsewhere (``read_probes``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from hybrid_lightning.config import DataConfig
from hybrid_lightning.config.fields import MAX_PROBE_TOKENS
from hybrid_lightning.data.store import load_corpus
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.fileio import refuse_existing, write_atomic
from hybrid_lightning.probes.tasks import GenContext, check_tasks, make_sample

PROBE_KEYS = ("text", "task", "length", "depth", "answer")  # a line of the probes file


def spread_depths(samples: int) -> np.ndarray:
    """The needle depths of ``samples`` probes of one task and length: spread evenly over [0, 1]; one probe at 0.5."""
    return np.linspace(0, 1, samples) if samples > 1 else np.array([0.5])


def export_probes(out: str | Path, tasks: list[str], lengths: list[int], samples: int, seed: int,
                  value_tokens: int | None = None, tokenizer: str = "byte") -> int:
    """Writes ``samples`` probes per (task, length) to ``out`` as ``{"text", "task", "length", "depth",
    "answer"}`` lines, needle depths spread evenly over [0, 1]; returns the number written.

    Probes are a pure function of (task, length, depth, index, ``seed``): a ``seed`` other than the
    ``eval.seed`` of a run keeps its evaluation probes out of what it trains on.
    """
    check_tasks(tasks, field="tasks")
    refuse_existing(Path(out), "--out")
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    if not lengths or not all(2 <= n <= MAX_PROBE_TOKENS for n in lengths):
        raise ValueError(f"--lengths must be 2 to {MAX_PROBE_TOKENS:,} tokens each, got {list(lengths)}")
    if value_tokens is not None and value_tokens < 1:
        raise ValueError(f"--value-tokens must be at least 1, got {value_tokens}")
    tok = load_tokenizer(tokenizer)
    _, held_out = load_corpus(DataConfig(tokenizer=tokenizer), tok)  # the essay haystacks' text
    ctx = GenContext(tok, held_out, value_tokens)
    lines = []
    for task, length in itertools.product(tasks, lengths):
        for i, depth in enumerate(spread_depths(samples)):
            try:
                s = make_sample(task, ctx, length, float(depth), i, seed)
            except ValueError as e:  # the generators name the eval keys
                raise ValueError(str(e).replace("eval.lengths", "--lengths")
                                 .replace("eval.value_tokens", "--value-tokens")) from None
            text = tok.decode(np.concatenate([s.prompt, s.answer]).tolist())
            lines.append(json.dumps({"text": text, "task": task, "length": length, "depth": round(float(depth), 6),
                                     "answer": tok.decode(s.answer.tolist())}))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, "\n".join(lines) + "\n")
    return len(lines)


def read_probes(path: str | Path) -> list[dict]:
    """The probes of a ``hybrid-lightning probes`` file, each with its ``prompt`` (``text`` less the answer)."""
    if not Path(path).is_file():
        raise ValueError(f"probes file not found: {path}")
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in PROBE_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: no {missing}; is this a 'hybrid-lightning probes' file?")
        if not row["text"].endswith(row["answer"]):
            raise ValueError(f"{path}:{n}: the text does not end with its answer; "
                             "is this a 'hybrid-lightning probes' file?")
        rows.append(row | {"prompt": row["text"][: len(row["text"]) - len(row["answer"])]})
    if not rows:
        raise ValueError(f"{path}: no probes")
    return rows
