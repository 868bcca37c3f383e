"""Head tests the setup cannot force: echo probes put a copy source inside a small window, so an SWA
head can score; heads to ablate are chosen on held-out probes; the top K is tested against random
draws of non-retrieval heads from its own layers with a permutation p; every head can be masked alone."""

import pytest
import torch

from hybrid_lightning.heads.ablation import ablations, harm, layer_matched_draws, permutation_p, selection_seed
from hybrid_lightning.heads.retrieval import RetrievalHeads, answer_targets, reachable
from hybrid_lightning.probes.near import ECHO_CUE, make_probe
from test_heads import COPY_HEAD, HELD_OUT, TOK, copier, eval_config, head

WINDOW = 32  # the smallest SWA window of the studies, and the copier's


def targets(s):
    """Rows of answer steps and their copy sources, as heads/retrieval.py computes them (queries = answer rows)."""
    qlo, n = len(s.prompt) - 1, len(s.prompt) + len(s.answer) - 1
    valid, source, _, _ = answer_targets(s, qlo, len(s.answer), n)
    return torch.from_numpy(valid)[None], torch.from_numpy(source)[None]


@pytest.mark.parametrize("task", ["passkey", "niah_single_1", "niah_multivalue"])
def test_echo_probes_have_sources_inside_the_window_and_plain_ones_outside(task):
    cfg = eval_config({"tasks": [task], "lengths": [1200], "echo": True})
    rh = RetrievalHeads(cfg, TOK, HELD_OUT)
    assert {spec[4] for spec in rh.specs} == {False, True}
    for spec in rh.specs:
        s = make_probe(spec, rh.ctx, cfg.seed)
        assert len(s.prompt) + len(s.answer) == 1200
        valid, source = targets(s)
        inside = reachable(valid, source, WINDOW)
        if spec[4]:  # the answer stated again just before the cue
            echo = s.needle_spans[-1]
            assert (s.prompt[echo[0] : echo[1]] == s.answer).all()
            assert TOK.decode(s.prompt[echo[1] :]) == ECHO_CUE
            reach = len(s.answer) + len(TOK.encode(ECHO_CUE))  # the echo of answer token j is reach - 1 back
            assert reachable(valid, source, reach).sum() == valid.sum() > 0
            assert not reachable(valid, source, reach - 1).any()  # the needle is much further back
            assert inside.all() == (task != "niah_multivalue")  # 4 values: too long an answer for 32
        else:
            assert not inside.any()
        assert reachable(valid, source, None).sum() == valid.sum()  # full attention reaches every source


def test_an_swa_head_copying_from_inside_its_window_scores():
    cfg = eval_config({"tasks": ["passkey"], "echo": True})
    echo = make_probe(("passkey", 600, 0.5, 0, True), RetrievalHeads(cfg, TOK, HELD_OUT).ctx, cfg.seed)
    distance = len(echo.answer) + len(TOK.encode(ECHO_CUE)) - 1  # from the answer rows back to the echo
    assert distance < WINDOW
    report = RetrievalHeads(cfg, TOK, HELD_OUT).run(copier(distance), step=0, tokens=0)
    assert report["samples"] == 2  # the plain probe and its echo
    swa, full = head(report, 1, COPY_HEAD), head(report, 2, COPY_HEAD)
    steps = len(echo.answer)
    # the SWA head reaches a source only in the echo probe, and there it copies every token
    assert swa["mixer"] == "swa" and swa["answer_steps"] == 2 * steps and swa["reach_steps"] == steps
    assert swa["reach_score"] == 1.0 and swa["reach_retrieval"] and swa["score"] == 0.5
    # the full head attending as far back reaches every source but copies only from the echo
    assert full["reach_steps"] == 2 * steps and full["reach_score"] == 0.5
    others = [r for r in report["heads"] if r["head"] != COPY_HEAD]
    assert all(r["reach_score"] in (0.0, None) for r in others)
    assert all(r["reach_steps"] == steps for r in report["heads"] if r["layer"] == 1)  # reach is the window's
    assert report["layers"][1]["reaching_heads"] == 4 and report["layers"][1]["reach_retrieval_heads"] == 1
    assert report["total"]["reach_retrieval_heads"] == 2


