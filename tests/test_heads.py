"""D1, D1b, D2: retrieval scores on models whose weights are set by hand (a head that copies the needle
scores 1.0, a head spread over the answer span is a locator, not a copy or retrieval head), scores that
do not depend on the evaluation batch size or on splitting across ranks, and head ablation."""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import on_ranks
from hybrid_lightning import build_model
from hybrid_lightning.config import validate_config
from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.heads.ablation import ablate, choose_heads, masked, parse_heads
from hybrid_lightning.heads.report import ablation_table, heads_scalars, heads_table, score_grid, scored_layers
from hybrid_lightning.heads.retrieval import RetrievalHeads, answer_targets
from hybrid_lightning.probes.check import check_heads_probes
from hybrid_lightning.probes.tasks import make_sample

TOK = ByteTokenizer()
HELD_OUT = TOK.encode(open(np.__file__.replace("__init__.py", "_core/numeric.py")).read())
PROBE = {"tasks": ["niah_single_1"], "lengths": [600], "depths": [0.5], "samples": 1}
COPY_HEAD, SCALE = 2, 1e4  # the hand-set head; its query length (sharp attention)
DIGITS = [ord(c) for c in "0123456789"]


def eval_config(heads: dict | None = None, **kw):
    return validate_config({"eval": {**PROBE, "value_tokens": 16, "position_sequences": 0, **kw,
                                      "heads": {**PROBE, "echo": False, **(heads or {})}}}).eval


def probe_sample(cfg) -> "Sample":  # noqa: F821
    h = cfg.heads
    return make_sample(h.tasks[0], RetrievalHeads(cfg, TOK, HELD_OUT).ctx, h.lengths[0], h.depths[0], 0, cfg.seed)


def zeroed(pattern: str, d_model: int, window: int = 32, pos: str = "rope"):
    model = build_model({"n_layers": len(pattern), "pattern": pattern, "d_model": d_model, "n_heads": 4,
                         "n_kv_heads": 2,
                         "window": window, "pos": {"full": pos, "efficient": pos}}).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if "norm" in name else 0.0)
    return model


def set_copy_head(mixer, distance: int, constant_dim: int, x0: float) -> None:
    """Head COPY_HEAD of ``mixer`` (RoPE) attends from every position t to t - ``distance``: with an
    input that is the same at every position (``x0`` on ``constant_dim``), q_t = R(t) q0 and
    k_s = R(s) k0 give q_t . k_s = q0' R(s - t) k0, largest at s - t = -distance for q0 = R(-distance) k0."""
    Dh = mixer.head_dim
    kv = COPY_HEAD // (mixer.n_heads // mixer.n_kv)
    k0 = torch.ones(Dh, dtype=torch.float64) / Dh**0.5
    q0 = mixer.rope(k0.view(1, 1, 1, Dh), start=-distance).view(Dh) * SCALE
    with torch.no_grad():
        mixer.wk.weight[kv * Dh : (kv + 1) * Dh, constant_dim] = k0 / x0
        mixer.wq.weight[COPY_HEAD * Dh : (COPY_HEAD + 1) * Dh, constant_dim] = q0 / x0


class NotAttention(nn.Module):
    """A mixer that is not attention (as a recurrent mixer): it adds nothing."""

    def forward(self, x, state=None):
        return torch.zeros_like(x)


