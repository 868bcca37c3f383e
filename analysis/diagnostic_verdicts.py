"""Finding 2's tests on the paper's diagnostics records (analysis/findings.py; the records: analysis/diagnostics.py,
the newest per run), after Qiao et al. 2026 (arXiv 2606.15378, Finding 2): long-range retrieval is carried by the
full-attention layers.

- *Restriction* (``hybrid-lightning restrict``): per hybrid run that measured both the full-attention and the
  efficient layers restricted to one receptive field R (the smallest such R), the probe score within the training
  length with the efficient layers restricted minus with the full layers restricted: positive where restricting
  the full layers costs more (the paper's receptive-field experiment).
- *Layer probes* (``hybrid-lightning probe-layers``, unrestricted, the residual stream): a layer's gain is its
  held-out accuracy minus the layer's before it (before the first layer: chance, 1 / classes); per hybrid run, the
  mean gain of its full-attention layers minus that of its efficient layers: positive where the needle's value
  becomes decodable at the full layers (the paper: nearly all incremental long-range accuracy sits there).

Each is one claim with the run as the unit, pooled over the hybrids (each architecture's means in the evidence):
p from the runs' differences under random signs (``stats.sign_flip_p``: exact, 2 / 2^n at best, so 6 runs or more
can pass), interval one-sample t. No test where no hybrid run has the records; ``not tested`` where none has what
the difference needs. The design check plans each on every hybrid run of the grid (the records come from commands
run after training, on each of them, as the CPU replica's script does): floor 2 / 2^runs, power at complete
separation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from hybrid_lightning.analysis.arms import hybrid
from hybrid_lightning.analysis.diagnostics import diagnostic_rows
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.mechanism import F
from hybrid_lightning.analysis.stats import Comparison, Test, sign_flip_p
from hybrid_lightning.analysis.verdict import Design, Planned, Verdict, complete, stratified_floor
from hybrid_lightning.kinds import FULL


def restricted_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run of ``restricted`` rows with both restrictions at one receptive field: run, label, R (the smallest
    such), ``efficient`` and ``full`` (the probe score with those layers restricted), ``none`` (unrestricted), and
    ``d``, efficient minus full."""
    out = []
    for (run, label), r in rows.dropna(subset=["score"]).groupby(["run", "label"]):
        by = {layers: set(part["receptive_field"].astype(int)) for layers, part in r.groupby("layers")}
        common = sorted(by.get("full", set()) & by.get("efficient", set()))
        if common:
            at = {k: r.loc[(r["layers"] == k) & (r["receptive_field"] == common[0]), "score"].iloc[0]
                  for k in ("full", "efficient")}
            out.append({"run": run, "label": label, "receptive_field": common[0], **at,
                        "none": r.loc[r["layers"].isna(), "score"].max(), "d": at["efficient"] - at["full"]})
    return pd.DataFrame(out, columns=["run", "label", "receptive_field", "full", "efficient", "none", "d"])


def layer_gains(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run of ``layer_probe`` rows with an unrestricted residual probe of full and efficient layers: run,
    label, ``full`` and ``efficient`` (the mean accuracy gain of its layers of that kind), and ``d``, full minus
    efficient."""
    rows = rows[(rows["feature"] == "residual") & (rows["restriction"] == "none")]
    out = []
    for (run, label), r in rows.groupby(["run", "label"]):
        r = r.sort_values("layer")
        gain = np.diff(np.concatenate([[1 / r["classes"].iloc[0]], r["accuracy"].to_numpy(float)]))
        full = (r["mixer"] == FULL).to_numpy()
        if full.any() and not full.all():
            out.append({"run": run, "label": label, "full": gain[full].mean(), "efficient": gain[~full].mean(),
                        "d": gain[full].mean() - gain[~full].mean()})
    return pd.DataFrame(out, columns=["run", "label", "full", "efficient", "d"])


def _pooled(runs: Runs, verdict: Verdict, kind: str, per_run: Callable[[pd.DataFrame], pd.DataFrame], what: str,
            missing: str, describe: Callable[[str, pd.DataFrame], str], measure: str) -> list[Test]:
    """``verdict``'s one claim on the hybrid runs' ``kind`` records: ``per_run`` their rows to one row per run with
    ``d``; the evidence ``measure`` and ``describe(label, its runs)`` per architecture."""
    c = runs.configs
    rows = diagnostic_rows(c[hybrid(c)], kind)
    if rows.empty:
        return []
    table = per_run(rows)
    if table.empty:
        return [Test(F, verdict.name, verdict="not tested", evidence=missing)]
    d = table["d"].to_numpy(float)
    evidence = f"{measure}, seed means: " + "; ".join(f"{label}: {describe(label, g)}"
                                                      for label, g in table.groupby("label"))
    return [Test(F, verdict.name, [Comparison.paired(what, d, sign_flip_p(d), +1)], evidence)]


def restriction_tests(runs: Runs) -> list[Test]:
    return _pooled(runs, RESTRICTION, "restricted", restricted_pairs,
                   "score with the efficient layers restricted - with the full layers restricted (runs pooled)",
                   "no hybrid run measured both the full and the efficient layers restricted to one receptive field "
                   "(hybrid-lightning restrict --layers)",
                   lambda label, g: (f"unrestricted {g['none'].mean():.3f}, efficient layers restricted "
                                     f"{g['efficient'].mean():.3f}, full layers restricted {g['full'].mean():.3f} "
                                     f"({len(g)} runs, R {', '.join(map(str, sorted(set(g['receptive_field']))))})"),
                   "probe score within the training length")


def layer_probe_tests(runs: Runs) -> list[Test]:
    return _pooled(runs, LAYER_PROBES, "layer_probe", layer_gains,
                   "mean accuracy gain of the full-attention layers - of the efficient layers (runs pooled)",
                   "no hybrid run has an unrestricted residual probe of its layers (hybrid-lightning probe-layers)",
                   lambda label, g: (f"{g['full'].mean():.3f} per full-attention layer, {g['efficient'].mean():.3f} "
                                     f"per efficient layer ({len(g)} runs)"),
                   "accuracy gained by a layer's residual stream over the layer before")


def _planned(d: Design, name: str, command: str) -> list[Planned]:
    """The design check of the pooled claim ``name`` on the records ``command`` makes on every hybrid run after
    training."""
    labels = sorted(set(d.configs.loc[hybrid(d.configs), "label"]))

    def floor(s: list[int]) -> list[float]:
        return [stratified_floor([2] * sum(s))]  # each run's difference under its two signs

    return [Planned(F, name, f"full vs efficient layers, one claim over the runs of {len(labels)} hybrid "
                    f"architectures (`{command}` on each after training)", labels, d.seeds(labels), floor,
                    complete(floor), "complete separation", why="" if labels else "no hybrid architecture")]


RESTRICTION = Verdict(F, "restriction (full vs efficient layers)", restriction_tests,
                      lambda d, _: _planned(d, RESTRICTION.name, "hybrid-lightning restrict"))
LAYER_PROBES = Verdict(F, "layer probes (full vs efficient layers)", layer_probe_tests,
                       lambda d, _: _planned(d, LAYER_PROBES.name, "hybrid-lightning probe-layers"))