def test_heads_are_chosen_on_the_held_out_probes_and_tested_on_the_evaluation_probes():
    cfg = eval_config({"tasks": ["niah_single_2"]}, tasks=["niah_single_2"])
    assert selection_seed(cfg) == cfg.seed + 1
    held_out_cfg = cfg.model_copy(update={"seed": selection_seed(cfg)})
    ctx = RetrievalHeads(cfg, TOK, HELD_OUT).ctx
    distance = make_probe(("niah_single_2", 600, 0.5, 0, False), ctx, held_out_cfg.seed).distance()
    assert distance != make_probe(("niah_single_2", 600, 0.5, 0, False), ctx, cfg.seed).distance()
    model = copier(distance)  # copies the held-out probe's needle only
    scored = RetrievalHeads(cfg, TOK, HELD_OUT).run(model, step=0, tokens=0)
    held_out = RetrievalHeads(held_out_cfg, TOK, HELD_OUT).run(model, step=0, tokens=0)
    assert head(scored, 2, COPY_HEAD)["score"] == 0.0 and head(held_out, 2, COPY_HEAD)["score"] == 1.0

    out = ablations(model, cfg, TOK, HELD_OUT, scored, selection="top", k=1, each=True, step=0, tokens=0, window=WINDOW)
    assert out["selection"] == {"seed": 1, "heads": [{"layer": r["layer"], "head": r["head"], "score": r["score"]}
                                                     for r in held_out["heads"]]}
    (top,) = [r for r in out["ablation"] if r["selection"] == "top"]
    assert top["masked"] == [[2, COPY_HEAD]]  # chosen by the held-out scores, not by the evaluation probes'
    # every head alone: one row per attention head, each masking that head only
    single = [r for r in out["ablation"] if r["selection"] == "single"]
    assert [tuple(r["masked"][0]) for r in single] == [(r["layer"], r["head"]) for r in scored["heads"]]

    # with the selection seed set to the evaluation seed, the evaluation probes choose: every head scores 0
    # there, so no top 1 exists and the ablation is refused rather than masking an arbitrary head
    same = cfg.model_copy(update={"heads": cfg.heads.model_copy(update={"selection_seed": cfg.seed})})
    with pytest.raises(ValueError, match="tie at score 0"):
        ablations(model, same, TOK, HELD_OUT, scored, selection="top", k=1, step=0, tokens=0, window=WINDOW)


def test_permutation_p_counts_draws_at_least_as_harmful_and_the_observation():
    assert permutation_p(0.5, [0.1, 0.5, 0.7, 0.2]) == 3 / 5
    assert permutation_p(0.9, [0.0] * 19) == 1 / 20  # the smallest p 19 draws can give
    assert permutation_p(0.0, [0.0] * 20) == 1.0
    rows = [{"n": 1, "token_accuracy": 1.0, "masked_token_accuracy": 0.5},
            {"n": 3, "token_accuracy": 0.5, "masked_token_accuracy": 0.5}]
    assert harm(rows) == 0.125


def test_layer_matched_draws_only_draw_non_retrieval_heads_of_the_top_k_layers():
    """Controls come from the top K's layers, as many per layer as it has there, never a head of the top K
    or a retrieval head of the report that chose it; a layer the top K fills has no control at all."""
    report = {"heads": [{"layer": layer, "head": h, "retrieval": (layer, h) == (1, 0)}
                        for layer in range(4) for h in range(4)]}
    top = [(3, 0), (3, 2), (1, 1)]
    draws = layer_matched_draws(report, top, 200, seed=7)
    assert len(draws) == 200 and draws == layer_matched_draws(report, top, 200, seed=7)
    for d in draws:
        assert sorted(layer for layer, _ in d) == [1, 3, 3] and len(set(d)) == 3 and not set(d) & set(top)
    drawn = {h for d in draws for h in d}
    assert drawn == {(1, 2), (1, 3), (3, 1), (3, 3)}  # the retrieval head (1, 0) and the top K never
    assert layer_matched_draws(report, [(2, 0), (2, 1), (2, 2), (2, 3)], 5, seed=7) == []  # the top K fills layer 2
    # the rest of layer 1 is a retrieval head
    assert layer_matched_draws(report, [(1, 1), (1, 2), (1, 3)], 5, seed=7) == []


