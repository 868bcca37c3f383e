"""Effect models for the design check (analysis/design.py): the stated defaults, or the effect and variance of
pilot runs (``grid plan --verdicts --pilot RUNS``), each arm's per-run values resampled (analysis/power.py).

A grid's arm is matched to the pilot runs of the same model trained the same way (``model_key`` with the
training keys: the budget and schedule) where the pilot has two or more, else to those of the same model
(``model_key``: the model keys of the architecture; data, tokenizer and budget may differ). The values
resampled are those the verdicts read, in the pilot's own units: speed, each run's restricted time to
emergence as a share of the pilot's tau; convergence, the scores at the pilot's declared mid and end
evaluations (each step resampled on its own); laziness, the first step with a retrieval head for good as a
share of the run's last scoring, censored where none came; NoPE, beyond - within and ``val/text_loss`` at
each run's last evaluation. A test whose arms the pilot lacks
(or has one run of) keeps the default effect, and its effect column says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis import tables
from hybrid_lightning.analysis.emergence import EQUIVALENCE_MARGIN, SIGNAL_Z, declared_steps, event_times
from hybrid_lightning.analysis.findings import LOSS_COST, SCORE, SCORE_BEYOND, SCORE_SE, TEXT_LOSS
from hybrid_lightning.analysis.load import Runs

DEFAULT_EFFECT = 1.5  # seed standard deviations
Models = Callable[[str, list[str], np.ndarray | None], tuple[str, pw.Simulate]]


def model_key(arch: str, train: bool = False) -> str:
    """An architecture by its model keys only (with ``train``, its training keys too): pilot runs and grid
    cells may differ in data, tokenizer (the vocabulary size) and budget."""
    kept = ("model.", "train.") if train else ("model.",)
    return json.dumps({k: v for k, v in json.loads(arch).items() if k.startswith(kept) and k != "model.vocab_size"},
                      sort_keys=True, default=str)


def simulator(test: str, draw: Callable, k: int) -> pw.Simulate:
    """Power of ``test``'s verdict rule on experiments from ``draw`` (``draw(rng, sizes)``: the arms, or for
    convergence the (mid, end) arms)."""
    def simulate(sizes: list[int], alpha: float) -> float:
        rng = pw.rng()
        arms = draw(rng, sizes)
        if test == "speed":
            return float(pw.passes_means([a[0] if isinstance(a, tuple) else a for a in arms], rng, alpha, 0).mean())
        if test == "laziness":
            pairs = [pw.logrank_passes(a, b, rng, alpha) for a, b in zip(arms, arms[1:])]
            return float((np.all([later for _, later in pairs], axis=0) & np.any([p for p, _ in pairs], axis=0)).mean())
        if test == "convergence":
            mid, end = arms
            gap = pw.passes_means(mid, rng, alpha, 0)
            equal = np.all([pw.equivalent(a, b, EQUIVALENCE_MARGIN, alpha) for i, a in enumerate(end) for b in end[i + 1:]], axis=0)
            return float((gap & equal).mean())
        return float(pw.passes_means(arms, rng, alpha, {"beyond": 1, "cost": -1}[test]).mean())
    return simulate


def default_models(test: str, labels: list[str], steps: np.ndarray | None) -> tuple[str, pw.Simulate]:
    """The stated default effect of each test (analysis/design.py's docstring)."""
    k, d = len(labels), DEFAULT_EFFECT
    if test in ("speed", "laziness"):
        shifts = [0.0] * (k - 1) + [d] if test == "speed" else [i * d for i in range(k)]
        model = pw.censored(shifts, steps)
    elif test == "convergence":
        gap, end = pw.normal([0.0] * (k - 1) + [d]), pw.normal([0.0] * k)
        spread = EQUIVALENCE_MARGIN / 2
        model = pw.Model(f"gap {d:g} seed SDs at mid; arms equal at the end, seeds SD {spread:g}",
                         lambda rng, s: (gap.draw(rng, s), [a * spread for a in end.draw(rng, s)]))
    else:
        model = pw.normal([0.0, d if test == "beyond" else -d])
    return model.text, simulator(test, model.draw, k)


def pilot_models(pilot: Runs, configs: pd.DataFrame) -> Models:
    """Models from ``pilot`` for the arms of ``configs`` (the grid's planned configs); the default elsewhere."""
    runs_of = {label: pilot_runs(pilot.configs, arch)
               for label, arch in configs.drop_duplicates("label")[["label", "arch"]].itertuples(index=False)}

    def models(test: str, labels: list[str], steps: np.ndarray | None) -> tuple[str, pw.Simulate]:
        runs = [runs_of[label] for label in labels]
        samples = _samples(pilot, test, runs) if all(len(r) >= 2 for r in runs) else None
        if samples is None:
            text, simulate = default_models(test, labels, steps)
            return f"{text} (the pilot has not two runs of each arm)", simulate
        if test == "convergence":
            mid, end = (pw.resampled([s[i] for s in samples], "") for i in (0, 1))
            return (f"pilot: {', '.join(str(len(r)) for r in runs)} runs resampled",
                    simulator(test, lambda rng, s: (mid.draw(rng, s), end.draw(rng, s)), len(labels)))
        model = pw.resampled(samples, f"pilot: {', '.join(str(len(r)) for r in runs)} runs resampled")
        return model.text, simulator(test, model.draw, len(labels))

    return models


def pilot_runs(configs: pd.DataFrame, arch: str) -> list[str]:
    """The pilot runs (``configs``: theirs, with ``run`` and ``arch``) that stand for the grid's arm ``arch``:
    those of its model and training keys where two or more, else those of its model."""
    def matching(train: bool) -> list[str]:
        key = model_key(arch, train)
        return sorted(configs.loc[configs["arch"].map(lambda a: model_key(a, train) == key), "run"])

    same_training = matching(True)
    return same_training if len(same_training) >= 2 else matching(False)


def _samples(pilot: Runs, test: str, runs: list[list[str]]) -> list | None:
    """Per arm, the pilot's values ``test`` reads (see the module); None where a run lacks them."""
    m = pilot.metrics
    if test in ("beyond", "cost"):
        final = {tag: tables.final_values(m, tag).set_index("run")["value"] for tag in (SCORE, SCORE_BEYOND, TEXT_LOSS)}
        if test == "beyond":
            values = [(final[SCORE_BEYOND].reindex(r) - final[SCORE].reindex(r)).to_numpy() for r in runs]
        else:
            values = [final[TEXT_LOSS].reindex(r).to_numpy() - LOSS_COST * (i == 1) for i, r in enumerate(runs)]
        return None if any(np.isnan(v).any() for v in values) else values
    if test == "laziness":
        first = tables.first_heads(m[m["run"].isin(sum(runs, []))], pilot.configs).set_index("run")
        if any(not set(r) <= set(first.index) for r in runs):
            return None
        return [((first.loc[r, "first_step"].fillna(first.loc[r, "scored_until"]) / first.loc[r, "scored_until"]).to_numpy(),
                 first.loc[r, "first_step"].notna().to_numpy()) for r in runs]
    d = m[(m["metric"] == SCORE) & m["run"].isin(sum(runs, []))]
    values = d.pivot_table(index="run", columns="step", values="value")
    if test == "speed":
        errors = m[m["metric"] == SCORE_SE].sort_values("step").groupby("run")["value"].last()
        level = SIGNAL_Z * errors.where(errors > 0).reindex(values.index)
        time, _, tau = event_times(values, d.pivot_table(index="run", columns="step", values="tokens"), level)
        times = [(time.reindex(r) / tau).to_numpy() for r in runs]
        return None if any(np.isnan(t).any() for t in times) else times
    common = values.dropna(axis=1)
    steps = declared_steps(list(common.columns)) if common.shape[1] else None
    if steps is None:
        return None
    return [(common.loc[r, steps[0]].to_numpy(), common.loc[r, steps[2]].to_numpy()) for r in runs]
