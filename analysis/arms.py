"""Arms and families of the plan, for the verdicts (analysis/findings.py) and the design check
(analysis/design.py). An *arm* is the runs of one architecture (``label``); a *family* is the hybrids that
differ only in their efficient layers (the efficient mixer, its window, positional encoding, options and
parameter matching), so that comparing them asks what finding 1 asks: does the efficient design set how
fast long-context ability emerges. Full attention, and hybrids whose full layers sit elsewhere (a depth
control) or use another positional encoding, belong to other families."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from hybrid_lightning.kinds import KINDS

# The identity keys that describe the efficient layers (besides their mixer's options section).
EFFICIENT_KEYS = ("model.mixer", "model.window", "model.pos.efficient", "model.match_params",
                  "model.efficient_mlp_hidden")
SECTIONS = tuple(f"model.{k.section}." for k in KINDS.values() if k.section)


@dataclass(frozen=True)
class Family:
    """Hybrids alike but for their efficient layers: ``name`` (what their labels share), ``labels`` (sorted)
    and ``runs`` (label -> its runs, sorted)."""

    name: str
    labels: tuple[str, ...]
    runs: dict[str, list[str]]


def swa_hybrids(c: pd.DataFrame) -> pd.Series:
    """Runs whose plan is a windowed hybrid: full-attention layers beside efficient layers that all attend
    within a window (``RunPlan.windowed_hybrid``), however the pattern spelled them."""
    return c["windowed_hybrid"].astype(bool)


def nope_pairs(c: pd.DataFrame) -> list[dict[str, str]]:
    """SWA-hybrid architectures differing only in ``model.pos.full``, RoPE against NoPE:
    {"rope": label, "nope": label}."""
    hybrids = c[swa_hybrids(c)].drop_duplicates("label").set_index("label")["arch"].map(json.loads)
    groups: dict[str, dict[str, str]] = {}
    for label, identity in hybrids.items():
        if "model.pos.full" in identity:
            rest = json.dumps({k: v for k, v in identity.items() if k != "model.pos.full"}, sort_keys=True, default=str)
            groups.setdefault(rest, {})[identity["model.pos.full"]] = label
    return [p for p in groups.values() if {"rope", "nope"} <= p.keys()]


def hybrid(configs: pd.DataFrame) -> pd.Series:
    """Runs whose plan has full-attention layers beside efficient ones."""
    return configs["full_layers"].astype(str).ne("") & configs["mixers"].astype(str).ne("")


def rest_of(arch: str) -> str:
    """The identity without what describes the efficient layers, as JSON."""
    identity = json.loads(arch)
    kept = {k: v for k, v in identity.items() if k not in EFFICIENT_KEYS and not k.startswith(SECTIONS)}
    return json.dumps(kept, sort_keys=True, default=str)


def families(configs: pd.DataFrame) -> list[Family]:
    """The families of two architectures or more among the hybrid runs of ``configs``, ordered by name."""
    c = configs[hybrid(configs)]
    out = []
    for _, g in c.groupby(c["arch"].map(rest_of), sort=False):
        labels = tuple(sorted(g["label"].unique()))
        if len(labels) >= 2:
            runs = {label: sorted(g.loc[g["label"] == label, "run"]) for label in labels}
            out.append(Family(_shared(labels), labels, runs))
    return sorted(out, key=lambda f: f.name)


def _shared(labels: tuple[str, ...]) -> str:
    """The words every label has (``EEEF pos.full=rope``), else ``hybrids``."""
    words = [w for w in labels[0].split() if all(w in label.split() for label in labels[1:])]
    return " ".join(words) or "hybrids"
