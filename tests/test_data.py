import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import LMDataModule, MixedSequences, StepSampler
from hybrid_lightning.data.store import load_corpus
from hybrid_lightning.data.synthetic import FACT_TEMPLATES, QUERY_TEMPLATES, RetrievalSynth
from hybrid_lightning.data.tokenizer import ByteTokenizer


def test_step_sampler_is_a_function_of_the_step():
    full = iter(StepSampler(4, 0))
    batches = [next(full) for _ in range(10)]
    resumed = iter(StepSampler(4, 6))
    assert [next(resumed) for _ in range(4)] == batches[6:]
    r0, r1 = iter(StepSampler(2, 3, rank=0, world=2)), iter(StepSampler(2, 3, rank=1, world=2))
    assert next(r0) + next(r1) == list(range(12, 16))


def test_mixed_sequences_are_deterministic_and_mixed():
    tok = ByteTokenizer()
    stream = np.arange(5000) % 200
    synth = RetrievalSynth(tok, stream, validate_config({}).data.synthetic)
    ds = MixedSequences(stream, 64, seed=3, synth=synth, fraction=0.5, stream=0)
    again = MixedSequences(stream, 64, seed=3, synth=synth, fraction=0.5, stream=0)
    for g in (0, 5, 77, 100_000):  # beyond one epoch too
        assert torch.equal(ds[g], again[g]) and ds[g].shape == (65,)
    share = np.mean([ds.is_synthetic(g) for g in range(2000)])
    assert 0.45 < share < 0.55
    other_seed = MixedSequences(stream, 64, seed=4, synth=synth, fraction=0.5, stream=0)
    assert any(not torch.equal(ds[g], other_seed[g]) for g in range(10))


def test_synthetic_queries_repeat_earlier_facts():
    tok = ByteTokenizer()
    synth = RetrievalSynth(tok, np.frombuffer(b"filler text " * 100, np.uint8).astype(np.int64),
                           validate_config({}).data.synthetic)
    ids, mask = synth.sample(np.random.default_rng(0), 2000)
    assert ids.shape == mask.shape == (2000,)
    text = tok.decode(ids)
    # every fully visible queried value was stated earlier in the sequence
    spans = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    checked = 0
    for start, end in zip(spans[::2], spans[1::2]):
        if end < len(ids):
            value = tok.decode(ids[start:end])
            assert value in tok.decode(ids[:start]), value
            checked += 1
    assert checked > 10
    assert 0.1 < mask.mean() < 0.3
    # probe templates stay out of training
    for template in FACT_TEMPLATES + QUERY_TEMPLATES:
        assert "magic" not in template and "pass key" not in template
    assert "magic" not in text


def test_local_files_of_every_format(tmp_path):
    docs = [f"document {i}: " + "lorem ipsum " * (20 + i) for i in range(60)]
    (tmp_path / "a.txt").write_text(docs[0])
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs[1:30]))
    pq.write_table(pa.table({"body": docs[30:]}), tmp_path / "c.parquet")
    cfg = validate_config(
        {"data": {"files": [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), str(tmp_path / "c.parquet")],
                  "text_field": "body", "val_fraction": 0.1, "cache_dir": str(tmp_path / "cache")}}
    ).data
    train, val = load_corpus(cfg, ByteTokenizer())
    total = sum(len(d.encode()) + 1 for d in docs)
    assert train.size + val.size == total
    assert 0 < val.size < 0.2 * total
    assert (np.asarray(train) == 256).sum() + (np.asarray(val) == 256).sum() == 60
    # cached: the second call reads the same arrays
    train2, _ = load_corpus(cfg, ByteTokenizer())
    assert np.array_equal(train, train2)


def test_wrong_text_field_names_the_field(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    cfg = validate_config({"data": {"files": [str(tmp_path / "a.jsonl")], "cache_dir": str(tmp_path)}}).data
    with pytest.raises(ValueError, match="data.text_field"):
        load_corpus(cfg, ByteTokenizer())


def test_embedded_default_has_train_and_val():
    dm = LMDataModule(validate_config({"data": {"max_tokens": 500_000}}))
    dm.setup()
    assert dm.train_tokens.size == 500_000 and dm.val_tokens.size > 2_000
    real, synth = dm.val_dataloader()
    assert next(iter(real)).shape == (16, 129)
    tokens, targets = next(iter(synth))
    assert tokens.shape == targets.shape == (16, 129) and targets.dtype == torch.bool
    assert 0.02 < targets.float().mean() < 0.4


def test_documents_of_seq_len_minus_one_tokens_fill_one_window_each(tmp_path):
    """With the end-of-document token, documents of train.seq_len - 1 tokens make every real training
    window exactly one document (as ablations/cpu_replica.yaml relies on): each window starts at a
    document's first token and holds its end-of-document token last."""
    rng = np.random.default_rng(0)
    docs = ["".join(rng.choice(list("abcdefgh"), 63)) for _ in range(200)]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    cfg = validate_config({"data": {"files": [str(tmp_path / "docs.jsonl")], "cache_dir": str(tmp_path / "cache"),
                                    "synthetic": {"fraction": 0.0}}, "train": {"seq_len": 64}})
    train, _ = load_corpus(cfg.data, ByteTokenizer())
    ds = MixedSequences(train, 64, seed=0, synth=None, fraction=0.0, stream=0)
    starts = {d.encode() for d in docs}
    for g in range(len(ds)):
        window = ds[g].numpy()  # (65,): one document, its end-of-document token, the next document's first token
        assert bytes(window[:63].astype(np.uint8)) in starts and window[63] == 256