def copier(distance: int):
    """Layers: 0 a mixer that is not attention, 1 SWA (window 32) and 2 full attention, whose head 2
    attends exactly ``distance`` tokens back; the full layer's head 2 also copies the token it sees
    into the output (values and output projection carry a 64-d token code that the output head reads),
    so the model answers a probe whose value lies ``distance`` tokens before the answer."""
    D, Dh = 256, 64
    model = zeroed("SSF", D)
    model.layers[0].mixer = NotAttention()
    g = torch.Generator().manual_seed(0)
    code = torch.randn(TOK.vocab_size, 64, generator=g, dtype=torch.float64)
    code /= code.norm(dim=1, keepdim=True)  # equal norms: RMSNorm gives every token the same x[0]
    x0 = (D / 2) ** 0.5  # x = e / rms(e) with e = (1 on dim 0, a unit code on dims 128-191)
    full = model.layers[2].mixer
    with torch.no_grad():
        model.embed.weight[:, 0] = 1.0
        model.embed.weight[:, 128:192] = code
        for layer in (1, 2):
            set_copy_head(model.layers[layer].mixer, distance, 0, x0)
        full.wv.weight[Dh:, 128:192] = torch.eye(64)  # kv head 1 (heads 2, 3): the token code
        full.wo.weight[128:192, COPY_HEAD * Dh : (COPY_HEAD + 1) * Dh] = 30 * torch.eye(64) / x0
        model.lm_head.weight[:, 128:192] = code
    return model


def locator(pos: str = "nope"):
    """One full-attention NoPE layer whose head 1 attends equally to every digit it can see: digits
    carry a flag (dim 0) besides the constant dim 1, head 1's keys read the flag, its queries the
    constant. In a noise-haystack probe the digits are those of the value (and of the answer so far)."""
    D = 32
    model = zeroed("F", D, pos=pos)
    mixer = model.layers[0].mixer
    with torch.no_grad():
        model.embed.weight[:, 1] = 1.0
        model.embed.weight[DIGITS, 0] = 1.0
        mixer.wk.weight[0, 0] = 1.0  # kv head 0 (heads 0, 1), first dim: the digit flag
        mixer.wq.weight[mixer.head_dim, 1] = 100.0  # head 1, first dim: a constant
    return model


def head(report, layer, h):
    (row,) = [r for r in report["heads"] if (r["layer"], r["head"]) == (layer, h)]
    return row


def test_d1_the_copy_head_scores_one_and_every_other_head_zero():
    cfg = eval_config()
    s = probe_sample(cfg)
    model = copier(s.distance())
    report = RetrievalHeads(cfg, TOK, HELD_OUT).run(model, step=5, tokens=7)
    assert report["samples"] == report["kept"] == 1 and report["accuracy"] == 1.0  # the copier answers
    r = head(report, 2, COPY_HEAD)
    assert r["score"] == 1.0 and r["token_score"] == 1.0 and r["in_span"] == 1.0 and r["copy_precision"] == 1.0
    assert r["source_mass"] > 0.999 and r["span_mass"] > 0.999
    assert r["retrieval"] and r["role"] == "copy"
    others = [x for x in report["heads"] if x is not r]
    assert len(others) == 7 and all(x["score"] == 0.0 and not x["retrieval"] and x["role"] is None for x in others)
    # layer 0 is not attention: not applicable; the SWA layer cannot see the needle 200+ tokens back
    assert [x["applicable"] for x in report["layers"]] == [False, True, True]
    assert report["layers"][0]["retrieval_heads"] is None and report["layers"][2]["retrieval_heads"] == 1
    assert head(report, 1, COPY_HEAD)["score"] == 0.0 and s.distance() > 32
    assert report["total"] == {"retrieval_heads": 1, "copy_heads": 1, "locator_heads": 0, "max_score": 1.0,
                               "mean_score": 1.0 / 8, "reaching_heads": 4,
                               "reach_retrieval_heads": 1}  # full heads reach
    assert all(x["step"] == 5 and x["tokens"] == 7 for x in report["heads"] + report["layers"])
    grid = score_grid(report)
    assert np.isnan(grid[0]).all() and grid[2, COPY_HEAD] == 1.0
    tags = heads_scalars(report, scored_layers(report))
    assert tags["val_longctx_heads/retrieval_heads"] == 1 and tags["val_longctx_heads/layer_02/max_score"] == 1.0
    assert ("val_longctx_heads/layer_00/retrieval_heads" not in tags
            and "val_longctx_heads/layer_01/max_score" not in tags)
    text = heads_table(report)
    assert "1.000*C" in text and "0 swa/32 (n/a)" in text


