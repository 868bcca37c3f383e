"""The LightningDataModule: packed real-text sequences, read from the token store's memory-mapped
shards, mixed with synthetic retrieval sequences, served in an order that is a pure function of
(seed, step), so a resumed run sees exactly the batches the uninterrupted run would have seen."""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hybrid_lightning.config import RunConfig
from hybrid_lightning.data.corpus import iter_documents
from hybrid_lightning.data.integrity import fingerprint
from hybrid_lightning.data.store import Store, TokenStream, open_store
from hybrid_lightning.data.synthetic import RetrievalSynth
from hybrid_lightning.data.tokenizer import load_tokenizer

TRAIN_STREAM, VAL_STREAM = 0, 1  # RNG stream ids: train and validation samples never coincide
# The validation sets (LMDataModule.val_sets): held-out real text, synthetic retrieval sequences, data.text_val_files
VAL_HELD_OUT, VAL_SYNTHETIC, VAL_TEXT = "held_out", "synthetic", "text"


MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit integers that scatters every input bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
    return x ^ (x >> 31)


def permute(i: int, n: int, keys: tuple[int, ...]) -> int:
    """Image of ``i`` under a pseudo-random permutation of range(n) chosen by ``keys``, in O(1) time and
    memory: a Feistel network (one round per key) on the smallest 4^h >= n values, applied again
    while the image falls outside range(n) (cycle walking, on average fewer than 4 times)."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = i
    while True:
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        x = (left << half) | right
        if x < n:
            return x


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) token ids -> (B, T) document ids for ``data.doc_mask``: a document ends with its end-of-document
    token, so the token after an eos starts the next one (ids count the eos tokens before each position)."""
    ends = (tokens == eos_id).long()
    return ends.cumsum(dim=1) - ends


class MixedSequences(Dataset):
    """Item g (a global sample id) is a (seq_len + 1)-token sequence: synthetic with probability
    ``fraction``, else real window permute(g mod n) of epoch e = g // n (a fresh permutation of the
    n windows per epoch, computed per item: no memory that grows with the corpus). ``tokens`` is a
    flat array or a store's TokenStream."""

    def __init__(self, tokens, seq_len: int, seed: int, synth: RetrievalSynth | None, fraction: float, stream: int):
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.synth, self.fraction, self.stream = synth, fraction, stream
        self.n = (tokens.size - 1) // seq_len
        self._keys: tuple[int, tuple[int, ...]] | None = None

    def is_synthetic(self, g: int) -> bool:
        return self.synth is not None and np.random.default_rng([self.seed, self.stream, 0, g]).random() < self.fraction

    def window(self, g: int) -> int:
        """The real window (its start / seq_len) that sample g reads."""
        epoch, pos = divmod(g, self.n)
        if self._keys is None or self._keys[0] != epoch:
            state = np.random.SeedSequence([self.seed, self.stream, 2, epoch]).generate_state(4, np.uint64)
            self._keys = (epoch, tuple(int(k) for k in state))
        return permute(pos, self.n, self._keys[1])

    def __getitem__(self, g: int) -> torch.Tensor:
        if self.is_synthetic(g):
            ids, _ = self.synth.sample(np.random.default_rng([self.seed, self.stream, 1, g]), self.seq_len + 1)
            return torch.from_numpy(ids)
        start = self.window(g) * self.seq_len
        return torch.from_numpy(np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64))

    def __len__(self) -> int:  # a nominal epoch; the step sampler indexes beyond it
        return self.n


class StepSampler(Sampler[list[int]]):
    """Yields, for optimizer steps start, start+1, ..., this rank's slice of the global batch in
    ``accumulate`` micro-batches of B: micro-batch a of step s on rank r of w takes global sample ids
    from ((s*w + r)*A + a)*B on, so a step's samples do not depend on how it is split (B x A)."""

    def __init__(self, batch_size: int, start_step: int, rank: int = 0, world: int = 1, accumulate: int = 1):
        self.batch_size, self.start_step, self.rank, self.world = batch_size, start_step, rank, world
        self.accumulate = accumulate

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            for a in range(self.accumulate):
                base = ((step * self.world + self.rank) * self.accumulate + a) * self.batch_size
                yield list(range(base, base + self.batch_size))
            step += 1


