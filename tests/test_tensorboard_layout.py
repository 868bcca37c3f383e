"""What TensorBoard leads with, without a server: the custom-scalars layout whose first page is the headline, the
margin charts of an arm over its seeds, the few default cards (per-task detail in one group, per-layer head cards
only for layers that have scored), heatmaps a card shows readably with their colour bars, and HParams with the
keys that apply to each arm, written as the config writes them."""

import re

import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import TINY
from hybrid_lightning.cli import main
from hybrid_lightning.config import load_config
from hybrid_lightning.eval.report import CARD_PX, heatmap, scalars
from hybrid_lightning.grid.spec import load_grid
from hybrid_lightning.grid.tensorboard import SEEDS_DIR, write_seed_runs
from hybrid_lightning.heads.report import heads_scalars, score_image, scored_layers
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.records import HEADLINE, HEADS_TAGS, LONGCTX_TAGS, TASKS_TAGS, Tag
from hybrid_lightning.rundir.events import read_events
from hybrid_lightning.training.hparams import study_hparams
from hybrid_lightning.training.layout import HEADLINE_PAGE, SEED_STATS, SEEDS_PAGE, run_layout, seeds_layout
from test_grid import write_grid

TASKS = ("passkey", "niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multivalue", "niah_multiquery", "vt")


def long_context_report(tasks=TASKS, lengths=(4096, 8192, 16384, 32768), depths=(0.0, 0.25, 0.5, 0.75, 1.0)) -> dict:
    cell = {"n": 4, "accuracy": 0.5, "answer_tokens": 64, "token_accuracy": 0.6, "answer_loss": 1.0,
            "chance_token_accuracy": 0.1, "chance_loss": 2.0, "generated": 0, "match_all": None, "match_part": None,
            "generated_exact": None, "distance": 1.0, "in_window": None, "step": 500, "tokens": 1}
    records = [{**cell, "task": t, "length": n, "depth": d} for t in tasks for n in lengths for d in depths]
    return {"records": records, "position_loss": [], "longppl": [], "window": None, "seq_len": 4096, "step": 500}


def heads_report(n_layers=4, n_heads=2, scored=(3,)) -> dict:
    layers = [{"layer": i, "mixer": "full", "window": None, "pos": "rope", "applicable": True, "retrieval_heads": 0,
               "copy_heads": 0, "locator_heads": 0, "max_score": 0.5 if i in scored else 0.0, "mean_score": 0.0}
              for i in range(n_layers)]
    heads = [{"layer": i, "head": h, "score": 0.5 if i in scored else 0.0, "role": None} for i in range(n_layers)
             for h in range(n_heads)]
    return {"layers": layers, "heads": heads, "total": {"retrieval_heads": 1}, "accuracy": None, "token_accuracy": None,
            "step": 500}


def test_the_first_page_is_the_headline_and_matches_its_tags_only():
    layout = run_layout()
    assert list(layout) == [HEADLINE_PAGE] and list(layout[HEADLINE_PAGE]) == list(HEADLINE)
    score = layout[HEADLINE_PAGE]["score within the training length"]
    assert score[0] == "Multiline" and [re.match(p, Tag.SCORE) for p in score[1]] != [None]
    assert not any(re.match(p, Tag.SCORE_BEYOND) for p in score[1])  # not the score beyond: anchored
    margins = seeds_layout()[SEEDS_PAGE]
    assert margins["loss: val/loss"] == ["Margin", [f"val/loss{s}" for s in SEED_STATS]]
    cell_tags = {tag for tags in HEADLINE.values() for tag in tags}  # what a cell's own run logs
    assert all(not cell_tags & set(series) for _, series in margins.values())  # no cell is "missing" a margin
    assert list(seeds_layout())[0] == HEADLINE_PAGE


def test_the_probes_default_cards_are_the_headline_and_the_detail_waits_in_its_group():
    tags = scalars(long_context_report())
    headline = [t for t in tags if t.startswith(f"{LONGCTX_TAGS}/")]
    assert Tag.SCORE in headline and Tag.SCORE_BEYOND in headline and len(headline) <= 6, headline
    # per task: lengths, exact, chance, token acc
    assert len([t for t in tags if t.startswith(f"{TASKS_TAGS}/")]) == 7 * (4 + 1 + 2 + 2)


