"""One long-context evaluation of one model at one step: the probes (probes/tasks.py), the per-position
loss and LongPPL on held-out text, summed through torchmetrics (samples split across ranks, sums
synced) into a report that the callback and ``hybrid-lightning eval`` log and write alike.

LongPPL (Fang et al. 2024, arXiv 2410.23771): the model's perplexity over the *key tokens* of the
held-out sequences, chosen once by one evaluator model for every model of a study (longppl.py);
without an evaluator LongPPL is not reported.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torchmetrics import Metric

from hybrid_lightning.config import EvalConfig
from hybrid_lightning.eval.longppl import NO_EVALUATOR, KeyTokens, scored_columns
from hybrid_lightning.eval.report import GENERATION_FIELDS
from hybrid_lightning.eval.scoring import STATS, evaluating, position_buckets, score_samples, token_nll
from hybrid_lightning.probes.tasks import GenContext, Sample, make_sample
from hybrid_lightning.records import row


class SumTable(Metric):
    """A (rows, cols) table of float64 sums; under DDP ``compute()`` all-reduces it across ranks."""

    full_state_update = False

    def __init__(self, rows: int, cols: int):
        super().__init__()
        self.add_state("total", torch.zeros(rows, cols, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, index: torch.Tensor, values: torch.Tensor) -> None:
        self.total.index_add_(0, index.to(self.total.device), values.to(self.total))

    def compute(self) -> torch.Tensor:
        return self.total


def shard(items: list, rank: int, world: int) -> list[tuple[object, float]]:
    """This rank's share of ``items`` as (item, weight): every rank gets ceil(n / world) entries,
    padded with weight-0 repeats, so all ranks make the same forward calls (DDP and FSDP need that)."""
    mine = [(x, 1.0) for x in items[rank::world]]
    return mine + [(items[0], 0.0)] * (-(-len(items) // world) - len(mine)) if items else []


def task_probe(spec: tuple, ctx: GenContext, seed: int) -> Sample:
    """The probe of a spec (task, length, depth, index)."""
    task, length, depth, index = spec
    return make_sample(task, ctx, length, depth, index, seed)


def probe_batches(specs: list[tuple], ctx: GenContext, batch_size: int, seed: int, rank: int, world: int,
                  device: torch.device, make: Callable[[tuple, GenContext, int], Sample] = task_probe
                  ) -> Iterator[tuple[list[tuple], list[Sample], torch.Tensor]]:
    """This rank's share of the probes ``specs`` (task, length, depth, index, ...: ``make`` builds
    each), length by length, in batches of equal length: (specs, samples, weights (B,) float64; 0
    for ``shard``'s padding)."""
    for length in dict.fromkeys(spec[1] for spec in specs):
        mine = shard([spec for spec in specs if spec[1] == length], rank, world)
        for i in range(0, len(mine), batch_size):
            batch = mine[i : i + batch_size]
            samples = [make(spec, ctx, seed) for spec, _ in batch]
            yield ([spec for spec, _ in batch], samples,
                   torch.tensor([w for _, w in batch], dtype=torch.float64, device=device))


class LongContextEval:
    """The probes and held-out sequences of an ``eval:`` config, evaluated by ``run``.

    Args:
        cfg: the ``eval:`` section.
        tokenizer: the run's tokenizer (``encode``/``decode``).
        held_out: held-out token stream (the validation split): essay haystacks and the
            per-position loss / LongPPL sequences come from it.
        keys: LongPPL's key tokens of ``sequences`` (``longppl.evaluator_key_tokens``); None = not reported.
        seq_len: the training length, recorded in each report: the headline score is within it.
        window: the largest attention window of the evaluated model, its run plan's (``RunPlan.window``; None
            without windowed layers): a needle within it is scored as in-window.
    """

    def __init__(self, cfg: EvalConfig, tokenizer, held_out: np.ndarray, keys: KeyTokens | None = None,
                 seq_len: int | None = None, *, window: int | None):
        self.seq_len, self.window = seq_len, window
        self.cfg, self.ctx = cfg, GenContext(tokenizer, held_out, cfg.value_tokens, cfg.vt_example)
        self.specs = [(t, L, d, i) for L in cfg.lengths for t in cfg.tasks for d in cfg.depths
                      for i in range(cfg.samples)]
        n, T = cfg.position_sequences, cfg.position_len + 1
        starts = np.linspace(0, max(0, len(held_out) - T), n).astype(np.int64) if n else []
        self.sequences = [np.take(held_out, np.arange(s, s + T), mode="wrap").astype(np.int64) for s in starts]
        self.buckets = position_buckets(cfg.position_len)
        self.keys = keys or KeyTokens(None, None, NO_EVALUATOR)

    def _cell(self, task: str, length: int, depth: float, in_window: bool) -> int:
        c = self.cfg
        t, n, d = c.tasks.index(task), c.lengths.index(length), c.depths.index(depth)
        return ((t * len(c.lengths) + n) * len(c.depths) + d) * 2 + int(in_window)

    @torch.no_grad()
    def run(self, model, *, step: int, tokens: int, dtype: torch.dtype | None = None, rank: int = 0,
            world: int = 1, generate: bool = True) -> dict:
        """Evaluates ``model`` (a ``HybridLM``) and returns the report (see ``report``).

        Args:
            step: index of the last training batch (as TensorBoard steps).
            tokens: training tokens seen.
            dtype: autocast dtype, None = the model's precision.
            rank, world: this process's rank and the number of processes; each scores its share.
            generate: also decode the probes and score the outputs by string match (scoring.py).
        """
        device, window = next(model.parameters()).device, self.window
        with evaluating(model):
            tables = (self._probes(model, dtype, window, rank, world, device, generate)
                      + self._held_out(model, dtype, rank, world, device))
        # every rank reaches these computes (they all-reduce); a table nobody updated stays zero
        totals = [m.compute().cpu() if m.update_count else m.total.cpu() for m in tables]
        return self.report(*totals, step, tokens, window)

    def _probes(self, model, dtype, window, rank, world, device, generate: bool) -> tuple[SumTable]:
        """Sums of ``STATS`` per (task, length, depth, in_window) cell over this rank's probes."""
        c = self.cfg
        cells = SumTable(len(c.tasks) * len(c.lengths) * len(c.depths) * 2, len(STATS)).to(device)
        for specs, samples, weight in probe_batches(self.specs, self.ctx, c.batch_size, c.seed, rank, world, device):
            stats, in_window = score_samples(model, samples, c.chunk_tokens, dtype, window, device,
                                             self.ctx.tok if generate else None)
            index = torch.tensor([self._cell(*spec[:3], w) for spec, w in zip(specs, in_window.tolist())])
            cells.update(index, stats * weight[:, None])
        return (cells,)

    def _held_out(self, model, dtype, rank, world, device) -> tuple[SumTable, SumTable]:
        """Per-position loss sums (per bucket: NLL, tokens) and LongPPL sums (key NLL, key tokens,
        NLL and tokens of all tokens with at least 2K context) over this rank's held-out sequences."""
        c = self.cfg
        positions, longppl = SumTable(len(self.buckets), 2).to(device), SumTable(1, 4).to(device)
        mine = shard(list(range(len(self.sequences))), rank, world)
        scored = torch.from_numpy(scored_columns(c.position_len, c.longppl_context)).to(device)  # (T-1,)
        for i in range(0, len(mine), c.batch_size):
            batch = [j for j, _ in mine[i : i + c.batch_size]]
            ids = torch.from_numpy(np.stack([self.sequences[j] for j in batch])).to(device)  # (B, T)
            weight = torch.tensor([w for _, w in mine[i : i + c.batch_size]], dtype=torch.float64,
                                  device=device)[:, None]  # (B, 1)
            nll = token_nll(model, ids, c.chunk_tokens, dtype)[0].double() * weight  # (B, T-1): column p-1 predicts p
            sums = torch.stack([nll[:, lo - 1 : hi - 1].sum() for lo, hi in self.buckets])
            counts = torch.tensor([(hi - lo) * weight.sum().item() for lo, hi in self.buckets], dtype=torch.float64)
            positions.update(torch.arange(len(self.buckets)), torch.stack([sums, counts.to(device)], dim=1))
            key = (torch.from_numpy(self.keys.key[batch]).to(device) if self.keys.key is not None
                   else torch.zeros_like(nll, dtype=torch.bool)) & (weight > 0)  # (B, T-1)
            longppl.update(torch.zeros(1, dtype=torch.long), torch.stack([
                nll[key].sum(), key.sum().double(), nll[:, scored].sum(), scored.sum() * weight.sum()])[None])
        return positions, longppl

    def report(self, cells: torch.Tensor, positions: torch.Tensor, longppl: torch.Tensor, step: int, tokens: int,
               window: int | None) -> dict:
        """The tidy report: one record per (task, length, depth, in_window) cell holding samples, one
        row per position bucket, one LongPPL row. ``in_window`` is None for models without windows."""
        c, records = self.cfg, []
        for task, length, depth, w in itertools.product(c.tasks, c.lengths, c.depths, (False, True)):
            s = dict(zip(STATS, cells[self._cell(task, length, depth, w)].tolist()))
            if s["n"] == 0:
                continue
            records.append(row(
                "records", step=step, tokens=tokens, task=task, length=length, depth=depth,
                in_window=w if window is not None else None, n=int(s["n"]), accuracy=s["exact"] / s["n"],
                answer_tokens=int(s["tokens"]), token_accuracy=s["correct"] / s["tokens"],
                answer_loss=s["nll"] / s["tokens"], chance_token_accuracy=s["chance_correct"] / s["tokens"],
                chance_loss=s["chance_nll"] / s["tokens"], distance=s["distance"] / s["n"],
                generated=int(s["generated"]), **{k: s[stat] / s["generated"] if s["generated"] else None
                                                  for k, stat in GENERATION_FIELDS.items()},
            ))
        position_rows = [
            row("position_loss", step=step, tokens=tokens, length=c.position_len, position_lo=lo, position_hi=hi,
                loss=nll / n, n=int(n))
            for (lo, hi), (nll, n) in zip(self.buckets, positions.tolist()) if n > 0
        ]
        key_nll, n_key, nll, n = longppl[0].tolist()
        longppl_rows = [] if n == 0 else [row(
            "longppl", step=step, tokens=tokens, length=c.position_len, context=c.longppl_context,
            alpha=c.longppl_alpha, beta=c.longppl_beta, longppl=math.exp(key_nll / n_key) if n_key else None,
            key_tokens=int(n_key) if self.keys.key is not None else None, scored_tokens=int(n),
            ppl=math.exp(nll / n), evaluator=self.keys.evaluator,
            reason=self.keys.reason if self.keys.key is None else None if n_key else "the evaluator found no key "
                                              "tokens",
        )]
        return {"step": step, "tokens": tokens, "window": window, "seq_len": self.seq_len, "records": records,
                "position_loss": position_rows, "longppl": longppl_rows}
