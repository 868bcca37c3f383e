"""The design check (``grid plan --verdicts``, analysis/design.py): floors from the tests' exact null
distributions, Holm's adjustment over a finding's claims, reachability and its reasons, the warnings about
controls that cannot work, power by simulation at a stated effect or at a pilot's, on grids written here and
on the CPU replica's grid with its packed runs as the pilot."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO
from hybrid_lightning.analysis import laziness, power, stats, verdict
from hybrid_lightning.analysis.stats import holm
from hybrid_lightning.cli import main
from test_findings import arm

BASE = {"model": {"pattern": "EEEF", "mixer": "swa"},  # the model of test_analysis.run_config, the pilots' below
        "data": {"files": ["../no-data-yet/train.jsonl"]},  # planned without its data: it need not exist
        "train": {"max_steps": 100, "batch_size": 2, "seq_len": 256, "warmup_steps": 1},
        "eval": {"every_n_steps": 20, "tasks": ["passkey"], "lengths": [512, 1024],
                 "heads": {"every_n_steps": 20, "tasks": ["passkey"], "lengths": [512], "value_tokens": 16}}}


def grid_file(tmp_path, archs, seeds, n_heads=2):
    path = tmp_path / "grid.yaml"
    base = {**BASE, "model": {**BASE["model"], "n_heads": n_heads}}
    path.write_text(yaml.safe_dump({"name": "g", "base": base, "axes": {"seed": list(range(seeds)), "arch": archs}}))
    return path


def check(args, capsys):
    """``grid plan --verdicts --json`` on ``args``: ({test: row}, warnings, effects)."""
    assert main(["grid", "plan", *map(str, args), "--verdicts", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return {r["test"]: r for r in out["tests"]}, "\n".join(out["warnings"]), out["effects"]


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(power, "REPLICATIONS", 100)
    monkeypatch.setattr(power, "MAX_SEEDS", 12)


def test_floors_of_the_exact_null_distributions():
    """Two arms: 2 / C(n + m, n); more: the relabellings that keep the arms apart (equal sizes swap) over all;
    strata: 2 over the product of their placements; beyond 50,000 relabellings the Monte-Carlo floor."""
    assert verdict.two_arms(5, 5) == pytest.approx(2 / 252) and verdict.two_arms(3, 3) == pytest.approx(0.1)
    assert verdict.arms_floor([3, 3, 3]) == pytest.approx(math.factorial(3) / 1680)
    assert verdict.arms_floor([2, 3]) == pytest.approx(0.2)
    assert verdict.arms_floor([5, 5, 5, 5]) == pytest.approx(1 / 20_001)  # 11.7 billion relabellings: Monte Carlo
    assert verdict.stratified_floor([21] * 3) == pytest.approx(2 / 21**3)
    assert verdict.stratified_floor([21] * 5) == pytest.approx(2 / 20_001)
    assert holm([2 / 252, 2 / 252, 1e-4]) == pytest.approx([4 / 252, 4 / 252, 3e-4])


def test_seeds_for_finds_the_fewest_by_bisection():
    assert power.seeds_for(lambda n: float(n >= 7)) == 7
    assert power.seeds_for(lambda n: 0.5) is None
    assert power.seeds_for(lambda n: 1.0) == 1  # a test one seed per arm can pass


def test_power_of_two_normal_arms_matches_the_t_test(quick):
    """1.5 seed SDs apart at 8 seeds per arm: the two-sided t test at 0.05 has power 0.80 (noncentral t);
    the permutation test with the interval rule is within the simulation's error of it."""
    model = power.normal([0.0, 1.5])
    passed = power.passes_means(model.draw(power.rng(), [8, 8]), 0.05, 1)
    assert abs(passed.mean() - 0.80) < 0.12


