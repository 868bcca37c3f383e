"""Effect models for the design check (analysis/design.py): the stated defaults, or the effect and variance of
pilot runs (``grid plan --verdicts --pilot RUNS``), each arm's per-run values resampled (analysis/power.py).
What a verdict's model is, what it reads from a pilot and how it passes are the verdict's own
(``verdict.Verdict``: ``default``, ``samples``, ``resample``, ``passes``).

A grid's arm is matched to the pilot runs of the same model trained the same way (its model and training keys,
``config.roles.part_of``) where the pilot has two or more, else to those of the same model (its model keys;
data, tokenizer and budget may differ). The values resampled are those the verdicts read, in the pilot's own
units (the verdicts' ``samples`` say which). A test whose arms the pilot lacks (or has one run of) keeps the
default effect, and its effect column says so.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.verdict import Models, Verdict
from hybrid_lightning.config.roles import part_of, set_by_data


def model_key(arch: str, train: bool = False) -> str:
    """An architecture by its model keys only (with ``train``, its training keys too): pilot runs and grid
    cells may differ in data, tokenizer (the vocabulary size) and budget."""
    kept = ("model", "train") if train else ("model",)
    return json.dumps({k: v for k, v in json.loads(arch).items() if part_of(k) in kept and not set_by_data(k)},
                      sort_keys=True, default=str)


def simulator(verdict: Verdict, draw: pw.Draw) -> pw.Simulate:
    """Power of ``verdict``'s rule (``passes``) on experiments from ``draw``."""
    return lambda sizes, alpha: float(verdict.passes(draw(pw.rng(), sizes), alpha).mean())


def default_models(verdict: Verdict, labels: list[str], steps: np.ndarray | None) -> tuple[str, pw.Simulate]:
    """The stated default effect of ``verdict`` (its ``default``; analysis/design.py's docstring)."""
    model = verdict.default(labels, steps)
    return model.text, simulator(verdict, model.draw)


def pilot_models(pilot: Runs, configs: pd.DataFrame) -> Models:
    """Models from ``pilot`` for the arms of ``configs`` (the grid's planned configs); the default elsewhere."""
    runs_of = {label: pilot_runs(pilot.configs, arch)
               for label, arch in configs.drop_duplicates("label")[["label", "arch"]].itertuples(index=False)}

    def models(verdict: Verdict, labels: list[str], steps: np.ndarray | None) -> tuple[str, pw.Simulate]:
        runs = [runs_of[label] for label in labels]
        samples = verdict.samples(pilot, runs) if verdict.samples and all(len(r) >= 2 for r in runs) else None
        if samples is None:
            text, simulate = default_models(verdict, labels, steps)
            return f"{text} (the pilot has not two runs of each arm)", simulate
        model = verdict.resample(samples, f"pilot: {', '.join(str(len(r)) for r in runs)} runs resampled")
        return model.text, simulator(verdict, model.draw)

    return models


def pilot_runs(configs: pd.DataFrame, arch: str) -> list[str]:
    """The pilot runs (``configs``: theirs, with ``run`` and ``arch``) that stand for the grid's arm ``arch``:
    those of its model and training keys where two or more, else those of its model."""
    def matching(train: bool) -> list[str]:
        key = model_key(arch, train)
        return sorted(configs.loc[configs["arch"].map(lambda a: model_key(a, train) == key), "run"])

    same_training = matching(True)
    return same_training if len(same_training) >= 2 else matching(False)
