"""C2: a model that copies the needle scores 100%, an untrained model and models that cannot see
the needle score about chance; piecewise evaluation equals one forward; DDP sums equal one process."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from conftest import on_ranks
from hybrid_lightning import build_model
from hybrid_lightning.config import validate_config
from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.eval.longppl import KeyTokens, select_key_tokens
from hybrid_lightning.eval.report import headline as report_headline
from hybrid_lightning.eval.report import scalars
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.eval.scoring import STATS, ruler_output, score_samples, string_match_all, string_match_part
from hybrid_lightning.probes.tasks import GenContext, make_sample
from hybrid_lightning.records import pool

TOK = ByteTokenizer()
HELD_OUT = TOK.encode(open(np.__file__.replace("__init__.py", "_core/numeric.py")).read())
TASKS = ["passkey", "niah_single_1", "niah_single_3", "niah_multivalue", "vt"]


def eval_config(**kw):
    base = {"tasks": TASKS, "lengths": [1000], "depths": [0.0, 0.5, 1.0], "samples": 2, "position_sequences": 2,
            "position_length": 600, "longppl_context": 64, "batch_size": 4,
            "vt_example": False}  # vt's example: test_eval_tasks
    return validate_config({"eval": {**base, **kw}}).eval


class CopyOracle(nn.Module):
    """A scripted retriever with the model's incremental interface. It recognises each row's probe
    from the prompt and, at every answer position, puts all its mass on the prompt token that the
    answer copies (``answer_source``), reading only tokens it has been fed and, with a ``window``,
    only the last ``window`` of them, as a sliding-window layer. Separators between values it knows
    (the answer's format); value tokens it cannot see get a uniform guess over the tokens answers
    are made of."""

    def __init__(self, samples, window: int | None = None, vocab: int = 257):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the evaluator a device
        self.samples, self.window, self.vocab = samples, window, vocab
        alphabet = sorted({int(t) for s in samples for t in s.answer})
        self.guess = torch.full((vocab,), -30.0)
        self.guess[alphabet] = 0.0

    def new_states(self):
        return [{}]

    def forward(self, ids, states):
        st = states[0]
        st["hist"] = torch.cat([st["hist"], ids], dim=1) if "hist" in st else ids
        start = st["hist"].shape[1] - ids.shape[1]
        out = self.guess.expand(*ids.shape, self.vocab).clone()  # (B, T, V)
        for b, row in enumerate(st["hist"]):
            match = [s for s in self.samples
                     if len(s.prompt) <= len(row) and torch.equal(row[: len(s.prompt)], torch.from_numpy(s.prompt))]
            if not match:
                continue  # the prompt is not complete yet: no answer position in this piece
            s = match[0]
            for j, src in enumerate(s.answer_source.tolist()):
                t = len(s.prompt) - 1 + j  # the position that predicts answer token j
                if not start <= t < start + ids.shape[1]:
                    continue
                if src < 0:  # a separator: the answer's format, known without retrieval
                    out[b, t - start] = -30.0
                    out[b, t - start, int(s.answer[j])] = 30.0
                elif self.window is None or t - src < self.window:
                    out[b, t - start] = -30.0
                    out[b, t - start, row[src]] = 30.0
        return out + 0 * self.anchor


def assert_reports_close(a: dict, b: dict, rel: float = 1e-9):
    assert a.keys() == b.keys()
    for name in ("records", "position_loss", "longppl"):
        for x, y in zip(a[name], b[name], strict=True):
            assert x.keys() == y.keys()
            for k in x:
                same = x[k] == pytest.approx(y[k], rel=rel) if isinstance(x[k], float) else x[k] == y[k]
                assert same, (name, k, x[k], y[k])


def samples_of(ev):
    return [make_sample(t, ev.ctx, n, d, k, ev.cfg.seed) for t, n, d, k in ev.specs]


def test_copy_oracle_scores_everything_and_a_windowed_one_only_inside_its_window():
    ev = LongContextEval(eval_config(position_sequences=0), TOK, HELD_OUT, window=None)
    samples = samples_of(ev)
    report = ev.run(CopyOracle(samples), step=0, tokens=0)
    assert {r["task"] for r in report["records"]} == set(TASKS)
    for r in report["records"]:
        assert r["accuracy"] == 1.0 and r["token_accuracy"] == 1.0 and r["answer_loss"] < 1e-6, r
        assert r["in_window"] is None
        # its greedy generation starts with the answer and holds every reference value
        assert (r["generated"] == r["n"] and r["generated_exact"] == 1.0 and r["match_all"] == 1.0
                and r["match_part"] == 1.0), r
    assert report_headline(report)["score"] == pytest.approx(
        1.0 - sum(pool(report["records"], task=t)["chance_token_accuracy"]
                  for t in TASKS) / len(TASKS))
    # window 300: needles at depth 1.0 lie inside it, those at 0.0 and 0.5 (> 400 tokens back) do not
    window = 300
    report = LongContextEval(ev.cfg, TOK, HELD_OUT, window=window).run(CopyOracle(samples, window), step=0, tokens=0)
    inside = [r for r in report["records"] if r["in_window"]]
    outside = [r for r in report["records"] if not r["in_window"]]
    assert {r["depth"] for r in outside} >= {0.0, 0.5} and all(r["depth"] == 1.0 for r in inside)
    assert all(r["accuracy"] == 1.0 for r in inside) and inside
    for r in outside:  # about chance where no value is visible: nothing exact, graded measures near the prior's
        if r["depth"] == 1.0 or r["task"] in ("vt", "niah_multivalue"):
            continue  # needles at the end, or others at their own random depths: some visible, some not
        assert r["accuracy"] == 0.0
        assert r["token_accuracy"] < r["chance_token_accuracy"] + 0.15, r
        assert r["answer_loss"] > 0.8 * r["chance_loss"], r
    for r in report["records"]:  # generation and teacher forcing agree on single-value tasks
        if r["task"] in ("passkey", "niah_single_1", "niah_single_3"):
            assert r["generated_exact"] == r["accuracy"], r
    tags = scalars(report)
    assert (tags["val_longctx_tasks/passkey/token_accuracy_in_window"] == 1.0
            and tags["val_longctx_tasks/passkey/token_accuracy_out_window"] < 0.3)
    assert 0 < tags["val_longctx/match_all"] < 1 and tags["val_longctx/exact"] == report_headline(report)["exact"]


@pytest.mark.parametrize("pattern, window", [("EF", 64), ("E", 16)])
def test_untrained_and_short_window_models_score_about_chance(pattern, window):
    torch.manual_seed(0)
    model = build_model({"n_layers": 2, "d_model": 64, "n_heads": 2, "pattern": pattern, "window": window})
    ev = LongContextEval(eval_config(depths=[0.0, 1.0], samples=1), TOK, HELD_OUT, window=window)
    ev.keys = KeyTokens("itself", select_key_tokens(model, ev.sequences, ev.cfg, None))
    report = ev.run(model, step=0, tokens=0)
    for task in TASKS:
        p = pool(report["records"], task=task)
        assert p["accuracy"] == 0.0
        assert p["token_accuracy"] < p["chance_token_accuracy"] + 0.1, (task, p)
        assert p["answer_loss"] > p["chance_loss"], (task, p)
    # an untrained model has no use for far context: as its own evaluator, it finds (almost) no key tokens
    (ppl,) = report["longppl"]
    assert ppl["key_tokens"] <= 0.01 * ppl["scored_tokens"] and ppl["ppl"] > 100


def test_piecewise_evaluation_equals_one_forward():
    torch.manual_seed(0)
    model = build_model({"n_layers": 4, "d_model": 64, "n_heads": 2, "pattern": "EEEF", "window": 32}).double()
    cfg = eval_config(tasks=["passkey", "niah_single_2"], lengths=[700], depths=[0.0, 1.0], samples=1,
                      position_sequences=1, position_length=300)
    one = LongContextEval(cfg, TOK, HELD_OUT, window=32).run(model, step=3, tokens=10)
    pieces_cfg = cfg.model_copy(update={"chunk_tokens": 97, "batch_size": 3})
    pieces = LongContextEval(pieces_cfg, TOK, HELD_OUT, window=32).run(model, step=3, tokens=10)
    assert_reports_close(one, pieces, rel=1e-6)  # logits are cast to float32 for the loss


def _ddp_eval(rank: int = 0, world: int = 1) -> dict:
    torch.manual_seed(0)
    model = build_model({"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16}).double()
    cfg = eval_config(tasks=["passkey", "niah_single_1"], lengths=[600, 800], depths=[0.0, 1.0], samples=3,
                      position_sequences=3)
    return LongContextEval(cfg, TOK, HELD_OUT, window=16).run(model, step=1, tokens=2, rank=rank, world=world)


@pytest.mark.slow
def test_ddp_split_and_sync_equal_one_process():
    """Two gloo processes each score their share of the probes (3 samples per cell: uneven) and
    the synced totals equal one process scoring everything."""
    two = on_ranks(_ddp_eval)
    one = _ddp_eval()
    assert two[0] == two[1]  # every rank holds the synced totals
    assert_reports_close(two[0], one)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 autocast evaluation)")
def test_gpu_bf16_evaluation_matches_cpu_fp32():
    torch.manual_seed(0)
    model = build_model({"n_layers": 4, "d_model": 64, "n_heads": 2, "pattern": "EEEF", "window": 32})
    cfg = eval_config(tasks=["passkey", "niah_single_2"], lengths=[2000], depths=[0.0, 1.0], samples=2,
                      position_sequences=2, position_length=1500, chunk_tokens=512)
    cpu = LongContextEval(cfg, TOK, HELD_OUT, window=32).run(model, step=0, tokens=0)
    gpu = LongContextEval(cfg, TOK, HELD_OUT, window=32).run(model.cuda(), step=0, tokens=0, dtype=torch.bfloat16)
    for a, b in zip(cpu["records"], gpu["records"], strict=True):
        assert a["answer_loss"] == pytest.approx(b["answer_loss"], rel=0.03)
    for a, b in zip(cpu["position_loss"], gpu["position_loss"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=0.03)


def test_string_match_scores_of_hand_made_outputs():
    refs = ["1234567", "7654321", "AbC-dEf"]
    assert string_match_all("The values are 1234567 and abc-def.", refs) == pytest.approx(2 / 3)
    assert string_match_part("The values are 1234567 and abc-def.", refs) == 1.0
    assert string_match_all("7654321, 1234567, ABC-DEF", refs) == 1.0  # any order, any case
    assert string_match_all("123456 76543210", refs) == pytest.approx(1 / 3)  # a substring counts, as in RULER
    assert string_match_part("nothing here", refs) == 0.0 and string_match_all("", refs) == 0.0
    assert ruler_output(" \x00 GVCAV\tGBGIR \n") == "GVCAV\nGBGIR"


def reference_greedy(model, prompt: np.ndarray, n: int) -> np.ndarray:
    """Greedy decoding by a whole forward per token, no incremental state."""
    ids = torch.from_numpy(prompt)[None]
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].numpy()


def test_generation_exact_match_equals_teacher_forced_exact_match():
    """On single-value tasks a sample is answered exactly by teacher forcing if and only if greedy
    generation starts with the answer. A tiny random model gets none of the true answers; giving each
    probe the model's own greedy continuation (a plain decoder, no incremental state) as its answer
    makes both measures 1, and one changed token makes both 0. Passkey answers of different lengths
    make prompts of different lengths in one batch."""
    torch.manual_seed(0)
    model = build_model({"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16}).double().eval()
    ctx = GenContext(TOK, HELD_OUT)
    probes = [make_sample(t, ctx, 500, d, i)
              for t in ("passkey", "niah_single_1") for d in (0.0, 1.0) for i in range(3)]
    assert len({len(p.prompt) for p in probes}) > 1
    rows = []
    for p in probes:
        own = reference_greedy(model, p.prompt, len(p.answer))
        wrong = own.copy()
        wrong[-1] = (wrong[-1] + 1) % 256
        rows += [p, replace(p, answer=own, references=(TOK.decode(own),)), replace(p, answer=wrong)]
    stats, _ = score_samples(model, rows, 64, None, None, torch.device("cpu"), TOK)
    s = dict(zip(STATS, stats.T.tolist()))
    assert s["generated"] == [1.0] * len(rows)
    assert s["gen_exact"] == s["exact"]
    assert s["exact"] == [0.0, 1.0, 0.0] * len(probes)
    assert s["match_all"][1::3] == [1.0] * len(probes)
    # the same from the evaluation: records hold both, equal on every single-value cell
    cfg = eval_config(tasks=["passkey", "niah_single_1", "niah_single_3"], lengths=[500], depths=[0.0, 1.0], samples=3)
    for r in LongContextEval(cfg, TOK, HELD_OUT, window=16).run(model, step=0, tokens=0)["records"]:
        assert r["generated_exact"] == r["accuracy"] and r["generated"] == r["n"]