def test_heads_cards_only_for_layers_that_have_scored():
    report = heads_report()
    assert scored_layers(report) == {3}
    tags = heads_scalars(report, scored_layers(report) | {1})
    assert {t.split("/")[1] for t in tags if "/layer_" in t} == {"layer_01", "layer_03"}
    assert f"{HEADS_TAGS}/retrieval_heads" in heads_scalars(report)  # the totals always


@pytest.mark.parametrize("figure, rows", [(lambda: heatmap(long_context_report()), 7),
                                          (lambda: score_image(heads_report(24, 20)), 1)])
def test_heatmaps_fit_a_card_with_readable_labels_and_a_colour_bar(figure, rows):
    fig = figure()
    assert round(fig.get_figwidth() * fig.get_dpi()) == CARD_PX
    assert len(fig.axes) == rows + 1  # the heatmaps and one colour bar
    assert fig.axes[-1].get_ylabel() == "" and fig.axes[-1].get_position().width < 0.2  # the bar, beside them
    for ax in fig.axes[:-1]:
        sizes = [label.get_fontsize() * fig.get_dpi() / 72 for label in (*ax.get_xticklabels(), *ax.get_yticklabels())]
        assert min(sizes) >= 9.5, min(sizes)  # pixels: readable at the card's size


def test_colour_bars_follow_the_cells():
    report = long_context_report(tasks=("passkey",))
    for i, r in enumerate(report["records"]):  # token accuracy under chance: scores -0.12 to -0.08
        r["token_accuracy"] = 0.1 - 0.08 - 0.04 * i / (len(report["records"]) - 1)
    norm = heatmap(report).axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == pytest.approx((-0.12, -0.02))  # the lowest cell, and a span of 0.1 at least
    heads = heads_report(scored=(1, 3))
    heads["heads"][2]["score"] = 0.9
    norm = score_image(heads).axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == pytest.approx((0.0, 0.9))


@pytest.mark.parametrize("overrides, keys, window", [
    (["model.pattern=F"], ["model.pattern", "model.pos.full", "seed"], None),
    (["model.pattern=EEEF", "model.window=16"],
     ["model.pattern", "model.mixer", "model.window", "model.pos.full", "model.pos.efficient", "seed"], "16"),
    (["model.pattern=EEEF", "model.mixer=gated_deltanet"], ["model.pattern", "model.mixer", "model.pos.full", "seed"],
     None),
])
def test_hparams_hold_the_keys_of_each_arm_as_written(overrides, keys, window):
    cfg, plan = plan_run(load_config(None, [*TINY[1::2], "model.n_layers=4", "seed=3", *overrides]))
    values = study_hparams(cfg, plan)
    assert list(values) == keys and values["seed"] == "3" and values.get("model.window") == window


def test_an_arm_with_seeds_becomes_a_run_of_their_mean_and_range(tmp_path, capsys):
    grid = load_grid(write_grid(tmp_path, axes={"model.window": [8, 16], "seed": [0, 1, 2]}), resolve=False)
    by_name = {c.name: c for c in grid.cells}
    for seed, values in enumerate(([0.1, 0.3], [0.2, 0.5], [0.3])):  # seed 2 has logged one step so far
        writer = SummaryWriter(str(by_name[f"window=8,seed={seed}"].run_dir))
        for step, value in zip((10, 20), values):
            writer.add_scalar(Tag.SCORE, value, step)
        writer.close()
    folders = write_seed_runs(grid)
    assert [f.relative_to(grid.root).as_posix() for f in folders] == [f"{SEEDS_DIR}/window=8", f"{SEEDS_DIR}/window=16"]
    acc = read_events(folders[0])
    series = {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert series == {f"{Tag.SCORE}_seed_mean": [(10, 0.2), (20, 0.4)], f"{Tag.SCORE}_seed_min": [(10, 0.1), (20, 0.3)],
                      f"{Tag.SCORE}_seed_max": [(10, 0.3), (20, 0.5)]}
    assert read_events(folders[1]).Tags()["scalars"] == []  # nothing trained: a layout, no scalars
    assert (main(["grid", "tensorboard", str(grid.path)]) == 0
            and len(list(folders[0].glob("events.out.tfevents.*"))) == 1)
    assert "2 arm(s) with several seeds" in capsys.readouterr().out  # written anew, the older files gone
