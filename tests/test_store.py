"""The token store (hybrid_lightning/data/store.py): the same tokens as the flat corpus it replaces,
resumable preparation, exact training resume from shards, and clean errors on bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import TINY, run_cli
from hybrid_lightning.cli import main
from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import LMDataModule, MixedSequences, StepSampler, permute
from hybrid_lightning.data.shards import GOLDEN
from hybrid_lightning.data.store import open_store
from hybrid_lightning.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

WORDS = ["the", "model", "reads", "a", "long", "document", "and", "recalls", "every", "key", "value", "of", "it",
         "ünïcödé", "line", "window", "state"]


def documents(n: int, seed: int = 0, words: tuple[int, int] = (5, 400)) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(*words)))) + "\n" for _ in range(n)]


def write_corpus(folder, docs: list[str]) -> list[str]:
    """The documents over a text file, a JSON-lines file, a parquet file and a JSON-array file."""
    folder.mkdir(parents=True, exist_ok=True)
    q = len(docs) // 4
    (folder / "a.txt").write_text(docs[0].replace("\n", "\r\n"))  # one file, one document; CRLF read as LF
    (folder / "b.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs[1:2 * q]) + "\n\n")
    pq.write_table(pa.table({"body": docs[2 * q : 3 * q]}), folder / "c.parquet", row_group_size=7)
    (folder / "d.json").write_text(json.dumps([{"body": d} for d in docs[3 * q :]]))
    return [str(folder / n) for n in ("a.txt", "b.jsonl", "c.parquet", "d.json")]


def flat_corpus(files, field, tokenizer, val_fraction, max_tokens=None):
    """The flat corpus as the package built it before the store: documents read by `datasets`,
    document i held out when frac(i * golden) < val_fraction, training tokens cut at max_tokens."""
    import datasets

    docs = []
    for f in files:
        kind = {".txt": "text", ".parquet": "parquet"}.get(os.path.splitext(f)[1], "json")
        ds = datasets.load_dataset(kind, data_files=[f], split="train", cache_dir=str(os.path.dirname(f) + "/hf"),
                                   **({"sample_by": "document"} if kind == "text" else {}))
        docs += [row["text" if kind == "text" else field] for row in ds]
    train, val, n = [], [], 0
    for i, doc in enumerate(d for d in docs if d):
        ids = np.append(tokenizer.encode(doc), tokenizer.eos_id)
        if (i * GOLDEN) % 1.0 < val_fraction:
            val.append(ids)
            continue
        if max_tokens is not None and n + ids.size >= max_tokens:
            train.append(ids[: max_tokens - n])
            break
        train.append(ids)
        n += ids.size
    return np.concatenate(train), np.concatenate(val)


def data_config(tmp_path, files, **extra):
    return validate_config({"data": {"files": files, "text_field": "body", "val_fraction": 0.1,
                                     "cache_dir": str(tmp_path / "cache"), "shard_mb": 0.004, **extra}}).data


@pytest.mark.parametrize("max_tokens", [None, 30_000])
@pytest.mark.parametrize("workers", [1, 2])
def test_store_equals_the_flat_corpus(tmp_path, workers, max_tokens):
    files = write_corpus(tmp_path / "src", documents(120))
    cfg = data_config(tmp_path, files, max_tokens=max_tokens)
    store = open_store(cfg, workers=workers)
    train, val = flat_corpus(files, "body", ByteTokenizer(), 0.1, max_tokens)
    assert len(store.manifest["shards"]) > 5  # several shards, windows across their boundaries
    assert np.array_equal(store.train[:], train) and np.array_equal(store.val, val)
    assert store.train.size == (max_tokens or train.size)
    docs = np.concatenate([np.load(store.folder / s["docs"]) for s in store.manifest["shards"]])
    assert docs.sum() == train.size and np.load(store.folder / "val.docs.npy").sum() == val.size
    # a second open reads the manifest, prepares nothing
    assert open_store(cfg).manifest == store.manifest


def test_store_with_a_trained_bpe_equals_the_flat_corpus(tmp_path):
    docs = documents(60, seed=1)
    files = write_corpus(tmp_path / "src", docs)
    tok = train_bpe(iter(docs), 300, tmp_path / "bpe.json")
    store = open_store(data_config(tmp_path, files, tokenizer=str(tmp_path / "bpe.json")), workers=2)
    train, val = flat_corpus(files, "body", tok, 0.1)
    assert store.manifest["dtype"] == "uint16" and store.manifest["eos_id"] == tok.eos_id
    assert np.array_equal(store.train[:], train) and np.array_equal(store.val, val)


def test_token_stream_slices_across_shards(tmp_path):
    files = write_corpus(tmp_path / "src", documents(80))
    store = open_store(data_config(tmp_path, files))
    flat = store.train[:]
    ends = np.cumsum([s["tokens"] for s in store.manifest["shards"]])
    for a in [0, int(ends[0]) - 3, int(ends[2]) - 1, flat.size - 10]:
        assert np.array_equal(store.train[a : a + 2000], flat[a : a + 2000])
    assert store.train[flat.size : flat.size + 5].size == 0


def _file_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_killed_prepare_resumes_to_the_same_store(tmp_path):
    """SIGKILL in the middle of `data prepare`, torn files left behind; prepare again: the same store."""
    docs = documents(1200, seed=2)
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    tok = tmp_path / "bpe.json"
    train_bpe(iter(docs[:100]), 400, tok)
    args = ["data", "prepare", "--set", f"data.files=[{tmp_path / 'docs.jsonl'}]", "--set", f"data.tokenizer={tok}",
            "--set", "data.shard_mb=0.02", "--workers", "1"]
    whole = run_cli(*args, "--set", f"data.store={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "hybrid_lightning", *args, "--set", f"data.store={killed}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "shard_00004.json").exists():
        assert proc.poll() is None and time.time() < deadline, "prepare ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "manifest.json").exists()
    with pytest.raises(ValueError, match="no token store"):  # a partial store is never read
        open_store(validate_config({"data": {"files": [str(tmp_path / "docs.jsonl")], "tokenizer": str(tok),
                                             "store": str(killed), "shard_mb": 0.02}}).data, build=False)
    (killed / ".train_00004.bin.k1ll3d.tmp").write_bytes(b"torn")  # a rewrite cut short (of a file the store lists)
    (killed / "shard_00003.json").write_text("{")  # and a record cut short: units 3.. are redone
    resumed = run_cli(*args, "--set", f"data.store={killed}")
    assert resumed.returncode == 0, resumed.stderr
    assert _file_bytes(killed) == _file_bytes(tmp_path / "whole")


def test_permutation_is_a_bijection():
    for n in (1, 2, 3, 17, 1000, 4097):
        keys = (11, 22, 33, 44)
        image = [permute(i, n, keys) for i in range(n)]
        assert sorted(image) == list(range(n))
    assert [permute(i, 1000, (1, 2, 3, 4)) for i in range(20)] != [permute(i, 1000, (5, 6, 7, 8)) for i in range(20)]


def test_batches_from_a_store_resume_exactly(tmp_path):
    """A dataloader started at step k gives the batches an uninterrupted one gives from step k, over a
    store of many shards; and the windows are the flat stream's windows."""
    files = write_corpus(tmp_path / "src", documents(200))
    cfg = validate_config({"data": {"files": files, "text_field": "body", "val_fraction": 0.1, "shard_mb": 0.004,
                                    "cache_dir": str(tmp_path / "cache")}, "train": {"batch_size": 4, "seq_len": 64}})
    dm = LMDataModule(cfg)
    dm.setup()
    assert len(dm.train_tokens.paths) > 5
    def batches(start, n):
        data = dm.train_dataloader().dataset
        it = iter(StepSampler(4, start))
        return [torch.stack([data[g] for g in next(it)]) for _ in range(n)]
    straight = batches(0, 12)
    assert all(torch.equal(a, b) for a, b in zip(straight[7:], batches(7, 5)))
    flat = dm.train_tokens[:]
    ds = MixedSequences(dm.train_tokens, 64, seed=0, synth=None, fraction=0.0, stream=0)
    windows = {ds.window(g) for g in range(ds.n)}
    assert windows == set(range(ds.n))  # one epoch visits every window once
    g = 5
    assert np.array_equal(ds[g].numpy(), flat[ds.window(g) * 64 : ds.window(g) * 64 + 65])


