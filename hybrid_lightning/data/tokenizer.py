"""Tokenizers: byte-level by default (nothing to download), a ``tokenizers`` JSON file, or a Hugging
Face tokenizer folder (its ``tokenizer.json``); ``train_bpe`` makes a byte-level BPE file offline."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hybrid_lightning.fileio import refuse_existing, write_atomic

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
ACCEPTED = "'byte', a tokenizers JSON file or a folder holding tokenizer.json"


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus one end-of-document id (256)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A Hugging Face ``tokenizers`` file. Its end-of-document token is the ``eos_token`` of a
    ``tokenizer_config.json`` beside it, else the first of EOS_NAMES it has."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path)
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ValueError(f"data.tokenizer: {path} does not load as a tokenizers file ({str(e)[:200]})") from None
        self.name = f"json:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        names = (*_configured_eos(path.parent / "tokenizer_config.json"), *EOS_NAMES)
        found = [i for i in (self._tok.token_to_id(n) for n in names) if i is not None]
        if not found:
            raise ValueError(f"data.tokenizer {path}: no end-of-document token; expected one of {list(EOS_NAMES)}")
        self.eos_id = found[0]

    @property
    def backend(self):
        """The loaded ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def _configured_eos(config: Path) -> tuple[str, ...]:
    """The ``eos_token`` of a Hugging Face ``tokenizer_config.json`` (a string or {"content": ...})."""
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return ()
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return (eos,) if isinstance(eos, str) else ()


def load_tokenizer(spec: str) -> ByteTokenizer | JsonTokenizer:
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"data.tokenizer: {spec} is a folder without tokenizer.json (accepted: {ACCEPTED})")
        path = path / "tokenizer.json"
    elif not path.is_file():
        raise ValueError(f"data.tokenizer: file not found: {spec} (accepted: {ACCEPTED})")
    return JsonTokenizer(path)


MAX_BPE_VOCAB = 2**20  # the trainer allocates by the size asked (10^9 aborts the process); the largest in use: ~2.6e5


def train_bpe(documents: Iterable[str], vocab_size: int, out: str | Path) -> JsonTokenizer:
    """Trains a byte-level BPE (GPT-2 style: every byte is a token, merges learned on top) with
    ``<|endoftext|>`` as its end-of-document token, saves it to ``out`` and returns it loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not 257 <= vocab_size <= MAX_BPE_VOCAB:
        raise ValueError(f"--vocab-size must be 257 (256 bytes and <|endoftext|>) to {MAX_BPE_VOCAB:,}, got "
                         f"{vocab_size}")
    refuse_existing(Path(out), "--out")  # before the training, which reads the whole corpus
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_NAMES[0]], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, tok.to_str(pretty=True))  # as Tokenizer.save writes it
    return JsonTokenizer(out)