class LMDataModule(L.LightningDataModule):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.data.tokenizer)
        self.train_tokens: TokenStream | None = None  # the store's shards, memory-mapped
        self.text_val_tokens: np.ndarray | None = None  # data.text_val_files, for val/text_loss
        self.store: Store | None = None
        self.fingerprint: dict | None = None  # of the data (data.store.fingerprint), saved in checkpoints

    def prepare_data(self) -> None:
        open_store(self.cfg.data, tokenizer=self.tokenizer)  # prepares the token store once (local rank 0)

    def setup(self, stage: str | None = None) -> None:
        if self.train_tokens is not None:
            return
        store = open_store(self.cfg.data, tokenizer=self.tokenizer)
        store.check_fits(self.cfg.train.seq_len)
        self.store, self.train_tokens, self.fingerprint = store, store.train, fingerprint(store.manifest)
        if self.cfg.data.text_val_files:
            self.text_val_tokens = self._text_val_tokens()

    @property
    def val_tokens(self) -> np.ndarray | None:
        """The validation split, memory-mapped (checked when first used)."""
        return self.store.val if self.store is not None else None

    def _text_val_tokens(self) -> np.ndarray:
        """The documents of ``data.text_val_files``, tokenized and joined by end-of-document tokens."""
        d = self.cfg.data
        docs = iter_documents(d.model_copy(update={"files": d.text_val_files, "hub": None}))
        tokens = np.concatenate([np.r_[self.tokenizer.encode(doc), self.tokenizer.eos_id] for doc in docs]
                                or [np.zeros(0)])
        if tokens.size < self.cfg.train.seq_len + 1:
            raise ValueError(f"data.text_val_files: {tokens.size} tokens, fewer than one sequence of train.seq_len + 1 "
                             f"= {self.cfg.train.seq_len + 1}")
        return tokens.astype(np.int64)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step if trainer is not None else 0
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = StepSampler(self.cfg.train.batch_size, start, rank, world, self.cfg.train.accumulate_grad_batches)
        syn = self.cfg.data.synthetic
        synth = RetrievalSynth(self.tokenizer, self.train_tokens, syn) if syn.fraction > 0 else None
        dataset = MixedSequences(self.train_tokens, self.cfg.train.seq_len, self.cfg.seed, synth, syn.fraction,
                                 TRAIN_STREAM)
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=self.cfg.data.num_workers,
            persistent_workers=self.cfg.data.num_workers > 0,
        )

    def _windows(self, tokens: np.ndarray) -> torch.Tensor:
        """Up to train.val_batches x batch_size sequences of seq_len + 1 tokens spread evenly over ``tokens``."""
        n, T = self.cfg.train.val_batches * self.cfg.train.batch_size, self.cfg.train.seq_len
        n_windows = (tokens.size - 1) // T
        starts = np.linspace(0, n_windows - 1, min(n, n_windows)).astype(int) * T
        return torch.stack([torch.from_numpy(np.asarray(tokens[s : s + T + 1], dtype=np.int64)) for s in starts])

    def val_sets(self) -> list[str]:
        """What each loader of ``val_dataloader`` holds, in its order: held-out real text (``VAL_HELD_OUT``,
        val/loss); when mixed in, synthetic retrieval sequences with the mask of their queried-value tokens
        (``VAL_SYNTHETIC``); with ``data.text_val_files``, their natural text (``VAL_TEXT``, val/text_loss)."""
        d = self.cfg.data
        return [VAL_HELD_OUT] + [VAL_SYNTHETIC] * (d.synthetic.fraction > 0) + [VAL_TEXT] * bool(d.text_val_files)

    def val_dataloader(self) -> list[DataLoader]:
        """Fixed sets, one loader per ``val_sets`` entry."""
        return [self._val_loader(name) for name in self.val_sets()]

    def _val_loader(self, name: str) -> DataLoader:
        B, n, T = (self.cfg.train.batch_size, self.cfg.train.val_batches * self.cfg.train.batch_size,
                   self.cfg.train.seq_len)
        if name == VAL_HELD_OUT:
            return DataLoader(self._windows(self.val_tokens), batch_size=B)
        if name == VAL_TEXT:
            return DataLoader(self._windows(self.text_val_tokens), batch_size=B)
        synth = RetrievalSynth(self.tokenizer, self.val_tokens, self.cfg.data.synthetic)
        samples = [synth.sample(np.random.default_rng([self.cfg.seed, VAL_STREAM, 1, i]), T + 1) for i in range(n)]
        seqs = torch.stack([torch.from_numpy(ids) for ids, _ in samples])  # (n, T+1)
        targets = torch.stack([torch.from_numpy(mask) for _, mask in samples])  # (n, T+1) queried values
        return DataLoader(torch.utils.data.TensorDataset(seqs, targets), batch_size=B)
