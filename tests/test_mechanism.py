"""Finding 2's *where* and *ablation* verdicts (analysis/mechanism.py) on fabricated runs with known effects,
at 3 and 5 seeds per arm: the layer-level null of "where" compares only layers that could reach a copy
source, within one window; the ablation's controls are same-layer non-retrieval heads of the held-out
selection report, per architecture, and a top-K that fills its layer has none."""

import json
import math

import pytest
from scipy import stats as st

from hybrid_lightning.analysis.findings import findings
from hybrid_lightning.analysis.load import find_runs, load_runs
from test_analysis import EVAL_STEPS, ablation_row
from test_findings import arm, assert_reproduced, assert_verdict, verdicts

LAST = EVAL_STEPS[-1]


def edit_heads(run, retrieval, reach=lambda row: None, ablation=(), selected=None):
    """The run's last heads file: ``retrieval`` (layer, head) marked; ``reach(row)`` its reach_steps (None:
    not recorded), reach_retrieval where it reaches; the ``ablation`` rows; ``selected``: the held-out
    selection report's retrieval heads (score 0.9, others 0)."""
    path = run / "eval" / f"heads_step_{LAST}.json"
    report = json.loads(path.read_text())
    for h in report["heads"]:
        h["retrieval"] = (h["layer"], h["head"]) in retrieval
        steps = reach(h)
        if steps is not None:
            h["reach_steps"], h["reach_retrieval"] = steps, h["retrieval"] and steps > 0
    report["total"]["retrieval_heads"] = len(retrieval)
    report["ablation"] = list(ablation)
    if selected is not None:
        report["selection"] = {"seed": 1, "heads": [{"layer": h["layer"], "head": h["head"],
                                                     "score": 0.9 if (h["layer"], h["head"]) in selected else 0.0}
                                                    for h in report["heads"]]}
    path.write_text(json.dumps(report))


