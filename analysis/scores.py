"""Long-context scores of the evaluation records (eval/step_<k>.json), graded so that they move
before exact match does (a small model answers no probe exactly for a long time).

Each score pools a run's records of one step over needle depths (and the in/out-of-window split)
per (task, length), as the evaluation does (``hybrid_lightning.records.pooled``: samples weigh
exact match, answer tokens weigh the token measures and the chance accuracy), then averages over
(task, length):

    token_acc   teacher-forced answer-token accuracy minus its chance level (the accuracy of a
                predictor that knows the answer's format but retrieves nothing, probes/chance.py);
                0 = no retrieval
    token_acc_se  the standard error of token_acc for a model that retrieves nothing: per cell a
                binomial share of its answer tokens at the chance accuracy (an upper bound where
                the tokens' chances differ), over the cells' mean
    loss_gain   chance loss minus answer loss, nats per answer token; 0 = no retrieval
    exact       exact match of the whole answer (``longctx/exact``)

``longctx/<score>`` is over the lengths up to the run's ``train.seq_len`` (retrieval where the model
was trained), ``longctx/<score>_beyond`` over the longer ones (extrapolation) only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hybrid_lightning.analysis.metrics import RECORD_SCORES
from hybrid_lightning.records import POOL_WEIGHTS
from hybrid_lightning.records import pooled as pool_sums


def pooled(records: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Records pooled over everything but ``by`` (``hybrid_lightning.records.pooled``): columns ``by`` +
    token_acc, token_acc_se, loss_gain, exact, n."""
    measures = {m: w for m, w in POOL_WEIGHTS.items() if w != "generated"}
    weighted = records[list(dict.fromkeys(measures.values()))].assign(**{m: records[m] * records[w] for m, w in measures.items()})
    g = pd.concat([records[by], weighted], axis=1).groupby(by, sort=True).sum().reset_index()
    p = pool_sums(g)
    chance = p["chance_token_accuracy"]
    return g[by].assign(token_acc=p["score"], token_acc_se=np.sqrt(chance * (1 - chance) / g["answer_tokens"]),
                        loss_gain=p["chance_loss"] - p["answer_loss"], exact=p["accuracy"], n=g["n"])


def record_scores(records: pd.DataFrame, seq_len: pd.Series) -> pd.DataFrame:
    """Tidy scores (run, step, tokens, metric, value) with metrics ``longctx/<score>`` (lengths up to
    ``train.seq_len``) and ``longctx/<score>_beyond`` (longer ones) for each of ``RECORD_SCORES``, and
    ``longctx/token_acc_se`` (of the first).

    Args:
        records: long-context records with a ``run`` column.
        seq_len: ``train.seq_len`` indexed by run.
    """
    if records.empty:
        return pd.DataFrame(columns=["run", "step", "tokens", "metric", "value"])
    records = records.astype({"length": "int64"})
    over = records["length"] > records["run"].map(seq_len)
    frames = []
    for suffix, part in (("", records[~over]), ("_beyond", records[over])):
        if part.empty:
            continue
        cells = pooled(part, ["run", "step", "tokens", "task", "length"]).assign(
            token_acc_se=lambda c: c["token_acc_se"] ** 2)  # variances, averaged over the cells below
        scores = list(RECORD_SCORES) + ["token_acc_se"] * (not suffix)
        g = cells.groupby(["run", "step", "tokens"], sort=True)
        means = g[list(RECORD_SCORES)].mean().assign(token_acc_se=np.sqrt(g["token_acc_se"].sum()) / g.size()).reset_index()
        tidy = means.melt(["run", "step", "tokens"], scores, "metric", "value")
        frames.append(tidy.assign(metric="longctx/" + tidy["metric"] + suffix))
    return pd.concat(frames, ignore_index=True)