def test_one_document_corpus_trains(tmp_path):
    """A single document: its tail is held out for validation instead of the whole document."""
    (tmp_path / "book.txt").write_text(documents(1, words=(9000, 9001))[0])
    cfg = validate_config({"data": {"files": [str(tmp_path / "book.txt")], "cache_dir": str(tmp_path / "cache")}}).data
    store = open_store(cfg)
    total = (tmp_path / "book.txt").stat().st_size + 1
    assert store.train.size == int(total * 0.98) and store.train.size + store.val.size == total
    run = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run), *TINY[:-2], "--set", f"data.files=[{tmp_path / 'book.txt'}]",
                "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.max_steps=2",
                "--set", "train.warmup_steps=0", "--set", "eval.every_n_steps=0", "--set", "eval.at_end=false",
                "--set", "eval.heads.at_end=false", "--set", "eval.heads.every_n_steps=0",
                "--set", "train.val_batches=1")
    assert r.returncode == 0, r.stderr[-2000:]


def test_long_document_filter(tmp_path):
    docs = documents(80, seed=3)
    files = write_corpus(tmp_path / "src", docs)
    store = open_store(data_config(tmp_path, files, min_doc_tokens=1000))
    lengths = np.concatenate([np.load(store.folder / s["docs"]) for s in store.manifest["shards"]]
                             + [np.load(store.folder / "val.docs.npy")])
    kept = [d for d in docs if len(d.encode()) >= 1000]
    assert 0 < len(kept) < len(docs) and sorted(lengths - 1) == sorted(len(d.encode()) for d in kept)


