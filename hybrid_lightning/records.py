"""The evaluation records of a run directory, defined once (torch-free): the rows of
``eval/step_<k>.json`` (long-context cells, position losses, LongPPL), of ``eval/heads_step_<k>.json``
(heads, layers, ablations) and of ``tracing/step_<k>.json`` (mass, trace). The writers build their rows with ``row``,
analysis takes its columns from ``columns``, the docs' tables come from ``docs_row``; and the one
pooling of long-context cells (``weighted_sums``, ``pooled``) that the evaluation's scalars and
analysis's scores both use.

A record kind is a tuple of frozen dataclasses whose fields, in order, are the row's keys; a field's
``doc`` (metadata) is its note in the docs, and a class's docstring says what one row is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


def _doc(text: str = ""):
    return dataclasses.field(metadata={"doc": text})


@dataclasses.dataclass(frozen=True)
class LongContextCell:
    """one row per (task, length, depth, in_window) cell"""

    step: int = _doc()
    tokens: int = _doc()
    task: str = _doc()
    length: int = _doc()
    depth: float = _doc()
    in_window: bool | None = _doc("bool, null without SWA")
    n: int = _doc("samples")
    accuracy: float = _doc("exact match")
    answer_tokens: int = _doc()
    token_accuracy: float = _doc()
    answer_loss: float = _doc()
    chance_token_accuracy: float = _doc("answer tokens a format-only predictor gets right, expected, over "
                                        "`answer_tokens`")
    chance_loss: float = _doc("-log P(answer) per answer token under the same predictor")
    distance: float = _doc("mean tokens from the needle value to the first answer prediction")
    generated: int = _doc("samples decoded")
    generated_exact: float | None = _doc()
    match_all: float | None = _doc()
    match_part: float | None = _doc("generation scores, means over them; null when none was decoded")


@dataclasses.dataclass(frozen=True)
class PositionLoss:
    """one row per bucket"""

    step: int = _doc()
    tokens: int = _doc()
    length: int = _doc()
    position_lo: int = _doc()
    position_hi: int = _doc("positions lo <= p < hi")
    loss: float = _doc()
    n: int = _doc("tokens")


@dataclasses.dataclass(frozen=True)
class LongPPL:
    """one row"""

    step: int = _doc()
    tokens: int = _doc()
    length: int = _doc()
    context: int = _doc()
    alpha: float = _doc()
    beta: float = _doc()
    longppl: float | None = _doc("null without key tokens")
    key_tokens: int | None = _doc("null without an evaluator")
    scored_tokens: int = _doc()
    ppl: float = _doc()
    evaluator: str | None = _doc("the checkpoint that chose the key tokens, null: none")
    reason: str | None = _doc("why LongPPL is null, else null")


@dataclasses.dataclass(frozen=True)
class HeadScores:
    """one row per attention head"""

    step: int = _doc()
    tokens: int = _doc()
    layer: int = _doc()
    head: int = _doc()
    mixer: str = _doc("the layer's mixer: `full`, `swa`, `headwise`, ...")
    window: int | None = _doc("the head's own window; null for full attention, a head-wise layer's full heads included")
    pos: str = _doc()
    score: float | None = _doc()
    token_score: float | None = _doc()
    in_span: float | None = _doc()
    copy_precision: float | None = _doc("null when the argmax never fell in the span")
    span_mass: float | None = _doc()
    source_mass: float | None = _doc("scores null when no probe was kept")
    answer_steps: int = _doc()
    reach_steps: int = _doc("answer steps whose copy source lay inside the head's window")
    reach_score: float | None = _doc("hits / `reach_steps`, null when 0")
    reach_retrieval: bool = _doc("bool")
    retrieval: bool = _doc("bool")
    role: str | None = _doc("`copy`, `locator` or null")


@dataclasses.dataclass(frozen=True)
class LayerPlace:
    """one row per layer"""

    step: int = _doc()
    tokens: int = _doc()
    layer: int = _doc()
    mixer: str = _doc()
    window: int | None = _doc()
    pos: str = _doc()
    applicable: bool = _doc("false: not attention")


@dataclasses.dataclass(frozen=True)
class HeadCounts:
    """the head counts of a layer, or (``total``) of all attention heads"""

    retrieval_heads: int | None = _doc()
    copy_heads: int | None = _doc()
    locator_heads: int | None = _doc()
    max_score: float | None = _doc()
    mean_score: float | None = _doc()
    reaching_heads: int | None = _doc("heads with `reach_steps` > 0")
    reach_retrieval_heads: int | None = _doc("null where not applicable")


@dataclasses.dataclass(frozen=True)
class Ablation:
    """rows of `heads` ablations on this checkpoint, one per (task, length) of the evaluation"""

    step: int = _doc()
    tokens: int = _doc()
    selection: str = _doc("`top`, `random`, `list`, `control`: a random draw from the top K's layers, "
                          "`control_nonretrieval`: a random draw of K non-retrieval heads, `single`: one head alone")
    mode: str = _doc("`zero`: the heads' outputs 0, `uniform`: their pre-softmax logits 0")
    k: int | None = _doc()
    seed: int | None = _doc("random only")
    draw: int | None = _doc("controls only: the draw's index")
    masked: list = _doc("[layer, head] pairs")
    task: str = _doc()
    length: int = _doc()
    n: int = _doc()
    accuracy: float = _doc()
    masked_accuracy: float = _doc()
    token_accuracy: float = _doc()
    masked_token_accuracy: float = _doc()
    answer_loss: float = _doc()
    masked_answer_loss: float = _doc()
    chance_token_accuracy: float = _doc()
    chance_loss: float = _doc()


@dataclasses.dataclass(frozen=True)
class Restriction:
    """the receptive-field restriction a diagnostic ran under (model/restrict.py)"""

    layers: str | None = _doc("null: unrestricted; `full` or `efficient`: those layers saw their last "
                              "`receptive_field` tokens only")
    receptive_field: int | None = _doc("R; null when unrestricted")


@dataclasses.dataclass(frozen=True)
class RestrictedScores:
    """one row per restriction, the unrestricted model's among them"""

    step: int = _doc()
    tokens: int = _doc()
    score: float | None = _doc("`val_longctx/score` of the run's `eval:` probes within the training length")
    score_beyond: float | None = _doc()
    exact: float | None = _doc()
    longppl: float | None = _doc("on the evaluator's key tokens; null without an evaluator")
    ppl: float | None = _doc("perplexity of the tokens with at least 2K context (LongPPL's scored tokens)")
    position_loss: list = _doc("[position_lo, position_hi, loss] per position bucket")