def test_d1_copying_either_statement_of_the_pass_key_is_a_hit():
    """The pass key is stated twice; a head on the second statement copies as well as one on the first."""
    cfg = eval_config({"tasks": ["passkey"]})
    s = probe_sample(cfg)
    (a, b), = s.value_spans
    second = a + 1 + int(np.flatnonzero((np.lib.stride_tricks.sliding_window_view(s.prompt[a + 1 :], b - a) ==
                                         s.prompt[a:b]).all(axis=1))[0])
    for distance in (s.distance(), len(s.prompt) - 1 - second):
        r = head(RetrievalHeads(cfg, TOK, HELD_OUT).run(copier(distance), step=0, tokens=0), 2, COPY_HEAD)
        assert r["score"] == 1.0 and r["role"] == "copy"


def test_d1b_a_head_spread_over_the_span_is_a_locator_not_a_copy_or_retrieval_head():
    report = RetrievalHeads(eval_config(), TOK, HELD_OUT).run(locator(), step=0, tokens=0)
    r = head(report, 0, 1)
    n = len(probe_sample(eval_config()).answer)
    assert n >= 16
    assert r["in_span"] == 1.0  # it always looks into the value...
    assert r["score"] == pytest.approx(1 / n) and r["score"] < 0.1  # ...but lands on the right token once
    assert r["copy_precision"] == pytest.approx(1 / n)
    assert 0.5 < r["span_mass"] < 1 and r["source_mass"] < 0.1
    assert not r["retrieval"] and r["role"] == "locator"
    assert report["total"]["retrieval_heads"] == 0 and report["total"]["copy_heads"] == 0
    assert report["total"]["locator_heads"] == 1
    # with the task's own 7-digit values (8-token answers) the same head passes the score threshold:
    # only the copy precision tells it is a locator
    short = RetrievalHeads(eval_config({"value_tokens": None}), TOK, HELD_OUT).run(locator(), step=0, tokens=0)
    r = head(short, 0, 1)
    assert r["score"] == pytest.approx(1 / 8) and r["retrieval"] and r["role"] == "locator"
    assert short["total"]["retrieval_heads"] == 1 and short["total"]["copy_heads"] == 0


def test_answer_targets_follow_the_answer_source():
    s = probe_sample(eval_config({"tasks": ["niah_multivalue"], "lengths": [900]}))
    P, n = len(s.prompt), len(s.prompt) + len(s.answer) - 1
    valid, source, span, token = answer_targets(s, P - 3, len(s.answer) + 2, n)
    assert not valid[:2].any()  # rows before the answer
    for j, src in enumerate(s.answer_source):
        r = j + 2
        assert valid[r] == (src >= 0)  # separators between values are not scored
        if src >= 0:
            assert np.flatnonzero(source[r]).tolist() == [src]
            (a, b), = [(a, b) for a, b in s.value_spans if a <= src < b]
            assert np.flatnonzero(span[r]).tolist() == list(range(a, b))
            assert token[r, src] and (s.prompt[np.flatnonzero(token[r])] == s.answer[j]).all()


def random_model():
    torch.manual_seed(0)
    return build_model({"n_layers": 4, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "pattern": "EEEF", "window": 48,
                        "init_std": 0.4}).double()


GRID = {"tasks": ["passkey", "niah_single_2"], "lengths": [560, 700], "depths": [0.0, 0.6], "samples": 2}