BAD_INPUTS = {
    "binary": (lambda p: p.joinpath("x.txt").write_bytes(b"GIF89a\x00\x01\x02" * 50), "x.txt", "binary"),
    "latin-1": (lambda p: p.joinpath("x.txt").write_bytes("caf\xe9 au lait".encode("latin-1")), "x.txt", "not UTF-8"),
    "latin-1 far in": (lambda p: p.joinpath("x.txt").write_bytes(b"a" * 200_000 + "\xe9".encode("latin-1")), "x.txt",
                       "byte 200000"),
    "empty": (lambda p: p.joinpath("x.txt").write_bytes(b""), "x.txt", "empty"),
    "no text field": (lambda p: p.joinpath("x.jsonl").write_text(json.dumps({"content": "hello"}) + "\n"), "x.jsonl",
                      "data.text_field"),
    "bad json": (lambda p: p.joinpath("x.jsonl").write_text('{"text": "a"}\n{"text": \n'), "x.jsonl", "invalid JSON"),
}


def cli(capsys, *args):
    """(exit code, stderr) of the command line run in this process."""
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_a_clean_error_and_creates_nothing(tmp_path, capsys, case):
    make, name, message = BAD_INPUTS[case]
    src = tmp_path / "src"
    src.mkdir()
    make(src)
    cache, run = tmp_path / "cache", tmp_path / "run"
    for args in (["train", "--run-dir", str(run)], ["data", "prepare"]):
        code, err = cli(capsys, *args, "--set", f"data.files=[{src / name}]", "--set", f"data.cache_dir={cache}")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert message in err and name in err
        assert not run.exists()
        assert not list(cache.glob("store/*/*")), list(cache.rglob("*"))


def test_bad_input_from_the_shell_is_one_line(tmp_path):
    (tmp_path / "x.txt").write_bytes(b"\x00\x01binary")
    r = run_cli("train", "--run-dir", str(tmp_path / "run"), "--set", f"data.files=[{tmp_path / 'x.txt'}]")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "x.txt looks binary" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_bad_tokenizers_are_clean_errors(tmp_path, capsys):
    (tmp_path / "tok.json").write_text('{"not": "a tokenizer"}')
    (tmp_path / "folder").mkdir()
    for spec, message in ((tmp_path / "tok.json", "does not load"), (tmp_path / "folder", "without tokenizer.json"),
                          (tmp_path / "missing.json", "not found")):
        code, err = cli(capsys, "data", "prepare", "--set", f"data.tokenizer={spec}",
                        "--set", f"data.cache_dir={tmp_path}")
        assert code == 2 and "data.tokenizer" in err and message in err, err


