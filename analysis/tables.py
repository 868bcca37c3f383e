"""The report's tables, computed from ``load_runs``'s tables (analysis/load.py). Pure functions of
data frames: every number of the CSVs comes from here.

An *architecture* is the runs' ``label`` (their config without seed and bookkeeping); its seeds are
its runs. Across seeds: ``mean``, ``std`` (sample standard deviation, NaN for one seed) and the
``min``-``max`` range, which is the band the figures draw.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import stats
from hybrid_lightning.analysis.metrics import SCORE_SE, metric_tag, record_metric

FRACTIONS = (0.5, 0.9)  # thresholds: shares of the final score


def curves(metrics: pd.DataFrame, tag: str) -> pd.DataFrame:
    """Seed statistics of ``tag`` per architecture and step, at the steps every run of the architecture
    that logs ``tag`` has reached (so that a mean is always over the same seeds).

    Returns: label, step, tokens, seeds, mean, std, min, max; sorted by label and step.
    """
    d = metrics[metrics["metric"] == tag]
    runs = d.groupby("label")["run"].nunique()
    g = d.groupby(["label", "step"]).agg(tokens=("tokens", "first"), seeds=("run", "nunique"), mean=("value", "mean"),
                                         std=("value", "std"), min=("value", "min"), max=("value", "max")).reset_index()
    return g[g["seeds"] == g["label"].map(runs)].reset_index(drop=True)


def noise_levels(metrics: pd.DataFrame, z: float) -> pd.Series:
    """Per architecture, ``z`` null standard errors of the mean of its seeds, from each run's last
    ``SCORE_SE``: the level at which the verdicts count an architecture's seed mean as a signal
    (analysis/emergence.py). Empty where no run logged the error."""
    se = metrics[metrics["metric"] == SCORE_SE].sort_values("step").groupby(["label", "run"])["value"].last()
    return se.groupby(level="label").agg(lambda s: z * float(np.sqrt((s**2).mean() / len(s))))


def thresholds(curve: pd.DataFrame, fractions: tuple[float, ...] = FRACTIONS) -> pd.DataFrame:
    """Per architecture, the tokens (and step) at which the seed-mean curve first reaches each share of its
    final value (no interpolation between evaluations); NaN where the final value is not above 0.

    Returns: label, seeds, final_step, final_tokens, final, final_min, final_max, then tokens_<p>, step_<p>
    for each fraction as a percentage p (e.g. tokens_50).
    """
    rows = []
    for label, c in curve.groupby("label", sort=True):
        c = c.sort_values("step")
        last = c.iloc[-1]
        row = {"label": label, "seeds": int(last["seeds"]), "final_step": int(last["step"]),
               "final_tokens": last["tokens"], "final": last["mean"], "final_min": last["min"],
               "final_max": last["max"]}
        for f in fractions:
            reached = c[c["mean"] >= f * last["mean"]] if last["mean"] > 0 else c.iloc[:0]
            p = round(100 * f)
            row[f"tokens_{p}"] = reached["tokens"].iloc[0] if len(reached) else np.nan
            row[f"step_{p}"] = reached["step"].iloc[0] if len(reached) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def final_values(metrics: pd.DataFrame, tag: str) -> pd.DataFrame:
    """Each run's last value of ``tag``: run, label, step, tokens, value."""
    d = metrics[metrics["metric"] == tag].sort_values(["run", "step"])
    return d.groupby("run", as_index=False).last()[["run", "label", "step", "tokens", "value"]]


def windows(configs: pd.DataFrame) -> pd.Series:
    """The SWA window of each run (indexed by run); NaN for models without SWA layers."""
    return pd.Series([json.loads(a).get("model.window", np.nan) for a in configs["arch"]], index=configs["run"],
                     dtype=float)