def test_top_k_against_layer_matched_draws_gives_the_known_p():
    """The copy head alone carries the answer: the same-layer controls never mask it, so none hurts."""
    cfg = eval_config()
    s = make_probe(("niah_single_1", 600, 0.5, 0, False), RetrievalHeads(cfg, TOK, HELD_OUT).ctx, cfg.seed)
    model = copier(s.distance())
    scored = RetrievalHeads(cfg, TOK, HELD_OUT).run(model, step=0, tokens=0)
    cfg = cfg.model_copy(update={"heads": cfg.heads.model_copy(update={"selection_seed": cfg.seed})})
    out = ablations(model, cfg, TOK, HELD_OUT, scored, selection="top", k=1, controls=20, seed=3, step=0, tokens=0,
                    run_key=5, window=WINDOW)
    test, nonretrieval = out["ablation_tests"]
    # seeded by the seed, the run and the step
    draws = layer_matched_draws(scored, [(2, COPY_HEAD)], 20, seed=[3, 5, 0])
    assert (all(layer == 2 and head != COPY_HEAD for d in draws for layer, head in d)
            and len({tuple(d) for d in draws}) > 1)
    assert test["harm"] > 0.5 and test["draws"] == 20 and test["match"] == "layer"
    assert test["draw_harms"] == pytest.approx([0.0] * 20) and test["p"] == 1 / 21
    controls = [r for r in out["ablation"] if r["selection"] == "control"]
    assert [r["draw"] for r in controls] == list(range(20)) and all(r["k"] == 1 for r in controls)
    assert [r["masked"] for r in controls] == [[list(h) for h in d] for d in draws]
    # the contrast of Wu et al.: K heads drawn among the non-retrieval heads (the copy head is a retrieval head)
    assert nonretrieval["match"] == "non-retrieval" and nonretrieval["draws"] == 20
    assert nonretrieval["draw_harms"] == pytest.approx([0.0] * 20) and nonretrieval["p"] == 1 / 21
    assert out["ablation"][0]["mode"] == "zero"
    fresh = layer_matched_draws(scored, [(2, COPY_HEAD)], 20, seed=[3, 6, 0])  # another run: other draws
    assert fresh != draws


def test_uniform_masking_makes_a_head_average_the_values_it_sees():
    """``--mask-mode uniform``: the head's pre-softmax logits are 0, so its output at position t is the mean
    of the values at positions 0 ... t (a full-attention layer), as Wu et al. mask heads; zero mode gives 0."""
    from hybrid_lightning.heads.ablation import masked

    model = copier(5)
    mixer = model.layers[2].mixer
    x = torch.randn(1, 12, 256, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64).to(mixer.wo.weight.dtype)
    others = [(2, h) for h in range(mixer.n_heads) if h != COPY_HEAD]
    with masked(model, others), masked(model, [(2, COPY_HEAD)], "uniform"):
        out = mixer(x)  # only the copy head's output, attending uniformly
    _, _, v = mixer.project(x, 0)
    v = v[:, COPY_HEAD // (mixer.n_heads // mixer.n_kv)]  # (B, T, Dh): its kv head
    mean = v.cumsum(dim=1) / torch.arange(1, 13, dtype=v.dtype).view(1, -1, 1)
    Dh = mixer.head_dim
    expected = mean @ mixer.wo.weight[:, COPY_HEAD * Dh : (COPY_HEAD + 1) * Dh].T
    torch.testing.assert_close(out, expected)
    with masked(model, [(2, h) for h in range(mixer.n_heads)]):
        assert mixer(x).abs().max() == 0
    assert mixer.uniform_heads is None and mixer.head_mask is None  # restored
