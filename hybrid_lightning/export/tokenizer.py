"""The run's tokenizer as ``transformers`` files (``AutoTokenizer.from_pretrained(folder)``, no remote code).

The byte tokenizer becomes a byte-level BPE without merges: every UTF-8 byte b is token b, and the
end-of-document token (id 256) a special token. A ``tokenizers`` JSON file is carried as it is.
"""

from __future__ import annotations

from pathlib import Path

from hybrid_lightning.data.tokenizer import EOS_NAMES, ByteTokenizer, JsonTokenizer


def byte_chars() -> list[str]:
    """The character byte-level pre-tokenization writes for each byte 0..255 (GPT-2's table, which
    ``tokenizers``' ByteLevel uses): printable Latin-1 bytes stand for themselves, the others in byte
    order for chr(256), chr(257), ..."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, n = [], 0
    for b in range(256):
        chars.append(chr(b) if b in printable else chr(256 + n))
        n += b not in printable
    return chars


def byte_tokenizer():
    """A ``tokenizers.Tokenizer`` equal to ``ByteTokenizer``: ids 0..255 the bytes, 256 the end of a document."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(byte_chars())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_NAMES[0], special=True)])
    assert tok.token_to_id(EOS_NAMES[0]) == ByteTokenizer.eos_id
    return tok


def write_tokenizer(tok: ByteTokenizer | JsonTokenizer, out: Path) -> None:
    """Writes ``tokenizer.json`` and ``tokenizer_config.json`` of the run's loaded tokenizer ``tok`` (from a
    ``tokenizers`` file or a tokenizer folder alike) into ``out``."""
    from transformers import PreTrainedTokenizerFast

    inner = byte_tokenizer() if isinstance(tok, ByteTokenizer) else tok.backend
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=inner.id_to_token(tok.eos_id),
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(Path(out))
