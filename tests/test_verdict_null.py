"""False "reproduced" under a global null: a design like the CPU replica's (three SWA windows, a Mamba-2
hybrid, a NoPE pair, an FEEE depth control, full attention), every run drawn from one distribution whatever
its architecture, run through ``analyze``'s verdicts many times. Holm's adjustment per finding keeps the
rate at which any test of a finding says ``reproduced`` at or under 5%; measured numbers in
docs/analysis.md ("Verdicts under a global null")."""

import json

import numpy as np
import pytest
from scipy import stats as st

from hybrid_lightning.analysis.findings import findings
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.config import config_to_dict, validate_config
from test_analysis import EVAL_STEPS, ablation_row, fabricate, run_config, tokens_scalars

ARMS = {  # name: run_config arguments
    "w16": {"window": 16}, "w32": {"window": 32}, "w64": {"window": 64}, "m": {"mixer": "mamba2"},
    "w16n": {"window": 16, "pos_full": "nope"}, "f16": {"window": 16, "pattern": "FEEE"}, "full": {"pattern": "F"},
}
FINDINGS = ("1. emergence speed", "2. retrieval heads", "3. NoPE on full layers")


def null_run(run_dir, config, rng, nope):
    """One run of the null: the probe score rises at a random evaluation (or never) to a random plateau; the
    first retrieval head comes at a random scoring (or never); the retrieval heads of the last scoring and
    the harm of masking the top-2 against its same-layer controls are drawn alike for every architecture;
    NoPE's text loss sits at the allowed cost (0.02 nats), the boundary of its null."""
    rise, plateau = rng.integers(0, 5), rng.uniform(0.5, 0.9)
    acc = tuple(float(np.clip(plateau * (i >= rise) + rng.normal(0, 0.03), -0.1, 0.9)) for i in range(4))
    first = rng.integers(0, 5)
    loss = float(rng.normal(2.0, 0.01) + 0.02 * nope)
    fabricate(run_dir, config, "done", {"train/tokens": tokens_scalars(39), "val/text_loss": [(39, loss)]},
              score=acc, beyond_extra=float(rng.normal(-0.2, 0.1)),
              heads=tuple((int(i >= first), 0.5 * (i >= first)) for i in range(4)), packed=True)
    path = run_dir / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
    report = json.loads(path.read_text())
    heads = [(h["layer"], h["head"]) for h in report["heads"]]
    marked = set()
    if first < 4:
        layer = heads[rng.integers(len(heads))][0]
        marked = {(layer, 0), heads[rng.integers(len(heads))]}
        top = [[layer, 0], [layer, 1]]
        report["ablation"] = [ablation_row("top", top, 8, 1.0, 1.0 - rng.uniform(0, 0.5))]
        report["ablation"] += [
            ablation_row("control", [[layer, 2], [layer, 3]], 8, 1.0, 1.0 - rng.uniform(0, 0.5)) | {"draw": d}
            for d in range(4)]
    for h in report["heads"]:
        h["retrieval"] = h["reach_retrieval"] = (h["layer"], h["head"]) in marked
        h["reach_steps"] = 16
    report["selection"] = {"seed": 1,
                           "heads": [{"layer": a, "head": b, "score": 0.9 * ((a, b) in marked)} for a, b in heads]}
    path.write_text(json.dumps(report))


def null_rates(root, seeds, replications, seed=0):
    """Share of replications in which some test of each finding says reproduced."""
    rng, hits = np.random.default_rng(seed), dict.fromkeys(FINDINGS, 0)
    for r in range(replications):
        for name, arm in ARMS.items():
            for s in range(seeds):
                null_run(root / str(r) / f"{name}-s{s}", run_config(s, n_heads=4, **arm), rng,
                         arm.get("pos_full") == "nope")
        table = findings(load_runs(find_runs(root / str(r)), root=root / str(r)))
        for f in FINDINGS:
            hits[f] += bool((table[table["finding"] == f]["verdict"] == "reproduced").any())
    return {f: n / replications for f, n in hits.items()}