@dataclasses.dataclass(frozen=True)
class LayerProbe:
    """one row per layer and feature"""

    step: int = _doc()
    tokens: int = _doc()
    layer: int = _doc()
    mixer: str = _doc("the layer's mixer")
    feature: str = _doc("`residual`: the block's output at the last token; `delta`: minus the block's input")
    accuracy: float = _doc("held-out accuracy of the layer's logistic regression")
    n_train: int = _doc()
    n_test: int = _doc()
    classes: int = _doc("needle values; chance is 1 / classes")


@dataclasses.dataclass(frozen=True)
class GradientInfluence:
    """one row per distance to the last token"""

    step: int = _doc()
    tokens: int = _doc()
    distance: int = _doc("0 = the last token")
    mean_grad_norm: float | None = _doc("mean over texts of the L2 norm of d(target)/d(input embedding); null where "
                                        "no text reaches the distance")
    sum_grad_norm: float = _doc()
    sample_count: int = _doc("texts reaching the distance")


@dataclasses.dataclass(frozen=True)
class _Head:
    """the checkpoint and head a tracing row is of"""

    step: int = _doc()
    tokens: int = _doc()
    layer: int = _doc()
    head: int = _doc()


@dataclasses.dataclass(frozen=True)
class HeadMass(_Head):
    """one row per attention head (heads/mass.py)"""

    mixer: str = _doc("the layer's mixer: `full`, `swa`, ...")
    window: int | None = _doc()
    mass: float = _doc("attention mass of the query at len - 2 on the needle's tokens, mean over samples")
    target: bool = _doc("bool: one of the target heads (the top K of the checkpoint at `final_step`)")


@dataclasses.dataclass(frozen=True)
class TracedHead(_Head):
    """one row per target head (heads/mass.py)"""

    final_step: int = _doc("the checkpoint whose top heads these are: the final one (`trace`), the step's own "
                           "(`eval.trace`)")
    reference_step: int = _doc("the checkpoint of the Q/K distances (0: the initialisation)")
    entropy: float = _doc("at the last 4 queries, mean over queries and samples")
    entropy_norm: float = _doc("entropy / log(keys seen)")
    q_l2: float = _doc()
    k_l2: float = _doc("L2 norms of the differences of the head's q_proj rows and its KV group's k_proj rows")
    q_rel_l2: float = _doc()
    k_rel_l2: float = _doc("the same over the reference's norm")
    qk_l2: float = _doc()
    qk_rel_l2: float = _doc("q + k")


