"""Long-context scores of the evaluation records (eval/step_<k>.json), graded so that they move
before exact match does (a small model answers no probe exactly for a long time).

Each score pools a run's records of one step over needle depths (and the in/out-of-window split)
per (task, length), as the evaluation does (``hybrid_lightning.records.pooled``: samples weigh
exact match, answer tokens weigh the token measures and the chance accuracy), then averages over
(task, length):

    score       teacher-forced answer-token accuracy minus its chance level (the accuracy of a
                predictor that knows the answer's format but retrieves nothing, probes/chance.py);
                0 = no retrieval
    score_se    the standard error of score for a model that retrieves nothing: per cell a
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
from hybrid_lightning.records import POOL_WEIGHTS, mean_over_cells, split
from hybrid_lightning.records import pooled as pool_sums

MEASURES = {"score": "score", "loss_gain": "loss_gain", "exact": "accuracy"}  # RECORD_SCORES -> records.pooled's


def pooled(records: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Records pooled over everything but ``by`` (``hybrid_lightning.records.pooled``): columns ``by`` +
    score, score_se, loss_gain, exact, n."""
    measures = {m: w for m, w in POOL_WEIGHTS.items() if w != "generated"}
    weighted = records[list(dict.fromkeys(measures.values()))].assign(
        **{m: records[m] * records[w] for m, w in measures.items()})
    g = pd.concat([records[by], weighted], axis=1).groupby(by, sort=True).sum().reset_index()
    p = pool_sums(g)
    return g[by].assign(score=p["score"], score_se=np.sqrt(p["score_var"]), loss_gain=p["loss_gain"],
                        exact=p["accuracy"], n=g["n"])


def record_scores(records: pd.DataFrame, seq_len: pd.Series) -> pd.DataFrame:
    """Tidy scores (run, step, tokens, metric, value) with metrics ``longctx/<score>`` (lengths up to the run's
    training length) and ``longctx/<score>_beyond`` (longer ones) for each of ``RECORD_SCORES``, and
    ``longctx/score_se`` (of the first): each evaluation's cells scored as training scores them
    (``hybrid_lightning.records``: the within/beyond split and the mean over (task, length)).

    Args:
        records: long-context records with a ``run`` column.
        seq_len: the training length (the plan's) indexed by run.
    """
    rows = []
    for (run, step, tokens), g in records.groupby(["run", "step", "tokens"], sort=True):
        cells = g.to_dict("records")
        for suffix, part in (("", split(cells, seq_len[run])), ("_beyond", split(cells, seq_len[run], beyond_it=True))):
            if not part:
                continue
            rows += [(run, step, tokens, f"longctx/{score}{suffix}", mean_over_cells(part, MEASURES[score]))
                     for score in RECORD_SCORES]
            if not suffix:
                rows.append((run, step, tokens, "longctx/score_se", np.sqrt(mean_over_cells(part, "score_var"))))
    return pd.DataFrame(rows, columns=["run", "step", "tokens", "metric", "value"])
