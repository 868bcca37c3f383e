"""Long-context scores of the evaluation records (eval/step_<k>.json), graded so that they move
before exact match does (a small model answers no probe exactly for a long time).

Each score pools a run's records of one step over needle depths (and the in/out-of-window split)
per (task, length), as the evaluation does (``hybrid_lightning.records.pooled``: samples weigh
exact match, answer tokens weigh the token measures, chance accuracy = exp(-pooled chance loss)),
then averages over (task, length):

    token_acc   teacher-forced answer-token accuracy minus its chance level (the accuracy of a
                model that knows the values' distribution but retrieves nothing); 0 = no retrieval
    loss_gain   chance loss minus answer loss, nats per answer token; 0 = no retrieval
    exact       exact match of the whole answer (``longctx/exact``)

``<score>_beyond`` is the same over the lengths above the run's ``train.seq_len`` only.
"""

from __future__ import annotations

import pandas as pd

from hybrid_lightning.analysis.metrics import RECORD_SCORES
from hybrid_lightning.records import POOL_WEIGHTS
from hybrid_lightning.records import pooled as pool_sums


def pooled(records: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Records pooled over everything but ``by`` (``hybrid_lightning.records.pooled``): columns ``by`` +
    token_acc, loss_gain, exact, n."""
    measures = {m: w for m, w in POOL_WEIGHTS.items() if w != "generated"}
    weighted = records[list(dict.fromkeys(measures.values()))].assign(**{m: records[m] * records[w] for m, w in measures.items()})
    g = pd.concat([records[by], weighted], axis=1).groupby(by, sort=True).sum().reset_index()
    p = pool_sums(g)
    return g[by].assign(token_acc=p["score"], loss_gain=p["chance_loss"] - p["answer_loss"], exact=p["accuracy"], n=g["n"])


def record_scores(records: pd.DataFrame, seq_len: pd.Series) -> pd.DataFrame:
    """Tidy scores (run, step, tokens, metric, value) with metrics ``longctx/<score>`` and
    ``longctx/<score>_beyond`` for each of ``RECORD_SCORES``.

    Args:
        records: long-context records with a ``run`` column.
        seq_len: ``train.seq_len`` indexed by run.
    """
    if records.empty:
        return pd.DataFrame(columns=["run", "step", "tokens", "metric", "value"])
    records = records.astype({"length": "int64"})
    beyond = records[records["length"] > records["run"].map(seq_len)]
    frames = []
    for suffix, part in (("", records), ("_beyond", beyond)):
        if part.empty:
            continue
        cells = pooled(part, ["run", "step", "tokens", "task", "length"])
        means = cells.groupby(["run", "step", "tokens"], sort=True)[list(RECORD_SCORES)].mean().reset_index()
        tidy = means.melt(["run", "step", "tokens"], list(RECORD_SCORES), "metric", "value")
        frames.append(tidy.assign(metric="longctx/" + tidy["metric"] + suffix))
    return pd.concat(frames, ignore_index=True)
