"""analysis/diagnostics.py on fabricated records: each run's newest record, seed summaries, and the three figures
(full-attention layers marked, log axes)."""

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from hybrid_lightning.analysis.diagnostics import (
    diagnostic_rows,
    gradient_figure,
    layer_probe_figure,
    restriction_figure,
    seed_summary,
)
from hybrid_lightning.records import row
from hybrid_lightning.rundir.evals import write_eval_record


def fabricate(tmp_path, seed: int, label: str) -> dict:
    run = tmp_path / f"{label}-{seed}"
    for step, scale in ((1, 100.0), (2, 1.0)):  # the newest record (step 2) is read
        restricted = [row("restricted", layers=part, receptive_field=r, step=step, tokens=step, score=scale * s,
                          score_beyond=None, exact=0.0, longppl=10 - s, ppl=20.0, position_loss=[])
                      for part, r, s in ((None, None, 0.5 + seed / 10), ("full", 8, 0.1), ("efficient", 8, 0.45))]
        write_eval_record(run, "restricted", {"step": step, "tokens": step, "restricted": restricted})
    probes = [row("layer_probe", layers=None, receptive_field=None, step=2, tokens=2, layer=i, mixer=kind,
                  feature="residual", accuracy=acc + seed / 100, n_train=8, n_test=2, classes=8)
              for i, (kind, acc) in enumerate((("swa", 0.1), ("full", 0.9), ("swa", 0.9)))]
    write_eval_record(run, "layer_probe", {"step": 2, "tokens": 2, "layer_probe": probes})
    gradient = [row("gradient", layers=None, receptive_field=None, step=2, tokens=2, distance=d,
                    mean_grad_norm=1 / (d + 1) if d < 6 else None, sum_grad_norm=1.0, sample_count=int(d < 6))
                for d in range(8)]
    write_eval_record(run, "gradient", {"step": 2, "tokens": 2, "gradient": gradient})
    return {"run": run.name, "path": str(run), "label": label, "seed": seed}


def test_rows_summaries_and_figures(tmp_path):
    configs = pd.DataFrame([fabricate(tmp_path, s, label) for s in (0, 1) for label in ("swa", "lightning")]
                           + [{"run": "bare", "path": str(tmp_path / "bare"), "label": "x", "seed": 0}])
    restricted = diagnostic_rows(configs, "restricted")
    assert len(restricted) == 12 and set(restricted["step"]) == {2}
    assert restricted["restriction"].tolist()[:3] == ["none", "full:8", "efficient:8"]
    s = seed_summary(restricted[restricted["restriction"] == "none"], ["label"], "score")
    assert s["mean"].tolist() == pytest.approx([0.55, 0.55]) and s["min"].tolist() == pytest.approx([0.5, 0.5])
    assert s["seeds"].tolist() == [2, 2]
    from scipy import stats as st  # the one-sample t interval of two seeds' mean
    values = restricted[(restricted["restriction"] == "none") & (restricted["label"] == "swa")]["score"]
    half = st.t.ppf(0.975, 1) * values.std(ddof=1) / 2 ** 0.5
    assert s["ci_low"].iloc[1] == pytest.approx(values.mean() - half)
    assert s["ci_high"].iloc[1] == pytest.approx(values.mean() + half)
    assert seed_summary(restricted.iloc[:1], ["label"], "score")[["ci_low", "ci_high"]].isna().all(axis=None)
    fig = restriction_figure(restricted)
    assert [ax.get_ylabel() for ax in fig.axes] == ["score", "longppl"]
    probes = diagnostic_rows(configs, "layer_probe")
    ax = layer_probe_figure(probes).axes[0]
    points = [c for c in ax.collections if len(c.get_offsets()) and c.get_offsets().shape[1] == 2
              and not isinstance(c, PolyCollection)]
    filled = [c.get_offsets().tolist() for c in points if c.get_facecolor()[0][:3].tolist() != [1, 1, 1]]
    assert filled == [[[1.0, pytest.approx(0.905)]]] * 2  # each architecture's full layer, filled
    grad = gradient_figure(diagnostic_rows(configs, "gradient")).axes[0]
    assert grad.get_xscale() == grad.get_yscale() == "log" and len(grad.get_lines()) == 2
    assert diagnostic_rows(configs.iloc[-1:], "gradient").empty