# TensorBoard tag groups of the evaluations' scalars and images. TensorBoard orders groups by name, so
# these sort after ``train/`` and ``val/``: the long-context headline (scores over every task, LongPPL), the
# retrieval heads (totals, and the layers whose heads have scored), then the per-task detail.
LONGCTX_TAGS = "val_longctx"
HEADS_TAGS = "val_longctx_heads"
TRACING_TAGS = "tracing"  # the target heads traced over a run's checkpoints (heads/tracing.py), in <run>/tracing/
TRACE_TAGS = "val_longctx_trace"  # the same traced during training (eval.trace:), each step's own top heads
TASKS_TAGS = "val_longctx_tasks"


class Tag:
    """The TensorBoard scalar tags a run logs, named once: training writes them, the console, ``grid status``,
    the HParams dashboard and analysis read them (the evaluations' per-task and per-layer tags are built in
    eval/report.py and heads/report.py under ``LONGCTX_TAGS`` and ``HEADS_TAGS``)."""

    LOSS = "train/loss"  # the optimizer step's loss, the mean over its micro-batches
    LR = "train/lr"
    TOKENS = "train/tokens"  # training tokens after the step
    GRAD_NORM = "train/grad_norm"  # before clipping
    TOKENS_PER_SEC = "train/tokens_per_sec"
    TFLOPS = "train/tflops_per_sec"
    MFU = "train/mfu"
    PEAK_MEMORY = "train/peak_memory_gib"
    VAL_LOSS = "val/loss"
    VAL_PPL = "val/ppl"
    TEXT_LOSS = "val/text_loss"  # held-out natural text (data.text_val_files) only
    SYNTHETIC_LOSS = "val/synthetic_loss"
    RETRIEVAL_LOSS = "val/retrieval_loss"
    RETRIEVAL_ACC = "val/retrieval_acc"
    SCORE = f"{LONGCTX_TAGS}/score"  # records.headline
    SCORE_BEYOND = f"{LONGCTX_TAGS}/score_beyond"
    LONGPPL = f"{LONGCTX_TAGS}/longppl"
    RETRIEVAL_HEADS = f"{HEADS_TAGS}/retrieval_heads"  # of every attention head (heads/report.py)


# The first page of a run's TensorBoard (the custom-scalars layout, training/layout.py): one chart each, in this order.
HEADLINE = {"score within the training length": (Tag.SCORE,), "score beyond the training length": (Tag.SCORE_BEYOND,),
            "retrieval heads": (Tag.RETRIEVAL_HEADS,), "loss": (Tag.LOSS, Tag.VAL_LOSS)}

# The record kinds: the key of each list in its file -> the dataclasses making up one of its rows.
LONG_CONTEXT = {"records": (LongContextCell,), "position_loss": (PositionLoss,), "longppl": (LongPPL,)}
HEADS = {"heads": (HeadScores,), "layers": (LayerPlace, HeadCounts), "ablation": (Ablation,)}
# The paper's diagnostics (eval/restricted.py, eval/layer_probe.py, eval/gradient.py), each in a file of its own.
DIAGNOSTICS = {"restricted": (RestrictedScores, Restriction), "layer_probe": (LayerProbe, Restriction),
               "gradient": (GradientInfluence, Restriction)}
TRACING = {"mass": (HeadMass,), "trace": (TracedHead,)}  # tracing/step_<k>.json (heads/tracing.py)
KINDS = {**LONG_CONTEXT, **HEADS, **DIAGNOSTICS, **TRACING}
# What the docs add after a kind's fields.
# The fields that identify an ablation row: a newer row with the same values replaces an older one.
ABLATION_KEY = ("selection", "mode", "k", "seed", "draw", "masked", "task", "length")
NOTES = {"ablation": "a new ablation with the same selection, mask mode, K, seed, draw and heads replaces its rows, "
                     "others are kept"}
# Measure of a long-context cell -> the field that weighs it when cells are pooled (over depths, the
# window split, tasks): samples weigh exact match, answer tokens the token measures, decoded samples
# the generation measures.
POOL_WEIGHTS = {"accuracy": "n", "token_accuracy": "answer_tokens", "answer_loss": "answer_tokens",
                "chance_token_accuracy": "answer_tokens", "chance_loss": "answer_tokens",
                "generated_exact": "generated", "match_all": "generated", "match_part": "generated"}


def columns(kind: str) -> tuple[str, ...]:
    """The keys of a row of ``kind`` (a key of ``KINDS``), in order."""
    return tuple(f.name for part in KINDS[kind] for f in dataclasses.fields(part))


def row(kind: str, /, **values) -> dict:
    """A row of ``kind`` as the JSON files hold it: every field, in order. A missing or unknown field is
    a ``TypeError`` (a writer out of step with this definition)."""
    out: dict = {}
    for part in KINDS[kind]:
        names = {f.name for f in dataclasses.fields(part)}
        out |= dataclasses.asdict(part(**{k: v for k, v in values.items() if k in names}))
    unknown = values.keys() - out.keys()
    if unknown:
        raise TypeError(f"{kind}: no fields {sorted(unknown)}")
    return out