def test_the_design_check_of_a_grid_whose_data_does_not_exist(tmp_path, capsys, quick):
    """SWA hybrids at W=8 (no windowed head reaches the echo source 22 tokens back) and W=32, a depth control
    with its full layer first, full attention; 2 heads per layer and the top-2 ablated: the check names what
    each test compares, which cannot reach a verdict and why, and warns about each control."""
    archs = {"w8": {"model.window": 8}, "w32": {"model.window": 32},
             "feee": {"model.window": 8, "model.pattern": "FEEE"},
             "full": {"model.pattern": "F"}}
    table, warned, _ = check([grid_file(tmp_path, archs, 5)], capsys)
    assert table["laziness"]["floor"] == pytest.approx(2 / 252) and table["laziness"]["reachable"] == "yes"
    assert table["speed (probes)"]["seeds"] == "5/5" and table["speed (probes)"]["floor"] == pytest.approx(2 / 252)
    assert table["where"]["reachable"] == "no" and "attention type confounded with depth" in table["where"]["why"]
    assert "W=8 FEEE: its only full-attention layer is layer 0" in warned
    assert ("W=8 EEEF: no windowed head can reach a copy source of the head probes "
            "(the nearest lies 22 tokens back" in warned)
    assert "top-K 2 >= 2 heads per layer" in warned and table["ablation: W=32 EEEF"]["reachable"] == "no"
    # Holm over finding 2's claims at their floors: the head-level "where" (W=32's runs, a floor far lower,
    # so first) and the one window pair, which Holm then multiplies by 1
    assert table["laziness"]["holm_floor"] == pytest.approx(2 / 252) and table["where"]["floor"] < 1e-3
    assert 0 < table["laziness"]["power"] < 1 and table["laziness"]["seeds_for_80"] > 5
    assert main(["grid", "plan", str(grid_file(tmp_path, archs, 5)), "--verdicts"]) == 0  # the table, in words
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["finding", "test", "seeds", "reachable"] and "Warnings:" in out


def test_three_seeds_cannot_reach_two_arm_verdicts(tmp_path, capsys, quick):
    """At 3 seeds per arm no two-arm permutation p falls below 0.1: every two-arm test is unreachable, and
    the check says so before anything trains."""
    archs = {"w16": {"model.window": 16}, "w16n": {"model.window": 16, "model.pos.full": "nope"},
             "w64": {"model.window": 64}}
    table, _, _ = check([grid_file(tmp_path, archs, 3, n_heads=4)], capsys)
    for test in ("speed (probes)", "laziness", "beyond: W=16 pos.full=rope", "cost: W=16 pos.full=rope"):
        assert table[test]["floor"] == pytest.approx(0.1) and table[test]["reachable"] == "no (floor)", table[test]
        assert table[test]["power"] == 0
    # 4 heads per layer, the top-2 in one: one distinct same-layer control pair per run, 2 / 2^3 at best
    ablation = table["ablation: W=16 pos.full=rope"]
    assert ablation["reachable"] == "no" and ablation["floor"] == pytest.approx(0.25)
    assert ("leaves 1 distinct same-layer control head set: at 3 seeds the exact p cannot fall below 0.25"
            in ablation["why"])


def test_a_pooled_ablation_is_planned_as_one_claim_when_the_grid_declares_it(tmp_path, capsys, quick):
    """4 seeds of two arms with 4 heads a layer: apart, each arm's ablation cannot fall below 2 / 2^4; declared
    pooled, one claim over the 8 runs with the floor 2 / 2^8, reachable after Holm."""
    archs = {"w16": {"model.window": 16}, "w64": {"model.window": 64}}
    path = grid_file(tmp_path, archs, 4, n_heads=4)
    table = check([path], capsys)[0]
    assert table["ablation: W=16"]["reachable"] == "no" and "ablation: pooled" not in table
    grid = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**grid, "verdicts": {"ablation": {"pooled": True}}}))
    table = check([path], capsys)[0]
    row = table["ablation: pooled"]
    assert row["reachable"] == "yes" and row["floor"] == pytest.approx(2 / 2**8) and row["seeds"] == "4/4"
    assert "one claim over 2 architectures" in row["compares"] and not any(t.startswith("ablation: W") for t in table)


def test_a_head_wise_arm_joins_the_pooled_ablation(tmp_path, capsys, quick):
    """A head-wise arm (``H``) has no full layer but has full-attention heads, so the pooled ablation plans it
    beside the layer-wise arm, as the verdict pools it: 8 runs, the floor 2 / 2^8; apart, it is one claim of its
    own."""
    archs = {"w16": {"model.window": 16}, "headwise": {"model.pattern": "H", "model.window": 16}}
    path = grid_file(tmp_path, archs, 4, n_heads=4)
    assert any(test.startswith("ablation: headwise") for test in check([path], capsys)[0])
    grid = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**grid, "verdicts": {"ablation": {"pooled": True}}}))
    row = check([path], capsys)[0]["ablation: pooled"]
    assert "one claim over 2 architectures" in row["compares"] and row["floor"] == pytest.approx(2 / 2**8)


