"""The long-context scores that ``analyze --metric`` offers; plain data, so the command line reads them
without importing pandas."""

from __future__ import annotations

from hybrid_lightning.records import Tag

# --metric name -> the tidy metric it reads (the long-context scores are defined in analysis/scores.py).
METRICS = {
    "score": "longctx/score",
    "loss_gain": "longctx/loss_gain",
    "exact": "longctx/exact",
    "retrieval_acc": Tag.RETRIEVAL_ACC,
}

SCORE = METRICS["score"]  # the probe score the findings' verdicts judge (analysis/emergence.py, nope.py)
SCORE_SE = f"{SCORE}_se"  # its null standard error (analysis/scores.py)
SCORE_BEYOND = f"{SCORE}_beyond"  # the score beyond the training length
RECORD_SCORES = ("score", "loss_gain", "exact")  # the scores computed from evaluation records
# What each score is, for the report's text.
METRIC_TEXT = {
    "score": "answer-token accuracy minus chance (teacher-forced, mean over task x length)",
    "loss_gain": "chance loss minus answer loss (nats per answer token, mean over task x length)",
    "exact": "exact match of the whole answer (share of probes, mean over task x length)",
    "retrieval_acc": "val/retrieval_acc: argmax accuracy on queried values of synthetic validation sequences",
}
# Axis labels, with units.
METRIC_AXIS = {
    "score": "answer-token accuracy - chance (share of answer tokens)",
    "loss_gain": "chance loss - answer loss (nats per answer token)",
    "exact": "exact match (share of probes)",
    "retrieval_acc": "val/retrieval_acc (share of queried tokens)",
}


def metric_tag(metric: str) -> str:
    """The tidy metric of a ``--metric`` name; a ``ValueError`` naming the valid ones otherwise."""
    if metric not in METRICS:
        raise ValueError(f"--metric must be one of {list(METRICS)}, got {metric!r}")
    return METRICS[metric]


def record_metric(metric: str) -> str:
    """The records' score for per-length and per-depth tables: the metric itself when it is one, else the score."""
    return metric if metric in RECORD_SCORES else "score"
