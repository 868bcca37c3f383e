"""Labels of unrelated runs (analysis/load.py): only the keys that differ, abbreviated, bounded and
distinct; and figures whose legends and titles fit inside the saved image (analysis/figures.py)."""

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from hybrid_lightning.analysis import figures
from hybrid_lightning.analysis.load import LABEL_MAX, find_runs, load_runs
from test_analysis import fabricate, run_config, tokens_scalars


def unrelated(root, n=12):
    """``n`` runs that differ in window, position encoding, learning rate, data path and pattern."""
    for i in range(n):
        cfg = run_config(i % 2, window=16 * (1 + i % 3), pos_full=("rope", "nope")[i % 2],
                         pattern=("EEEF", "EF")[i // 6 % 2])
        cfg["train"]["lr"] = (3e-4, 1e-3)[i // 4 % 2]
        cfg["data"]["files"] = [f"/very/long/folder/name/of/the/corpus/number_{i % 4}/train-shard-of-the-corpus.jsonl"]
        fabricate(root / f"run{i}", cfg, "done", {"train/tokens": tokens_scalars(39)},
                  score=(0.1 * i / n, 0.2, 0.3, 0.4 + 0.01 * i))


def test_labels_name_only_what_differs(tmp_path):
    unrelated(tmp_path)
    c = load_runs(find_runs(tmp_path), root=tmp_path).configs.set_index("run")
    assert c.loc["run0", "label"] == "W=16 EEEF pos.full=rope files=number_0 lr=0.0003"
    assert "batch_size" not in c.loc["run0", "label"] and "swa" not in c.loc["run0", "label"]  # the same in every run
    assert c["label"].str.len().max() <= LABEL_MAX
    # one label per architecture, whatever the shortening
    assert c.groupby("arch")["label"].nunique().eq(1).all() and c.groupby("label")["arch"].nunique().eq(1).all()


def test_labels_of_runs_that_differ_in_one_key(tmp_path):
    for w in (16, 64):
        fabricate(tmp_path / f"w{w}", run_config(0, window=w), "done", {"train/tokens": tokens_scalars(39)})
    fabricate(tmp_path / "full", run_config(0, pattern="F"), "done", {"train/tokens": tokens_scalars(39)})
    labels = load_runs(find_runs(tmp_path), root=tmp_path).configs.set_index("run")["label"]
    assert labels.to_dict() == {"w16": "W=16 EEEF", "w64": "W=64 EEEF", "full": "F"}
    same = tmp_path / "same"
    fabricate(same / "a", run_config(0), "done", {"train/tokens": tokens_scalars(39)})
    fabricate(same / "b", run_config(1), "done", {"train/tokens": tokens_scalars(39)})
    # nothing differs: the model
    assert set(load_runs(find_runs(same), root=same).configs["label"]) == {"swa W=16 EEEF"}


def test_long_labels_keep_architectures_apart(tmp_path):
    from hybrid_lightning.analysis.load import _labels

    base = {"model.mixer": "swa", "model.window": 16, "model.pattern": "EEEF", "data.path": "x"}
    identities = [{**base, **{f"model.note_{x}": x * 30 + v for x in "abc"}} for v in ("1", "2")]
    # each value cut to 16 characters, the label to 48: the same text, told apart by a hash
    a, b = _labels(identities, [(["swa"], True)] * 2)
    assert a != b and len(a) <= LABEL_MAX + 6 and a.startswith("note_a=aaaaaaaaaaaaaaa… note_b=") and a[:-6] == b[:-6]


def test_labels_cut_alike_are_told_apart_by_what_differs_between_them():
    from hybrid_lightning.analysis.load import _labels

    def arm(mixer, steps, pos="rope", window=None, match=None, pattern="EEEF"):
        keys = ("model.mixer", "model.window", "model.pattern", "model.pos.full", "model.match_params",
                "train.max_steps")
        return {k: v for k, v in zip(keys, (mixer, window, pattern, pos, match, steps)) if v}

    identities = [arm("lightning", 4000, match="F"), arm("lightning", 6000, match="F"), arm("mamba2", 4000, match="E"),
                  arm("swa", 4000, "nope", 8), arm("swa", 4000, window=8), arm(None, 4000, pattern="F")]
    labels = _labels(identities, [None] * 6)
    # cut at 48 characters, both lightning arms would read "lightning EEEF pos.full=rope match_params=F max…"
    assert labels[:3] == ["lightning EEEF max_steps=4000 pos.full=rope mat…",
                          "lightning EEEF max_steps=6000 pos.full=rope mat…",
                          "mamba2 EEEF pos.full=rope match_params=E max_st…"]
    assert labels[3:] == ["swa EEEF pos.full=nope max_steps=4000", "swa EEEF pos.full=rope max_steps=4000",
                          "F pos.full=rope max_steps=4000"]


@pytest.mark.parametrize("n", [3, 12, 20])
def test_legends_and_titles_fit_in_the_figure(tmp_path, n):
    unrelated(tmp_path, n)
    runs = load_runs(find_runs(tmp_path), root=tmp_path)
    from hybrid_lightning.analysis import tables

    fig = figures.emergence(tables.curves(runs.metrics, "longctx/score"), "score (share)")
    FigureCanvasAgg(fig).draw()
    box = fig.bbox
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent()
    assert box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0 and legend.y1 <= box.y1
    assert legend.x0 >= ax.get_window_extent().x1  # beside the axes, not over the curves
    (title,) = [t for t in fig.findobj(Text) if t.get_text().startswith("Emergence")]
    extent = title.get_window_extent()
    assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1
    figures.save(fig, tmp_path / "e.png")
    assert (tmp_path / "e.png").stat().st_size > 10_000
    long = "x" * 50 + " " + "y" * 60 + " " + "z" * 40
    assert max(len(line) for line in figures.wrap(long).splitlines()) <= figures.TITLE_WIDTH


def test_emergence_draws_the_noise_level_and_tells_coinciding_arms_apart():
    curve = pd.DataFrame([{"label": label, "step": step, "tokens": 1000 * step, "seeds": 2, "mean": 0.01 * step,
                           "min": 0.0, "max": 0.02 * step} for label in ("a", "b") for step in (1, 2, 3)])
    fig = figures.emergence(curve, "score (share)", pd.Series({"a": 0.05, "b": 0.05}), 3.0)
    (ax,) = fig.axes
    a, b = (line for line in ax.get_lines() if line.get_label().startswith(("a ", "b ")))
    assert (a.get_marker(), a.get_linestyle()) != (b.get_marker(), b.get_linestyle())
    assert a.get_markersize() > b.get_markersize()  # the first arm's marker shows around the second's
    (noise,) = [line for line in ax.get_lines() if line.get_label().startswith("noise")]
    assert noise.get_ydata()[0] == 0.05 and noise.get_label() == "noise: 3 null SE of the seed mean"


def test_the_noise_level_is_the_verdicts_error_of_a_seed_mean():
    from hybrid_lightning.analysis import tables
    from hybrid_lightning.analysis.metrics import SCORE_SE

    metrics = pd.DataFrame([{"label": "a", "run": run, "metric": SCORE_SE, "step": step, "value": se}
                            for run, se in (("a0", 0.03), ("a1", 0.04)) for step in (1, 2)])
    assert tables.noise_levels(metrics, 3.0)["a"] == pytest.approx(3 * ((0.03**2 + 0.04**2) / 2 / 2) ** 0.5)


def test_an_empty_head_count_panel_says_none():
    rows = [{"label": "a", "step": s, "tokens": s, "seeds": 1, "mean": 0.0, "min": 0.0, "max": 0.0} for s in (1, 2)]
    c = pd.DataFrame(rows)
    fig = figures.laziness({"heads/retrieval_heads": c, "heads/max_score": c}, 0.1)
    assert fig.axes[0].get_ylim() == (0, 1)
    assert any(t.get_text().startswith("none") for t in fig.axes[0].texts)