def test_the_diagnostic_claims_are_planned_on_every_hybrid_run(tmp_path, capsys, quick):
    """Restriction and layer probes are one claim each over the runs of every hybrid arm (sign flips: 2 / 2^runs):
    3 + 3 runs cannot pass Holm in a family of several claims, 5 + 5 can; a grid without hybrids has neither."""
    archs = {"w16": {"model.window": 16}, "w64": {"model.window": 64}}
    for seeds, floor in ((3, 2 / 2**6), (5, 2 / 2**10)):
        table = check([grid_file(tmp_path, archs, seeds)], capsys)[0]
        for test in ("restriction (full vs efficient layers)", "layer probes (full vs efficient layers)"):
            row = table[test]
            assert row["floor"] == pytest.approx(floor) and row["seeds"] == f"{seeds}/{seeds}", row
            assert "one claim over the runs of 2 hybrid architectures" in row["compares"]
            assert row["reachable"] == ("yes" if seeds == 5 else "no (floor)")
    table = check([grid_file(tmp_path, {"full": {"model.pattern": "F"}}, 5)], capsys)[0]
    assert table["restriction (full vs efficient layers)"]["reachable"] == "no"


def test_the_convergence_test_is_planned_under_the_grids_declarations(tmp_path, capsys, quick):
    """A grid declaring the convergence measure and margin: the check plans that test on them, and its default
    effect model spreads the seeds by half the declared margin."""
    archs = {"w16": {"model.window": 16}, "w64": {"model.window": 64}}
    path = grid_file(tmp_path, archs, 5)
    table, _, _ = check([path], capsys)
    assert "equivalence of longctx/score_beyond within ±0.05" in table["convergence (probes)"]["compares"]
    grid = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**grid, "verdicts": {"convergence": {"measure": "loss_gain_beyond",
                                                                         "margin": 0.2}}}))
    row = check([path], capsys)[0]["convergence (probes)"]
    assert "equivalence of longctx/loss_gain_beyond within ±0.2" in row["compares"] and "seeds SD 0.1" in row["effect"]


def scaling_grid(tmp_path, **extra):
    """Three architectures at 3 sizes and 2 budgets, one seed, evaluated at their ends only."""
    base = {**BASE, "eval": {**BASE["eval"], "every_n_steps": 0, "heads": {"every_n_steps": 0, "at_end": False}}}
    axes = {"arch": {"full": {"model.pattern": "F"}, "w16": {"model.window": 16}, "w64": {"model.window": 64}},
            "size": {"s": {"model.d_model": 32}, "m": {"model.d_model": 48}, "l": {"model.d_model": 64}},
            "train.max_steps": [50, 100], "seed": [0]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "base": {**base, "model": {**base["model"], "n_heads": 2}},
                                    "axes": axes, **extra}))
    return path


def test_a_scaling_grid_plans_its_laws_and_no_timing_without_evaluations_before_the_end(tmp_path, capsys, quick):
    """Each pair's scaling claim at the bootstrap's floor (1 / 200), Holm over the 3 pairs reachable; no time of
    emergence to test."""
    table, _, _ = check([scaling_grid(tmp_path)], capsys)
    laws = {t: r for t, r in table.items() if t.startswith("scaling (LongPPL laws): ")}
    assert len(laws) == 3 and {r["seeds"] for r in laws.values()} == {"1/1"}
    for r in laws.values():
        assert r["floor"] == pytest.approx(1 / 200) and r["holm_floor"] == pytest.approx(3 / 200), r
        assert r["reachable"] == "yes" and r["power"] == 1 and r["seeds_for_80"] == 1
    speed = [r for t, r in table.items() if t.startswith("speed (probes)")]
    assert speed and all(r["reachable"] == "no" and "at its end only" in r["why"] for r in speed)
    laziness = [r for t, r in table.items() if t.startswith("laziness")]
    assert laziness and all("eval.heads.every_n_steps 0" in r["why"] for r in laziness)