def assert_same_scores(a: dict, b: dict):
    assert ((a["samples"], a["kept"], a["total"]["retrieval_heads"])
            == (b["samples"], b["kept"], b["total"]["retrieval_heads"]))
    for x, y in zip(a["heads"] + a["layers"], b["heads"] + b["layers"], strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == (pytest.approx(y[k], rel=1e-9, abs=1e-12) if isinstance(x[k], float) else y[k]), (k, x, y)


def test_d2_scores_do_not_depend_on_batch_size_or_pieces():
    model = random_model()
    one = RetrievalHeads(eval_config(GRID, batch_size=1), TOK, HELD_OUT).run(model, step=0, tokens=0)
    assert one["samples"] == 16 and max(r["score"] for r in one["heads"]) > 0  # something to compare
    for batch, chunk in ((3, 2048), (16, 101)):
        other = RetrievalHeads(eval_config(GRID, batch_size=batch, chunk_tokens=chunk), TOK, HELD_OUT).run(
            model, step=0, tokens=0)
        assert_same_scores(one, other)


def _ddp_heads(rank: int = 0, world: int = 1) -> dict:
    return RetrievalHeads(eval_config(GRID, batch_size=3), TOK, HELD_OUT).run(random_model(), step=1, tokens=2,
                                                                              rank=rank, world=world)


def test_d2_two_ranks_give_the_scores_of_one_process():
    two = on_ranks(_ddp_heads, port=29600)  # 2 x 8 probes of 2 lengths, 3 per batch: uneven shares
    assert two[0] == two[1]
    assert_same_scores(two[0], _ddp_heads())


def test_answer_filter_keeps_answered_samples_only():
    model, grid = random_model(), {**GRID, "lengths": [560], "samples": 1}
    report = RetrievalHeads(eval_config(grid), TOK, HELD_OUT).run(model, step=0, tokens=0)
    strict = RetrievalHeads(eval_config({**grid, "min_answer_accuracy": 0.5}), TOK, HELD_OUT).run(
        model, step=0, tokens=0)
    assert report["kept"] == report["samples"] == strict["samples"] == 4
    assert strict["kept"] == 0  # an untrained model answers nothing
    assert all(r["score"] is None and not r["retrieval"] and r["role"] is None for r in strict["heads"])
    assert strict["total"]["retrieval_heads"] == 0 and strict["total"]["max_score"] is None
    with pytest.raises(ValueError, match="--mask-top: no retrieval scores"):
        choose_heads(strict, "top", 1)
    copy = RetrievalHeads(eval_config({"min_answer_accuracy": 0.5}), TOK, HELD_OUT)
    assert copy.run(copier(probe_sample(eval_config()).distance()), step=0, tokens=0)["kept"] == 1


def test_ablation_masking_the_copy_head_removes_retrieval_and_a_random_head_does_not():
    cfg = eval_config()
    model = copier(probe_sample(cfg).distance())
    report = RetrievalHeads(cfg, TOK, HELD_OUT).run(model, step=3, tokens=4)
    ev = LongContextEval(cfg, TOK, HELD_OUT, window=32)  # the heads probe: same task, seed and value length
    top = choose_heads(report, "top", 1)
    assert top == [(2, COPY_HEAD)]
    rows = ablate(model, ev, top, selection="top", k=1, seed=None, step=3, tokens=4)
    (row,) = rows
    assert row["accuracy"] == 1.0 and row["masked_accuracy"] == 0.0 and row["masked_token_accuracy"] < 0.3
    assert row["masked"] == [[2, COPY_HEAD]] and row["task"] == "niah_single_1" and row["n"] == 1
    assert all(m.head_mask is None for m in (model.layers[1].mixer, model.layers[2].mixer))  # restored
    report["ablation"] = rows
    assert "drop 1.000" in ablation_table(report)
    random = choose_heads(report, "random", 1, seed=0)
    assert len(random) == 1 and random != top and random[0][0] in (1, 2)
    (row,) = ablate(model, ev, random, selection="random", k=1, seed=0, step=3, tokens=4)
    assert row["masked_accuracy"] == 1.0
    # random draws avoid the top K and depend on the seed alone
    draws = {tuple(choose_heads(report, "random", 3, seed=s)) for s in range(20)}
    assert len(draws) > 1 and all((2, COPY_HEAD) not in d for d in draws)
    assert choose_heads(report, "random", 3, seed=4) == choose_heads(report, "random", 3, seed=4)


def test_mask_zeroes_exactly_the_chosen_heads():
    model = random_model()
    x = torch.randint(0, 257, (2, 40))
    base = model(x)
    with masked(model, [(3, 1)]):
        assert model.layers[3].mixer.head_mask.tolist() == [1.0, 0.0, 1.0, 1.0]
        assert model.layers[0].mixer.head_mask is None
        changed = model(x)
    assert not torch.allclose(base, changed) and torch.equal(model(x), base)


def test_head_choice_errors_name_the_option():
    report = RetrievalHeads(eval_config(), TOK, HELD_OUT).run(locator(), step=0, tokens=0)
    with pytest.raises(ValueError, match="--mask-top: K must be between 1 and 4"):
        choose_heads(report, "top", 5)
    with pytest.raises(ValueError, match="--mask-random: K=3 leaves only 1 heads"):
        choose_heads(report, "random", 3)
    with pytest.raises(ValueError, match=r"--mask: \['1.0', '0.7'\] is not a list of attention heads "
                                         r"\(attention layers \[0\]"):
        choose_heads(report, "list", listed=[(1, 0), (0, 7), (0, 1)])
    assert choose_heads(report, "list", listed=parse_heads(["0.3", "0.1", "0.3"])) == [(0, 3), (0, 1)]
    with pytest.raises(ValueError, match="--mask: '3-1' is not LAYER.HEAD"):
        parse_heads(["3-1"])


def test_config_errors_name_the_heads_keys():
    with pytest.raises(ValueError, match="did you mean 'eval.heads.threshold'"):
        validate_config({"eval": {"heads": {"treshold": 0.2}}})
    # checked by eval
    with pytest.raises(ValueError, match=r"eval.heads.tasks: \['needle'\] not among the accepted tasks"):
        check_heads_probes(validate_config({"eval": {"heads": {"tasks": ["needle"]}}}).eval, TOK)
    with pytest.raises(ValueError, match="eval.heads.lengths: 300 tokens is too short for task 'niah_single_1'"):
        check_heads_probes(validate_config({"eval": {"heads": {"lengths": [300]}}}).eval, TOK)


@pytest.mark.parametrize("letter", ["M", "G", "L"])
def test_recurrent_layers_are_not_applicable_and_pieces_carry_their_state(letter):
    """A real recurrent hybrid: its recurrent layers are reported as not applicable, its attention
    layers scored, the same whether the probes go through in one piece or in many (carried state)."""
    torch.manual_seed(0)
    model = build_model({"n_layers": 3, "d_model": 64, "n_heads": 4, "pattern": letter + "SF", "window": 48,
                         "init_std": 0.4}).double()
    one = RetrievalHeads(eval_config(GRID, batch_size=4), TOK, HELD_OUT).run(model, step=0, tokens=0)
    assert [x["applicable"] for x in one["layers"]] == [False, True, True]
    # some hits by chance (Wu et al.'s token test), so that the comparison below compares something
    assert {r["layer"] for r in one["heads"]} == {1, 2} and max(r["token_score"] for r in one["heads"]) > 0
    pieces = RetrievalHeads(eval_config(GRID, batch_size=4, chunk_tokens=97), TOK, HELD_OUT).run(
        model, step=0, tokens=0)
    assert_same_scores(one, pieces)


def test_mask_top_refuses_a_tie_at_the_kth_place_and_names_it():
    def report(scores):
        return {"kept": 1, "heads": [{"layer": 3, "head": h, "score": s} for h, s in enumerate(scores)]}

    with pytest.raises(ValueError, match=r"--mask-top 2: the top 2 is not defined: heads 3.0 3.1 3.2 3.3 "
                                         r"tie at score 0 "
                                         r"for places 1 to 4; score more probes"):
        choose_heads(report([0.0, 0.0, 0.0, 0.0]), "top", 2)  # every score 0: no top 2 to speak of
    tied = report([0.1, 0.5, 0.3, 0.3])
    with pytest.raises(ValueError, match=r"heads 3.2 3.3 tie at score 0.3 for places 2 to 3; choose K = 1 or 3"):
        choose_heads(tied, "top", 2)
    assert choose_heads(tied, "top", 1) == [(3, 1)] and choose_heads(tied, "top", 3) == [(3, 1), (3, 2), (3, 3)]
    assert choose_heads(tied, "top", 4) == [(3, 1), (3, 2), (3, 3), (3, 0)]  # no (K+1)-th head: nothing to tie with
