"""Finding 2's *restriction* test (analysis/findings.py): long-range retrieval is carried by the full-attention
layers, so restricting their receptive field costs a hybrid more than restricting its efficient layers' (the
paper's receptive-field experiment, Qiao et al. 2026, arXiv 2606.15378, Finding 2).

It reads the runs' ``restrict`` records (``hybrid-lightning restrict``, eval/restricted_step_<k>.json; the newest
per run, analysis/diagnostics.py). Per hybrid run that measured both restrictions at one receptive field R (the
smallest such R), the difference in probe score within the training length, efficient layers restricted minus
full layers restricted: positive where restricting the full layers costs more. The unit is the run, pooled over
the hybrids (each architecture's mean in the evidence). p: the runs' differences under random signs (scipy's
one-sample permutation test: exact over every sign up to ``EXACT_LIMIT`` arrangements); interval: one-sample t.
No test where no run has a restriction record; ``not tested`` where none has both restrictions at one R.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as st

from hybrid_lightning.analysis.arms import hybrid
from hybrid_lightning.analysis.diagnostics import diagnostic_rows
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.mechanism import F
from hybrid_lightning.analysis.permutation import EXACT_LIMIT, PERMUTATIONS, SEED
from hybrid_lightning.analysis.stats import Comparison, Test
from hybrid_lightning.analysis.verdict import Verdict


def sign_flip_p(differences: np.ndarray) -> float:
    """Two-sided p of "each difference is as likely negative as positive" (scipy's one-sample permutation test,
    the sign of every difference flipped; exact up to ``EXACT_LIMIT`` arrangements, else ``PERMUTATIONS`` draws)."""
    d = np.asarray(differences, dtype=float)
    resamples = np.inf if 2 ** len(d) <= EXACT_LIMIT else PERMUTATIONS
    return float(st.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=resamples,
                                     rng=np.random.default_rng(SEED)).pvalue)


def paired_rows(runs: Runs) -> pd.DataFrame:
    """Per hybrid run with both restrictions at one receptive field: run, label, R (the smallest such),
    ``efficient`` and ``full`` (the probe score with those layers restricted), ``none`` (unrestricted)."""
    c = runs.configs
    rows = diagnostic_rows(c[hybrid(c)], "restricted").dropna(subset=["score"])
    out = []
    for (run, label), r in rows.groupby(["run", "label"]):
        by = {layers: set(part["receptive_field"].astype(int)) for layers, part in r.groupby("layers")}
        common = sorted(by.get("full", set()) & by.get("efficient", set()))
        if common:
            at = {k: r.loc[(r["layers"] == k) & (r["receptive_field"] == common[0]), "score"].iloc[0]
                  for k in ("full", "efficient")}
            out.append({"run": run, "label": label, "receptive_field": common[0], **at,
                        "none": r.loc[r["layers"].isna(), "score"].max()})
    return pd.DataFrame(out, columns=["run", "label", "receptive_field", "full", "efficient", "none"])


def restriction_tests(runs: Runs) -> list[Test]:
    c = runs.configs
    if diagnostic_rows(c[hybrid(c)], "restricted").empty:
        return []
    pairs = paired_rows(runs)
    if pairs.empty:
        return [Test(F, RESTRICTION.name, verdict="not tested", evidence="no hybrid run measured both the full and "
                     "the efficient layers restricted to one receptive field (hybrid-lightning restrict --layers)")]
    d = (pairs["efficient"] - pairs["full"]).to_numpy(float)
    arms = "; ".join(f"{label}: unrestricted {g['none'].mean():.3f}, efficient layers restricted "
                     f"{g['efficient'].mean():.3f}, full layers restricted {g['full'].mean():.3f} ({len(g)} runs, R "
                     f"{', '.join(map(str, sorted(set(g['receptive_field']))))})"
                     for label, g in pairs.groupby("label"))
    evidence = f"probe score within the training length, seed means per architecture: {arms}"
    what = "score with the efficient layers restricted - with the full layers restricted (runs pooled)"
    return [Test(F, RESTRICTION.name, [Comparison.paired(what, d, sign_flip_p(d), +1)], evidence)]


RESTRICTION = Verdict(F, "restriction (full vs efficient layers)", restriction_tests)