def test_hugging_face_tokenizer_folder(tmp_path):
    docs = documents(30, seed=4)
    folder = tmp_path / "hf"
    train_bpe(iter(docs), 280, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    tok = load_tokenizer(str(folder))
    assert tok.decode(tok.encode(docs[0])) == docs[0] and tok.vocab_size == 280


def test_a_store_for_another_config_is_refused(tmp_path):
    files = write_corpus(tmp_path / "src", documents(40))
    open_store(data_config(tmp_path, files, store=str(tmp_path / "store")))
    with pytest.raises(ValueError, match=r"data.store: .* another config \(differs in: val"):
        open_store(data_config(tmp_path, files, store=str(tmp_path / "store"), val_fraction=0.2))
    (tmp_path / "store" / "val.bin").write_bytes(b"xx")
    with pytest.raises(ValueError, match="val.bin is missing or not"):
        open_store(data_config(tmp_path, files, store=str(tmp_path / "store")))


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_probes_and_synthetic_data_with_byte_and_trained_bpe(tmp_path, kind):
    """Probes (all tasks, essay haystacks from a store's validation split) and synthetic retrieval
    sequences are exact in length and decode to what they state, with either tokenizer."""
    from hybrid_lightning.data.synthetic import RetrievalSynth
    from hybrid_lightning.probes.tasks import TASKS, GenContext, make_sample

    docs = documents(200, seed=5)
    files = write_corpus(tmp_path / "src", docs)
    spec = "byte"
    if kind == "bpe":
        spec = str(tmp_path / "bpe.json")
        assert main(["data", "tokenizer", "--set", f"data.files={files}", "--set", "data.text_field=body",
                     "--vocab-size", "400", "--out", spec]) == 0
    tok = load_tokenizer(spec)
    assert tok.vocab_size == 257 if kind == "byte" else 257 < tok.vocab_size <= 400  # merges run out on a small corpus
    store = open_store(data_config(tmp_path, files, tokenizer=spec, val_fraction=0.3))
    ctx = GenContext(tok, store.val)
    for task in sorted(TASKS):
        s = make_sample(task, ctx, 1500, 0.5, 0)
        assert len(s.prompt) + len(s.answer) == 1500
        has = s.answer_source >= 0
        assert (s.prompt[s.answer_source[has]] == s.answer[has]).all()
    synth = RetrievalSynth(tok, store.train, validate_config({}).data.synthetic)
    ids, mask = synth.sample(np.random.default_rng(0), 1500)
    assert ids.shape == mask.shape == (1500,) and ids.max() < tok.vocab_size
    spans = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    values = [tok.decode(ids[a:b]) for a, b in zip(spans[::2], spans[1::2]) if b < ids.size]
    assert values and all(v in tok.decode(ids[:a]) for v, a in zip(values, spans[::2]))


def _open_in_child(cfg, out):
    out.put(open_store(cfg, workers=1).manifest)


def test_concurrent_opens_build_once(tmp_path, capfd):
    """Processes that open a missing store at once: one prepares it, the others wait and read it."""
    import multiprocessing

    files = write_corpus(tmp_path / "src", documents(150))
    cfg = data_config(tmp_path, files)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_open_in_child, args=(cfg, out)) for _ in range(3)]
    for p in procs:
        p.start()
    manifests = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert manifests[0] == manifests[1] == manifests[2]
    assert capfd.readouterr().out.count("data: prepared the token store") == 1


@pytest.mark.slow  # three short training runs: about 45 s on 2 busy cores
def test_training_resumes_exactly_from_a_sharded_store(tmp_path):
    """15 steps, then 15 more from the checkpoint, on a store of many shards, equal 30 straight steps."""
    files = write_corpus(tmp_path / "src", documents(300, seed=6))
    args = [*TINY[:-2], "--set", f"data.files={files}", "--set", "data.text_field=body", "--set", "data.shard_mb=0.01",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.seq_len=64", "--set", "train.batch_size=4",
            "--set", "train.schedule=constant", "--set", "train.warmup_steps=0",
            "--set", "train.checkpoint_every_n_steps=15", "--set", "eval.every_n_steps=0", "--set", "eval.at_end=false",
            "--set", "eval.heads.every_n_steps=0", "--set", "eval.heads.at_end=false",
            "--set", "train.val_every_n_steps=1000"]
    for run, steps in (("straight", [30]), ("resumed", [15, 30])):
        for n in steps:
            r = run_cli("train", "--run-dir", str(tmp_path / run), *args, "--set", f"train.max_steps={n}")
            assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from" in r.stdout
    stores = list((tmp_path / "cache" / "store").glob("*/manifest.json"))
    assert len(stores) == 1 and len(json.loads(stores[0].read_text())["shards"]) > 10
    a, b = (torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
            for run in ("straight", "resumed"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