def test_the_report_section_draws_what_the_runs_recorded(tmp_path):
    from hybrid_lightning.analysis.diagnostics import report_section

    out = tmp_path / "out"
    out.mkdir()
    configs = pd.DataFrame([fabricate(tmp_path, s, "swa") for s in (0, 1)])
    text = report_section(configs, out, "## 9. Diagnostics")
    assert text.startswith("## 9. Diagnostics") and "![gradient](gradient.png)" in text
    assert {p.name for p in out.iterdir()} == {"restriction.png", "layer_probes.png", "gradient.png",
                                              "diagnostics_restricted.csv", "diagnostics_layer_probe.csv",
                                              "diagnostics_gradient.csv"}
    assert len(pd.read_csv(out / "diagnostics_gradient.csv")) == 16  # 8 distances x 2 seeds
    bare = pd.DataFrame([{"run": "bare", "path": str(tmp_path / "bare"), "label": "x", "seed": 0}])
    assert "No run has a diagnostics record" in report_section(bare, tmp_path / "empty", "## 9. Diagnostics")


def test_the_restriction_verdict_pools_the_hybrids_runs(tmp_path, monkeypatch):
    """Hybrid runs whose probe score falls to 0.1 with the full layers restricted and stays at 0.45 with the
    efficient ones (``fabricate``): with 6 runs reproduced (exact sign-flip p 2/64), effect 0.35; with 3 the floor
    is 0.25; a full-attention model's records are left out; records without both restrictions at one R give
    ``not tested``; runs without records no test."""
    from hybrid_lightning.analysis import registry
    from hybrid_lightning.analysis.diagnostic_verdicts import RESTRICTION
    from hybrid_lightning.analysis.findings import findings
    from hybrid_lightning.analysis.load import Runs

    monkeypatch.setattr(registry, "VERDICTS", [RESTRICTION])
    hybrids = [fabricate(tmp_path, s, label) | {"full_layers": "3", "mixers": label} for s in range(3)
               for label in ("swa", "lightning")]
    full = fabricate(tmp_path, 0, "full") | {"full_layers": "0,1,2,3", "mixers": ""}

    def verdict(configs):
        empty = pd.DataFrame()
        table = findings(Runs(pd.DataFrame(configs), empty, empty, empty, empty, empty, empty))
        return table.set_index("test").loc[RESTRICTION.name] if len(table) else None

    pooled = verdict(hybrids + [full])
    assert pooled["verdict"] == "reproduced" and pooled["p"] == pytest.approx(2 / 64) and pooled["seeds"] == "6"
    assert pooled["effect"] == pytest.approx(0.35) and "swa: unrestricted 0.600" in pooled["evidence"]
    three = verdict(hybrids[:3])
    assert three["verdict"] == "inconclusive" and three["p"] == pytest.approx(0.25)
    one_sided = tmp_path / "one-sided"
    write_eval_record(one_sided, "restricted", {"step": 1, "tokens": 1, "restricted": [
        row("restricted", layers="full", receptive_field=8, step=1, tokens=1, score=0.1, score_beyond=None, exact=0.0,
            longppl=None, ppl=None, position_loss=[])]})
    lone = {"run": "one-sided", "path": str(one_sided), "label": "swa", "seed": 0, "full_layers": "3", "mixers": "swa"}
    assert verdict([lone])["verdict"] == "not tested"
    assert verdict([{**lone, "path": str(tmp_path / "none")}]) is None


def test_the_layer_probes_verdict_compares_the_gain_of_full_and_efficient_layers(tmp_path, monkeypatch):
    """``fabricate``'s residual probes (chance 1/8; SWA 0.1, full 0.9, SWA 0.9 + seed / 100): the full layer gains
    0.8, the SWA layers (0.1 + s/100 - 0.125 + 0) / 2 on average: with 6 hybrid runs reproduced (p 2/64); a
    full-attention model is left out."""
    from hybrid_lightning.analysis import registry
    from hybrid_lightning.analysis.diagnostic_verdicts import LAYER_PROBES
    from hybrid_lightning.analysis.findings import findings
    from hybrid_lightning.analysis.load import Runs

    monkeypatch.setattr(registry, "VERDICTS", [LAYER_PROBES])
    runs = [fabricate(tmp_path, s, label) | {"full_layers": "1", "mixers": label} for s in range(3)
            for label in ("swa", "lightning")]
    runs.append(fabricate(tmp_path, 0, "full") | {"full_layers": "0,1,2", "mixers": ""})
    empty = pd.DataFrame()
    row_ = findings(Runs(pd.DataFrame(runs), empty, empty, empty, empty, empty, empty)).set_index("test").loc[
        LAYER_PROBES.name]
    assert row_["verdict"] == "reproduced" and row_["p"] == pytest.approx(2 / 64) and row_["seeds"] == "6"
    assert row_["effect"] == pytest.approx(0.8 - (0.1 + 0.01 - 0.125) / 2) and "0.800 per full-attention" in row_[
        "evidence"]
