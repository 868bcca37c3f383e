"""Tokenizers: byte-level by default (nothing to download), or a ``tokenizers`` JSON file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus one end-of-document id (256)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A Hugging Face ``tokenizers`` file; its end-of-document token must be one of EOS_NAMES."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - tokenizers is a dependency
            raise ValueError("data.tokenizer: a JSON tokenizer needs the 'tokenizers' package") from e
        self._tok = Tokenizer.from_file(path)
        self.name = f"json:{hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]}"
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(n) for n in EOS_NAMES]
        found = [i for i in ids if i is not None]
        if not found:
            raise ValueError(f"data.tokenizer {path}: no end-of-document token; expected one of {list(EOS_NAMES)}")
        self.eos_id = found[0]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(spec: str) -> ByteTokenizer | JsonTokenizer:
    if spec == "byte":
        return ByteTokenizer()
    if not Path(spec).is_file():
        raise ValueError(f"data.tokenizer: file not found: {spec} (accepted: 'byte' or a tokenizers JSON file)")
    return JsonTokenizer(spec)
