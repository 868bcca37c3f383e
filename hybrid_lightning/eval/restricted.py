"""``hybrid-lightning restrict RUN_DIR``: the run's long-context evaluation (probes, per-position loss, LongPPL)
with the full-attention or the efficient layers limited to their last R tokens (model/restrict.py), beside the
unrestricted model's: the paper's receptive-field test (Qiao et al. 2026, arXiv 2606.15378, Finding 2: limiting
full attention to ~2K tokens hurts LongPPL sharply, limiting efficient layers barely, recurrent ones included).

The probes are scored teacher-forced (no generation); LongPPL is scored on the unrestricted evaluator's key tokens,
so the restricted and unrestricted models are compared on the same tokens. Records: ``eval/restricted_step_<k>.json``
(``records.RestrictedScores``), a restriction run again replacing its row."""

from __future__ import annotations

from pathlib import Path

from hybrid_lightning.eval.offline import load_checkpoint, long_context_eval
from hybrid_lightning.model.restrict import PARTS, applicable, receptive_field
from hybrid_lightning.records import headline, row
from hybrid_lightning.rundir.evals import write_eval_record

KEY = ("layers", "receptive_field")  # what identifies a row: a newer row with the same restriction replaces it


def parse_restriction(text: str) -> tuple[str, int]:
    """``full:2048`` -> ("full", 2048): which layers (``PARTS``) and their receptive field in tokens."""
    part, _, tokens = text.partition(":")
    if part not in PARTS or not tokens.isdigit() or int(tokens) < 1:
        raise ValueError(f"--limit {text!r}: give LAYERS:R with LAYERS one of {list(PARTS)} and R a positive number "
                         "of tokens, e.g. full:2048")
    return part, int(tokens)


def scores_row(report: dict, part: str | None, tokens: int | None) -> dict:
    """The ``restricted`` row of a long-context report made under a restriction (None: unrestricted)."""
    h = headline(report["records"], report["seq_len"])
    longppl = report["longppl"][0] if report["longppl"] else {}
    return row("restricted", layers=part, receptive_field=tokens, step=report["step"], tokens=report["tokens"],
               score=h["score"], score_beyond=h["score_beyond"], exact=h["exact"], longppl=longppl.get("longppl"),
               ppl=longppl.get("ppl"),
               position_loss=[[r["position_lo"], r["position_hi"], r["loss"]] for r in report["position_loss"]])


def restricted_checkpoint(run_dir: str | Path, limits: list[tuple[str, int]], ckpt: str | Path | None = None,
                          overrides: list[str] = ()) -> dict:
    """Evaluates a checkpoint of ``run_dir`` (``eval.offline.load_checkpoint``, ``eval.*`` ``overrides``) unrestricted
    and under each of ``limits`` ((layers, R) pairs); writes ``eval/restricted_step_<k>.json`` and returns it."""
    run = load_checkpoint(run_dir, ckpt, overrides)
    ev = long_context_eval(run)
    rows = []
    for part, tokens in [(None, None), *applicable(run.model, limits)]:
        with receptive_field(run.model, part, tokens):
            report = ev.run(run.model, step=run.step, tokens=run.tokens, dtype=run.dtype, generate=False)
        rows.append(scores_row(report, part, tokens))
    record = {"step": run.step, "tokens": run.tokens, "seq_len": run.cfg.train.seq_len, "restricted": rows}
    write_eval_record(Path(run_dir), "restricted", record, {"restricted": KEY})
    return record


def restricted_table(record: dict) -> str:
    """A plain-text table: per restriction, the probe score, LongPPL and perplexity."""
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = [f"step {record['step']}  tokens {record['tokens']:,}",
             f"{'layers':<11}{'R':>8}{'score':>9}{'beyond':>9}{'exact':>8}{'LongPPL':>10}{'ppl':>9}"]
    for r in record["restricted"]:
        lines.append(f"{r['layers'] or 'none':<11}{r['receptive_field'] or '-':>8}{num(r['score']):>9}"
                     f"{num(r['score_beyond']):>9}{num(r['exact']):>8}{num(r['longppl']):>10}{num(r['ppl']):>9}")
    return "\n".join(lines)