def docs_row(kind: str) -> str:
    """The Markdown table row that documents ``kind``: ``| `kind` | what a row is: `field` (note), ... |``."""
    parts = []
    for part in KINDS[kind]:
        parts += [f"`{f.name}`" + (f" ({f.metadata['doc']})" if f.metadata["doc"] else "")
                  for f in dataclasses.fields(part)]
    note = f"; {NOTES[kind]}" if kind in NOTES else ""
    return f"| `{kind}` | {KINDS[kind][0].__doc__}: {', '.join(parts)}{note} |"


def weighted_sums(rows: list[dict]) -> dict:
    """Of long-context cells: each weight (``POOL_WEIGHTS``' values) summed, and each measure times its
    weight summed (rows without the weight left out, as cells without generations)."""
    sums = {w: sum(r.get(w) or 0 for r in rows) for w in dict.fromkeys(POOL_WEIGHTS.values())}
    return sums | {m: sum(r[m] * r[w] for r in rows if r.get(w)) for m, w in POOL_WEIGHTS.items()}


def pooled(sums: Mapping) -> dict:
    """The pooled measures from ``weighted_sums`` (numbers, or pandas columns of sums): exact match,
    token accuracy, answer loss, the chance accuracy (of a format-only predictor, probes/chance.py) and
    chance loss, ``score`` = token accuracy minus its chance level, ``loss_gain`` = chance loss minus answer
    loss, and ``score_var``, the variance of ``score`` for a model that retrieves nothing (a binomial share of
    the answer tokens at the chance accuracy; an upper bound where the tokens' chances differ); with
    ``generated`` among the sums, the generation measures too (None where nothing was decoded)."""
    tokens = sums["answer_tokens"]
    token_accuracy = sums["token_accuracy"] / tokens
    chance = sums["chance_token_accuracy"] / tokens
    answer_loss, chance_loss = sums["answer_loss"] / tokens, sums["chance_loss"] / tokens
    out = {"n": sums["n"], "accuracy": sums["accuracy"] / sums["n"], "token_accuracy": token_accuracy,
           "answer_loss": answer_loss, "chance_token_accuracy": chance, "chance_loss": chance_loss,
           "score": token_accuracy - chance, "loss_gain": chance_loss - answer_loss,
           "score_var": chance * (1 - chance) / tokens}
    if "generated" in sums:
        gen = sums["generated"]
        out |= {"generated": gen,
                **{m: sums[m] / gen if gen else None for m, w in POOL_WEIGHTS.items() if w == "generated"}}
    return out


def beyond(length: int, seq_len: int | None) -> bool:
    """Whether a probe of ``length`` tokens lies beyond the training length ``seq_len`` (None: unknown, within)."""
    return seq_len is not None and length > seq_len


def split(rows: list[dict], seq_len: int | None, beyond_it: bool = False) -> list[dict]:
    """The long-context cells of lengths up to the training length (``beyond_it``: of longer lengths)."""
    return [r for r in rows if beyond(r["length"], seq_len) == beyond_it]


def pool(rows: list[dict], **where) -> dict | None:
    """Pooled figures (``pooled``) of the cells matching ``where`` (e.g. task=..., in_window=True); None if none
    does."""
    rows = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return pooled(weighted_sums(rows)) if rows else None


def mean_over_cells(rows: list[dict], measure: str) -> float | None:
    """``measure`` of ``pool`` per (task, length), pooled over depths and the window split, averaged over (task,
    length); None without cells (or, for a generation measure, without generations). For ``score_var``, the
    variance of that mean."""
    values = [pool(rows, task=t, length=n)[measure] for t, n in sorted({(r["task"], r["length"]) for r in rows})]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return sum(values) / len(values) ** (2 if measure == "score_var" else 1)


def headline(rows: list[dict], seq_len: int | None) -> dict[str, float | None]:
    """The one score of an evaluation's cells, ``val_longctx/score`` in training and ``longctx/score`` in
    analysis: answer-token accuracy above chance (teacher-forced; a predictor that knows the answer's format but
    retrieves nothing scores 0, probes/chance.py), averaged over (task, length) within the training length
    ``seq_len`` (retrieval, not extrapolation), each pooled over depths; ``score_beyond`` the same over the longer
    lengths; beside them exact match and RULER's generation scores over every length."""
    within, past = split(rows, seq_len), split(rows, seq_len, beyond_it=True)
    return {"score": mean_over_cells(within, "score"), "score_beyond": mean_over_cells(past, "score"),
            "exact": mean_over_cells(rows, "accuracy"),
            **{k: mean_over_cells(rows, k) for k in ("match_all", "match_part")}}