def test_null_runs_reach_every_test(tmp_path):
    """One replication: every test the null is for gets a comparison (none is left untested by the design), but
    convergence where an arm has not risen in most seeds by the declared step (3 of 5 rise by then under this
    null): not testable at this budget, as the rule says."""
    rng = np.random.default_rng(1)
    for name, arm in ARMS.items():
        for s in range(5):
            null_run(tmp_path / f"{name}-s{s}", run_config(s, n_heads=4, **arm), rng, arm.get("pos_full") == "nope")
    table = findings(load_runs(find_runs(tmp_path), root=tmp_path)).set_index("test")
    pair = "swa W=16 EEEF pos.full=rope"
    scaling = "scaling (LongPPL laws)"  # no size and budget axes: not applicable
    tested = ["speed (probes)", "emerges in more runs (probes)", "convergence (probes)", scaling, "where", "ablation",
              "laziness", f"beyond: {pair}", f"cost: {pair}"]
    assert list(table.index) == tested, table[["verdict", "reason"]]
    assert table.loc[scaling, "verdict"] == "not applicable"
    untested = table[table["p"].isna()].drop(scaling)
    assert list(untested.index) in ([], ["convergence (probes)"])
    assert (untested["verdict"] == "not testable at this budget").all()


@pytest.mark.slow
@pytest.mark.simulation  # 21-28 min for both on a loaded 2-core machine: apart from the README's test command
@pytest.mark.parametrize("seeds", [3, 5])
def test_false_reproduced_under_the_global_null(tmp_path, seeds):
    """100 replications at 3 and at 5 seeds per arm: each finding says reproduced in at most 5% of them."""
    rates = null_rates(tmp_path, seeds, 100)
    print(f"false reproduced at {seeds} seeds, 100 replications: {rates}")
    assert all(rate <= 0.05 for rate in rates.values()), rates


# The fourth replica's design (ablations/cpu_replica.yaml as of commit a7a90d2): 11 arms of 3 : 1 hybrids, 3-5
# seeds, 4 layers x 4 heads; name:
# (run_config arguments, seeds, a longer budget for the arms added after results)
REPLICA = {"full": ({"pattern": "F"}, 3, False), "swa8": ({"window": 8}, 4, False),
           "swa8n": ({"window": 8, "pos_full": "nope"}, 3, False), "swa32": ({"window": 32}, 5, False),
           "swa128": ({"window": 128}, 4, False), "m": ({"mixer": "mamba2"}, 3, False),
           "gdn": ({"mixer": "gated_deltanet"}, 3, False), "l": ({"mixer": "lightning"}, 3, False),
           "eefe": ({"window": 32, "pattern": "EEFE"}, 3, False), "full6k": ({"pattern": "F"}, 3, True),
           "l6k": ({"mixer": "lightning"}, 3, True)}


def replica_config(seed, arm, longer):
    config = run_config(seed, n_heads=4, **arm)
    if longer:  # another budget: another architecture, as full-6k and lightning-6k are
        plain = {k: v for k, v in config.items() if k != "provenance"}
        config = {**config_to_dict(validate_config({**plain, "train": {**plain["train"], "max_steps": 60}})),
                  "provenance": config["provenance"]}
    return config


def replica_null(root, replications, seed=0):
    """Per test, the replications in which it said reproduced, and in which it said refuted."""
    rng, reproduced, refuted = np.random.default_rng(seed), {}, {}
    for r in range(replications):
        for name, (arm, seeds, longer) in REPLICA.items():
            for s in range(seeds):
                null_run(root / str(r) / f"{name}-s{s}", replica_config(s, arm, longer), rng,
                         arm.get("pos_full") == "nope")
        table = findings(load_runs(find_runs(root / str(r)), root=root / str(r)))
        for test, verdict in zip(table["test"], table["verdict"]):
            reproduced[test] = reproduced.get(test, 0) + (verdict == "reproduced")
            refuted[test] = refuted.get(test, 0) + (verdict == "refuted")
    return reproduced, refuted


@pytest.mark.slow
@pytest.mark.simulation  # about 30 minutes on a loaded 2-core machine
def test_false_verdicts_at_the_replicas_design(tmp_path):
    """100 replications of the global null at the replica's design: each test says reproduced in at most 5% of
    them (its exact 95% interval printed) and refuted in at most 5%."""
    n = 100
    reproduced, refuted = replica_null(tmp_path, n)
    for test in reproduced:
        ci = st.binomtest(reproduced[test], n).proportion_ci(0.95, method="exact")
        print(f"{test}: reproduced {reproduced[test]}/{n} (exact 95% CI {ci.low:.3f}-{ci.high:.3f}), "
              f"refuted {refuted[test]}/{n}")
    assert all(k <= 0.05 * n for k in reproduced.values()) and all(k <= 0.05 * n for k in refuted.values())