def test_a_grid_that_declares_its_tests_is_planned_on_those_alone(tmp_path, capsys, quick):
    """``verdicts: {tests: [...]}``: the scaling grid's check lists its laws alone, at the same floors, without the
    warnings about finding 2's controls (2 heads a layer: a top-2 fills one); a name no test has is refused in one
    line naming the key and the tests' names."""
    table, warned, _ = check([scaling_grid(tmp_path)], capsys)
    assert "top-K 2 >= 2 heads per layer" in warned and len(table) > 3
    table, warned, _ = check([scaling_grid(tmp_path, verdicts={"tests": ["scaling (LongPPL laws)"]})], capsys)
    assert all(t.startswith("scaling (LongPPL laws): ") for t in table) and len(table) == 3 and not warned
    assert [r["holm_floor"] for r in table.values()] == pytest.approx([3 / 200] * 3)
    for tests, said in ((["scaling"], "verdicts.tests: 'scaling' is no test's name; the tests: speed (probes), "),
                        (["where", "where"], "verdicts.tests: 'where' is named twice"),
                        ([], "verdicts.tests")):
        path = scaling_grid(tmp_path, verdicts={"tests": tests})
        assert main(["grid", "plan", str(path), "--verdicts"]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_a_pilot_sets_the_effect(tmp_path, capsys, quick):
    """Pilot runs of the NoPE pair: beyond - within 0.3 higher for NoPE with seeds 0.01 apart (power 1 at 5
    seeds), and no difference at all in the text loss beyond the allowed cost (power near 0)."""
    def acc(s):
        return (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path / "pilot", "rope", 4, score=acc, beyond=lambda s: 0.01 * s, loss=lambda s: 2.0 + 0.01 * s)
    arm(tmp_path / "pilot", "nope", 4, pos_full="nope", score=acc, beyond=lambda s: 0.3 + 0.01 * s,
        loss=lambda s: 2.02 + 0.01 * s)
    archs = {"rope": {"model.window": 16}, "nope": {"model.window": 16, "model.pos.full": "nope"}}
    table, _, effects = check([grid_file(tmp_path, archs, 5), "--pilot", tmp_path / "pilot"], capsys)
    beyond, cost = table["beyond: pos.full=rope"], table["cost: pos.full=rope"]
    assert beyond["effect"].startswith("pilot: 4, 4 runs") and beyond["power"] == 1.0 and beyond["seeds"] == "5/5"
    assert cost["power"] < 0.2 and "from the 8 pilot runs" in effects


def test_a_pilot_arm_is_the_same_model_trained_the_same_way_where_the_pilot_has_it():
    from hybrid_lightning.analysis.pilot import pilot_runs

    def arch(mixer, steps, files):
        return json.dumps({"model.mixer": mixer, "model.pattern": "EEEF", "train.max_steps": steps,
                           "data.files": files})

    runs = [("a0", "lightning", 4000), ("a1", "lightning", 4000), ("a2", "lightning", 4000),
            ("b0", "lightning", 6000), ("b1", "lightning", 6000), ("c0", "swa", 6000), ("d0", "mamba2", 2000)]
    configs = pd.DataFrame([(r, arch(m, n, "x")) for r, m, n in runs], columns=["run", "arch"])
    assert pilot_runs(configs, arch("lightning", 4000, "y")) == ["a0", "a1", "a2"]  # its budget; data may differ
    assert pilot_runs(configs, arch("lightning", 6000, "y")) == ["b0", "b1"]
    assert pilot_runs(configs, arch("lightning", 8000, "y")) == ["a0", "a1", "a2", "b0", "b1"]  # no run of that budget
    assert pilot_runs(configs, arch("swa", 4000, "y")) == ["c0"]  # one run: too few, the test keeps the default
    assert (pilot_runs(configs, arch("mamba2", 2000, "y")) == ["d0"]
            and pilot_runs(configs, arch("gdn", 2000, "y")) == [])


def test_a_pilot_folder_without_runs_is_refused(tmp_path, capsys):
    archs = {"w16": {"model.window": 16}, "w64": {"model.window": 64}}
    assert main(["grid", "plan", str(grid_file(tmp_path, archs, 3)), "--verdicts",
                 "--pilot", str(tmp_path / "none")]) == 2
    assert "--pilot: no run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_the_replica_grid_with_its_runs_as_the_pilot(capsys):
    """ablations/cpu_replica.yaml with its own 39 packed runs as the pilot: at their effects speed and both NoPE
    claims have full power, convergence and laziness little (more seeds named), and only the W=8 windows are
    flagged."""
    table, warned, _ = check([REPO / "ablations" / "cpu_replica.yaml",
                              "--pilot", REPO / "analysis" / "results" / "cpu_replica" / "runs"], capsys)
    assert table["speed (probes)"]["power"] > 0.8 and table["speed (probes)"]["effect"].startswith("pilot: 3, 3, 3")
    lazy = table["laziness"]
    assert lazy["seeds"] == "5/5/4" and lazy["holm_floor"] == pytest.approx(2 / 126)
    assert lazy["power"] < 0.5 and lazy["seeds_for_80"] > 5 and lazy["effect"].startswith("pilot: 5, 5, 4 runs")
    assert table["convergence (probes)"]["power"] < 0.5
    for test in ("beyond: swa W=8 EF pos.full=rope", "cost: swa W=8 EF pos.full=rope"):
        assert table[test]["seeds"] == "5/4" and table[test]["power"] > 0.8, table[test]
    assert "no windowed head can reach" in warned and "W=32" not in warned and "layer 0" not in warned
    print(json.dumps(table, indent=1))


@pytest.mark.slow
def test_the_replica_grid_could_reach_every_test_before_it_trained(capsys, quick):
    """ablations/cpu_replica.yaml planned on its pilots (analysis/results/cpu_replica_pilot5/runs, one seed of each
    1 : 1 hybrid), as before its first cell trained: every test declared reachable, its Holm floor below 0.05; the
    ablation pooled into one claim, so its floor is not one architecture's 2 / 2^seeds; the depth control (full
    layers 0 and 2) not flagged: only a hybrid whose one full layer is layer 0 is."""
    table, warned, _ = check([REPO / "ablations" / "cpu_replica.yaml",
                              "--pilot", REPO / "analysis" / "results" / "cpu_replica_pilot5" / "runs"], capsys)
    assert all(row["reachable"] == "yes" and row["holm_floor"] < 0.05 for row in table.values()), table
    assert {"ablation: pooled", "restriction (full vs efficient layers)", "where", "laziness"} <= set(table)
    assert table["beyond: swa W=8 EF pos.full=rope"]["holm_floor"] == pytest.approx(4 / 126)
    assert "layer 0" not in warned and "top-K" not in warned


def simulated_verdict(seeds: list[int], steps, others: list[float]) -> float:
    """Share of the design check's own simulated experiments (the default laziness model, its draws) in which the
    laziness verdict itself says reproduced: its window pairs (``laziness._window_pair``), Holm over them and
    the finding's other claims at their floors (``stats.adjust``), ``_pair_verdict`` and ``_monotone``."""
    arms = laziness._default(["a", "b", "c"], steps).draw(power.rng(), seeds)
    hits = 0
    for r in range(power.REPLICATIONS):
        frames = [pd.DataFrame({"time": t[r], "event": e[r], "scored_until": 1.0}) for t, e in arms]
        pairs = [laziness._window_pair(a, b, 16 * 2**i, 32 * 2**i) for i, (a, b) in enumerate(zip(frames, frames[1:]))]
        stats.adjust(pairs + [stats.Comparison("other", 1.0, (0.5, 1.5), f, 1, (8,)) for f in others])
        hits += laziness._monotone([(c, *laziness._pair_verdict(c)) for c in pairs])[1] == "reproduced"
    return hits / power.REPLICATIONS


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [(4, 5, 4), (5, 5, 5), (8, 8, 8)])
def test_the_planners_laziness_power_is_the_verdicts(tmp_path, capsys, quick, seeds):
    """SWA hybrids at W=16, 32, 64 (4 heads a layer): the design check's laziness power is within 0.1 of the
    laziness verdict itself run on the same simulated experiments, with Holm's step-down over finding 2's
    claims as the verdicts apply it (at 4 + 5 + 4 seeds the ablations, one distinct control pair per run, are
    not testable and leave the family; at 8 seeds they stay, at their floors). Before, the planner took
    alpha / m over every claim: 0.00 against the verdict's 0.12 at the replica's design."""
    archs = {f"w{w}": {"model.window": w} for w in (16, 32, 64)}
    path = grid_file(tmp_path, archs, max(seeds), n_heads=4)
    grid = yaml.safe_load(path.read_text())
    grid["exclude"] = [{"seed": s, "arch": f"w{w}"} for n, w in zip(seeds, (16, 32, 64)) for s in range(n, max(seeds))]
    path.write_text(yaml.safe_dump(grid))
    table, _, _ = check([path], capsys)
    others = [r["floor"] for name, r in table.items() if r["finding"].startswith("2.") and name != "laziness"
              and not r["why"] and r["floor"] is not None]
    expected = simulated_verdict(list(seeds), np.arange(20, 101, 20) / 100, others)
    assert abs(table["laziness"]["power"] - expected) <= 0.1, (table["laziness"], expected)