def first_heads(metrics: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """Per run with retrieval-head scores: the first scored step with a retrieval head for good (it and every
    later scoring have at least one), so a head that flickers above the threshold once does not count.

    Returns: run, label, seed, window, scored_until (last scored step), first_step, first_tokens (NaN: none yet).
    """
    d = metrics[metrics["metric"] == "heads/retrieval_heads"].sort_values(["run", "step"])
    rows = []
    window = windows(configs)
    for run, r in d.groupby("run", sort=True):
        hit = r[r["value"].iloc[::-1].cummin().iloc[::-1] >= 1]  # reverse cumulative minimum: held from here on
        rows.append({"run": run, "label": r["label"].iloc[0], "seed": r["seed"].iloc[0], "window": window[run],
                     "scored_until": r["step"].iloc[-1],
                     "first_step": hit["step"].iloc[0] if len(hit) else np.nan,
                     "first_tokens": hit["tokens"].iloc[0] if len(hit) else np.nan})
    return pd.DataFrame(rows, columns=["run", "label", "seed", "window", "scored_until", "first_step", "first_tokens"])


def first_heads_by_arch(first: pd.DataFrame) -> pd.DataFrame:
    """``first_heads`` per architecture: window, runs, runs_with_head, the mean, min and max of first_step and
    first_tokens over the runs that have a retrieval head (NaN where none has), and first_step_ci_low/high: a
    95% t interval of the mean first step over seeds (``stats.mean_ci``), where at least two runs have a head
    and every run has one (a run without one has no step to average)."""
    g = first.groupby("label", sort=True)
    out = g.agg(window=("window", "first"), runs=("run", "count"), runs_with_head=("first_step", "count"),
                first_step_mean=("first_step", "mean"), first_step_min=("first_step", "min"),
                first_step_max=("first_step", "max"), first_tokens_mean=("first_tokens", "mean"),
                first_tokens_min=("first_tokens", "min"), first_tokens_max=("first_tokens", "max"))
    ci = g["first_step"].agg(lambda v: stats.mean_ci(v.to_numpy(float)))
    out["first_step_ci_low"], out["first_step_ci_high"] = ci.str[0], ci.str[1]
    return out.reset_index().sort_values(["window", "label"], na_position="last").reset_index(drop=True)


def niah(records: pd.DataFrame, configs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each run's last evaluation pooled per (task, length, depth) (analysis/scores.py).

    Returns: run, label, step, task, length, depth, value (the records' score of ``record_metric(metric)``).
    """
    from hybrid_lightning.analysis.scores import pooled

    if records.empty:
        return pd.DataFrame(columns=["run", "label", "step", "task", "length", "depth", "value"])
    last = records.groupby("run")["step"].transform("max")
    cells = pooled(records[records["step"] == last], ["run", "step", "task", "length", "depth"])
    cells = cells.rename(columns={record_metric(metric): "value"})[["run", "step", "task", "length", "depth", "value"]]
    labels = configs.set_index("run")["label"]
    return cells.assign(label=cells["run"].map(labels))[["run", "label", "step", "task", "length", "depth", "value"]]


def summary(metrics: pd.DataFrame, configs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per architecture, its final values, mean over seeds (each run's last value).

    Returns: label, budget_tokens (train.max_steps x tokens per step), seeds, done (runs whose status is
    done), step (the fewest steps any seed has logged), val_loss, score, score_min, score_max, score_beyond
    (the records' score over lengths above train.seq_len), retrieval_heads, max_head_score.
    """
    tag = metric_tag(metric)
    columns = {"val_loss": "val/loss", "score": tag, "score_beyond": f"longctx/{record_metric(metric)}_beyond",
               "retrieval_heads": "heads/retrieval_heads", "max_head_score": "heads/max_score"}
    per_run = configs[["run", "label", "state", "train.max_steps", "tokens_per_step"]].set_index("run")
    per_run["step"] = metrics.groupby("run")["step"].max()
    for name, t in columns.items():
        per_run[name] = final_values(metrics, t).set_index("run")["value"]
    g = per_run.groupby("label", sort=True)
    out = g.agg(budget_tokens=("train.max_steps", "first"), seeds=("state", "size"),
                done=("state", lambda s: int((s == "done").sum())), step=("step", "min"), val_loss=("val_loss", "mean"),
                score=("score", "mean"), score_min=("score", "min"), score_max=("score", "max"),
                score_beyond=("score_beyond", "mean"), retrieval_heads=("retrieval_heads", "mean"),
                max_head_score=("max_head_score", "mean"))
    out["budget_tokens"] = out["budget_tokens"] * g["tokens_per_step"].first()
    return out.reset_index()


def pos_pairs(summary_table: pd.DataFrame, configs: pd.DataFrame, key: str) -> pd.DataFrame:
    """Architectures differing only in ``key`` (``model.pos.full`` or ``model.pos.efficient``), RoPE against NoPE.

    Returns: factor (= key), base (the label of the RoPE architecture), seeds_rope, seeds_nope (the runs each
    mean is over), score_beyond_rope, score_beyond_nope, score_beyond_delta (NoPE - RoPE), val_loss_rope,
    val_loss_nope, val_loss_delta; empty without such pairs. The deltas are differences of means, without
    an interval (analysis/findings.py tests them).
    """
    arch = configs.drop_duplicates("label").set_index("label")["arch"].map(json.loads)
    by_label = summary_table.set_index("label")
    groups: dict[str, dict[str, str]] = {}
    for label, identity in arch.items():
        if key in identity:
            rest = json.dumps({k: v for k, v in identity.items() if k != key}, sort_keys=True, default=str)
            groups.setdefault(rest, {})[identity[key]] = label
    rows = []
    for pair in groups.values():
        if {"rope", "nope"} <= pair.keys():
            rope, nope = by_label.loc[pair["rope"]], by_label.loc[pair["nope"]]
            row = {"factor": key, "base": pair["rope"], "seeds_rope": rope["seeds"], "seeds_nope": nope["seeds"]}
            for m in ("score_beyond", "val_loss"):
                row |= {f"{m}_rope": rope[m], f"{m}_nope": nope[m], f"{m}_delta": nope[m] - rope[m]}
            rows.append(row)
    return pd.DataFrame(rows, columns=["factor", "base", "seeds_rope", "seeds_nope"]
                        + [f"{m}_{s}" for m in ("score_beyond", "val_loss") for s in ("rope", "nope", "delta")])


def head_maps(heads: pd.DataFrame, layers: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """Retrieval score per architecture, layer and head at each run's last scored step, mean over seeds;
    layers that are not attention appear once with head NaN and score NaN.

    Returns: label, layer, head, mixer, window, applicable, score, runs.
    """
    columns = ["label", "layer", "head", "mixer", "window", "applicable", "score", "runs"]
    if layers.empty:
        return pd.DataFrame(columns=columns)
    labels = configs.set_index("run")["label"]
    last_layers = layers[layers["step"] == layers.groupby("run")["step"].transform("max")].assign(
        label=lambda d: d["run"].map(labels))
    last_heads = heads[heads["step"] == heads.groupby("run")["step"].transform("max")].assign(
        label=lambda d: d["run"].map(labels))
    scores = (last_heads.groupby(["label", "layer", "head"]).agg(score=("score", "mean"), runs=("run", "nunique"))
              .reset_index())
    mixers = last_layers.groupby(["label", "layer"]).agg(mixer=("mixer", "first"), window=("window", "first"),
                                                         applicable=("applicable", "first")).reset_index()
    out = mixers.merge(scores, on=["label", "layer"], how="left")
    return out[columns].sort_values(["label", "layer", "head"]).reset_index(drop=True)


ABLATION_COLUMNS = ["run", "label", "step", "selection", "k", "seed", "draw", "heads", "length", "within", "n",
                    "token_accuracy", "masked_token_accuracy", "token_drop", "accuracy", "masked_accuracy",
                    "exact_drop", "chance_token_accuracy"]


# selections drawn at random: layer-matched controls, controls among non-retrieval heads, any heads outside the top K
DRAWS = ("control", "control_nonretrieval", "random")


def ablation(ablations: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """Head ablations (``hybrid-lightning heads --mask-*``), one row per draw and probe length, pooled over
    the tasks (weighted by their probes). A draw is one masking of a run's checkpoint: (step, selection,
    K, seed, masked heads).

    Returns: run, label, step, selection (top, random, control, list, single), k, seed (random draws and
    controls), draw (the index of a control draw: ``heads --mask-top K --controls N``), heads (the masked
    heads as "layer.head", space-separated), length, within (length <= train.seq_len), n (probes),
    token_accuracy and masked_token_accuracy, token_drop (unmasked - masked), accuracy and masked_accuracy
    (exact match), exact_drop, chance_token_accuracy.
    """
    if ablations.empty:
        return pd.DataFrame(columns=ABLATION_COLUMNS)
    rows = ablations.assign(heads=ablations["masked"].map(lambda hs: " ".join(f"{layer}.{head}" for layer, head in hs)),
                            seed=ablations["seed"].astype("Int64"), k=ablations["k"].astype("Int64"),
                            draw=ablations["draw"].astype("Int64") if "draw" in ablations else pd.NA)
    keys = ["run", "step", "selection", "k", "seed", "draw", "heads", "length"]
    values = ["token_accuracy", "masked_token_accuracy", "accuracy", "masked_accuracy", "chance_token_accuracy"]
    weighted = rows[values].mul(rows["n"], axis=0).assign(n=rows["n"], **{k: rows[k] for k in keys})
    out = weighted.groupby(keys, dropna=False, sort=True).sum().reset_index()
    out[values] = out[values].div(out["n"], axis=0)
    by_run = configs.set_index("run")
    out["label"] = out["run"].map(by_run["label"])
    out["within"] = out["length"] <= out["run"].map(by_run["train.seq_len"])
    out["token_drop"] = out["token_accuracy"] - out["masked_token_accuracy"]
    out["exact_drop"] = out["accuracy"] - out["masked_accuracy"]
    return out[ABLATION_COLUMNS]


def ablation_summary(table: pd.DataFrame) -> pd.DataFrame:
    """``ablation`` per run, checkpoint, selection, K, masked heads (empty for random and control draws,
    which are pooled) and length, over the draws: draws, the mean, min and max of token_drop, the mean of
    exact_drop, and the unmasked token accuracy and its chance level.

    Returns: run, label, step, selection, k, heads, length, within, draws, token_accuracy,
    chance_token_accuracy, token_drop, token_drop_min, token_drop_max, exact_drop.
    """
    keys = ["run", "label", "step", "selection", "k", "heads", "length", "within"]
    table = table.assign(heads=table["heads"].where(~table["selection"].isin(DRAWS), ""))
    out = table.groupby(keys, dropna=False, sort=True).agg(
        draws=("n", "size"), token_accuracy=("token_accuracy", "mean"),
        chance_token_accuracy=("chance_token_accuracy", "mean"), token_drop=("token_drop", "mean"),
        token_drop_min=("token_drop", "min"), token_drop_max=("token_drop", "max"), exact_drop=("exact_drop", "mean"))
    return out.reset_index()