def placed(root, seeds, layers, window=16, reach=lambda row: None):
    """EEEF and FEEE runs, ``seeds`` each, their retrieval heads both heads of layer ``layers[pattern]``."""
    for pattern in ("EEEF", "FEEE"):
        arm(root, pattern, seeds, window=window, pattern=pattern, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
        for s in range(seeds):
            edit_heads(root / f"{pattern}-s{s}", {(layers[pattern], 0), (layers[pattern], 1)}, reach)


@pytest.mark.parametrize("seeds", [3, 5])
def test_where_one_placement_cannot_tell_type_from_depth(tmp_path, seeds):
    """4 layers x 2 heads, layer 3 full in every run, both retrieval heads there: the full layer is always the
    last, so the verdict cannot say "full attention" rather than "last layer"; the pooled count has its exact
    binomial interval over runs."""
    arm(tmp_path, "h", seeds, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
    for s in range(seeds):
        edit_heads(tmp_path / f"h-s{s}", {(3, 0), (3, 1)})
    where = verdicts(tmp_path).loc["where"]
    assert where["effect"] == pytest.approx(0.75) and where["seeds"] == str(seeds)
    assert_verdict(where, "not testable", "attention type confounded with depth")
    ci = st.binomtest(seeds, seeds).proportion_ci(0.95, method="exact")  # runs, not heads, are the unit
    assert f"could reach a copy source: {seeds}/{seeds} = 1.00 (exact 95% CI {ci.low:.2f} to 1.00)" in where["evidence"]
    assert f"layers [3] in {seeds} runs" in where["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("effect", ["strong", "depth", "reversed"])
def test_where_two_placements(tmp_path, seeds, effect):
    """EEEF and FEEE runs at one window, every head reachable. Strong: the retrieval heads in each run's full
    layer (+1 per run). Depth: in layer 3 whatever its kind (0 per run). Reversed: in the layer that is full
    in the other placement (-1 per run)."""
    layer = {"strong": {"EEEF": 3, "FEEE": 0}, "depth": {"EEEF": 3, "FEEE": 3},
             "reversed": {"EEEF": 0, "FEEE": 3}}[effect]
    placed(tmp_path, seeds, layer)
    where = verdicts(tmp_path).loc["where"]
    if effect == "strong":
        assert where["effect"] == pytest.approx(1.0) and "layer-level" in where["compared"]
        assert_reproduced(where, seeds)
    elif effect == "depth":
        assert where["effect"] == pytest.approx(0.0) and "layer-level" in where["compared"]
        assert_verdict(where, "inconclusive")
    else:
        assert where["verdict"] == "refuted" and where["p_holm"] < 0.05


@pytest.mark.parametrize("seeds", [3, 5])
def test_where_layer_level_ignores_layers_that_cannot_reach(tmp_path, seeds):
    """The global null of the layer level: windowed heads that never held a copy source (reach_steps 0, a
    window below the echo's distance) cannot be retrieval heads, so every retrieval head is in a full layer
    by geometry. Counted as share 0, the windowed layers at the full layers' depths would make full
    attention win; left out, no layer can stand beside a full one at the same depth: not testable."""
    placed(tmp_path, seeds, {"EEEF": 3, "FEEE": 0}, window=8, reach=lambda row: 16 if row["mixer"] == "full" else 0)
    where = verdicts(tmp_path).loc["where"]
    assert_verdict(where, "not testable", "attention type confounded with depth")
    assert f"{2 * seeds} of these runs have reachable heads of one kind only" in where["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
def test_where_compares_layers_within_one_window(tmp_path, seeds):
    """EEEF at W=16 and FEEE at W=64: a full layer and a windowed layer of one depth never share a window,
    so the layer level has nothing to compare."""
    for pattern, window, layer in (("EEEF", 16, 3), ("FEEE", 64, 0)):
        arm(tmp_path, pattern, seeds, window=window, pattern=pattern, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
        for s in range(seeds):
            edit_heads(tmp_path / f"{pattern}-s{s}", {(layer, 0), (layer, 1)})
    assert_verdict(verdicts(tmp_path).loc["where"], "not testable", "confounded with depth")


def ablate(root, name, seeds, top_drop, control_drops, n_heads, controls=(("control", lambda d: [[3, 2], [3, 3]]),),
           selected=((3, 0),), window=16):
    """``seeds`` runs of 4 layers x ``n_heads`` heads: the top-2 (3.0, 3.1) masked with drop ``top_drop(s)``,
    and for each kind of ``controls`` (selection, heads of draw d) one draw per entry of ``control_drops``."""
    arm(root, name, seeds, window=window, n_heads=n_heads)
    for s in range(seeds):
        rows = [ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 1.0 - top_drop(s))]
        rows += [ablation_row(selection, heads(d), 8, 1.0, 1.0 - drop) | {"draw": d}
                 for selection, heads in controls for d, drop in enumerate(control_drops)]
        edit_heads(root / f"{name}-s{s}", set(selected), ablation=rows, selected=set(selected))


@pytest.mark.parametrize("seeds", [3, 5])
def test_ablation_top_k_filling_its_layer_is_not_testable(tmp_path, seeds):
    """2 heads per layer: the top-2 is the whole full layer, so the layer-matched draws are that same pair and
    every full-layer head is as harmful as a retrieval head by construction; the only other contrast, 2
    random windowed heads, geometry decides. Not testable, with that reason."""
    ablate(tmp_path, "a", seeds, lambda s: 0.9, (0.9, 0.9, 0.9, 0.9), n_heads=2,
           controls=(("control", lambda d: [[3, 0], [3, 1]]),
                     ("control_nonretrieval", lambda d: [[0, d % 2], [1, d % 2]])))
    row = verdicts(tmp_path).loc["ablation"]
    assert_verdict(row, "not testable", "the top-K fills layer 3 (2 of 2 heads)")


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("effect", ["strong", "any head", "reversed"])
def test_ablation_against_same_layer_non_retrieval_heads(tmp_path, seeds, effect):
    """8 heads per layer, retrieval head 3.0: the top-2 drop 0.9 against 4 distinct pairs of other heads of
    layer 3 with drops 0.1, 0.3, 0.2, 0.2 (strong), 0.9 each (any full-layer head as harmful) or the top-2
    harmless (reversed). p exact over the 5^seeds placements of the top-K among its distinct controls."""
    top = {"strong": 0.9, "any head": 0.9, "reversed": 0.0}[effect]
    drops = (0.9, 0.9, 0.9, 0.9) if effect == "any head" else (0.1, 0.3, 0.2, 0.2)
    ablate(tmp_path, "a", seeds, lambda s: top, drops, n_heads=8,
           controls=(("control", lambda d: [[3, 2 + d], [3, 3 + d]]),))
    row = verdicts(tmp_path).loc["ablation"]
    assert row["seeds"] == str(seeds) and row["compared"].startswith("swa W=16 EEEF: ")  # one architecture, its seeds
    assert row["effect"] == pytest.approx(top - sum(drops) / 4)
    assert "by the held-out selection report" in row["evidence"]
    if effect == "strong":
        assert_reproduced(row, seeds)
        assert row["p"] == pytest.approx(2 / 5 ** seeds)
    elif effect == "reversed":
        assert row["verdict"] == "refuted"
    else:
        assert_verdict(row, "inconclusive")


@pytest.mark.parametrize("seeds", [3, 5])
def test_ablation_counts_only_controls_that_follow_the_rule(tmp_path, seeds):
    """Draws that mask a head of the top-K, a retrieval head of the selection report or a head of another
    layer are not controls, whatever the file calls them; with none left the verdict says so. Two
    architectures are scored apart, each with its own seeds."""
    bad = (("control", lambda d: [[3, 0], [3, 2]]), ("control", lambda d: [[2, 0], [2, 1]]))
    ablate(tmp_path, "a", seeds, lambda s: 0.9, (0.1, 0.1), n_heads=4, controls=bad)
    row = verdicts(tmp_path).loc["ablation"]
    assert_verdict(row, "not testable", "no control draw of non-retrieval heads of the top-K's layers")
    ablate(tmp_path, "b", seeds, lambda s: 0.9, (0.1, 0.3, 0.2, 0.2), n_heads=4, selected=((3, 0), (3, 2)), window=64,
           controls=(("control", lambda d: [[3, 2], [3, 3]]), ("control", lambda d: [[3, 3], [3, 3]])))
    row = verdicts(tmp_path).loc["ablation"]  # 3.2 is a retrieval head of b: one head of layer 3 is left for two
    assert_verdict(row, "not testable", "W=64: the other heads of layer 3 are retrieval heads")


@pytest.mark.parametrize("seeds", [3, 5])
def test_ablation_counts_each_distinct_control_set_once(tmp_path, seeds):
    """4 heads per layer, the top-2 in layer 3: the only same-layer control is the pair 3.2, 3.3, drawn 20
    times with one drop. One control per run, not 20: the exact p is 2 / 2^seeds (0.25 at 3 seeds, 0.0625 at
    5), never below 0.05, and the claim is not testable by design (out of the Holm family)."""
    ablate(tmp_path, "a", seeds, lambda s: 0.9, (0.05,) * 20, n_heads=4)
    row = verdicts(tmp_path).loc["ablation"]
    assert_verdict(row, "not testable", "1/" + "/".join(["1"] * (seeds - 1)) + " distinct same-layer control")
    assert row["p"] == pytest.approx(2 / 2 ** seeds) and row["p"] >= 0.05 and math.isnan(row["p_holm"])
    assert "1 distinct control set in 20 draws" in row["evidence"]


def test_a_declared_pooled_ablation_is_one_claim_over_the_architectures(tmp_path):
    """Two architectures of 4 seeds, 4 heads per layer: one distinct control pair per run, so each claim apart
    cannot fall below 2 / 2^4 = 0.125 (not testable). Declared pooled (``verdicts: {ablation: {pooled: true}}``),
    the 8 runs are one stratified claim: p 2 / 2^8, reproduced; the per-architecture default is unchanged."""
    ablate(tmp_path, "a", 4, lambda s: 0.9, (0.05,) * 20, n_heads=4)
    ablate(tmp_path, "b", 4, lambda s: 0.8, (0.1,) * 20, n_heads=4, window=64)
    runs = load_runs(find_runs(tmp_path), root=tmp_path)
    apart = findings(runs).set_index("test").loc["ablation"]
    assert_verdict(apart, "not testable", "1/1/1/1 distinct same-layer control")
    pooled = findings(runs, {"ablation": {"pooled": True}}).set_index("test").loc["ablation"]
    assert pooled["compared"].startswith("2 architectures pooled: ") and pooled["seeds"] == "8"
    assert pooled["effect"] == pytest.approx((0.85 + 0.7) / 2) and pooled["p"] == pytest.approx(2 / 2 ** 8)
    assert_reproduced(pooled, 8)
