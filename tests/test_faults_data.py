"""Faults of the token store that cost a user's data or let wrong data through: a store folder among the
user's own files, damaged shards, a corpus edited between a kill and the rerun, and failing commands
that would leave a store or a lock behind."""

import json
import time

import pytest

from conftest import TINY, run_cli
from hybrid_lightning.cli import main
from hybrid_lightning.config import validate_config
from hybrid_lightning.data.store import open_store
from test_faults import args, one_line_error, train
from test_store import documents


def write_jsonl(path, docs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def cli(capsys, *argv):
    """(exit code, stderr) of the command line run in this process."""
    code = main(list(argv))
    return code, capsys.readouterr().err


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_folder_of_user_files_is_never_a_store(tmp_path, capsys):
    d = tmp_path / "d"
    part, val = write_jsonl(d / "train_part1.json", documents(30)), write_jsonl(d / "val.jsonl", documents(5, seed=1))
    for name in ("val.csv", "train_log.json", "manifest.txt", "manifest.json"):
        (d / name).write_text("the user's own " + name)
    before = snapshot(d)
    code, err = cli(capsys, "data", "prepare", "--set", f"data.files=[{part},{val}]", "--set", f"data.store={d}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a token store" in err, err
    assert snapshot(d) == before  # the corpus and every other file are intact
    (tmp_path / "f").write_text("a file")
    code, err = cli(capsys, "data", "prepare", "--set", f"data.files=[{part}]", "--set", f"data.store={tmp_path / 'f'}")
    assert code == 2 and "is a file" in err and (tmp_path / "f").read_text() == "a file"


def test_only_files_the_store_wrote_are_removed(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "src" / "c.jsonl", documents(60))
    store = tmp_path / "store"
    store.mkdir()  # an empty folder is adopted
    argv = ["data", "prepare", "--set", f"data.files=[{corpus}]", "--set", f"data.store={store}",
            "--set", "data.shard_mb=0.004"]
    assert cli(capsys, *argv)[0] == 0
    from hybrid_lightning.data.store_folder import MARKER

    listed = set(json.loads((store / MARKER).read_text())["files"])
    assert listed == {p.name for p in store.iterdir()} - {MARKER, ".lock"}  # every file written is listed
    user = {"val.csv": "mine", "train_00000.bin.bak": "mine too", "shard_99999.json": "{}"}
    for name, text in user.items():
        (store / name).write_text(text)
    shard = store / "train_00001.bin"
    shard.write_bytes(bytes(255 - b for b in shard.read_bytes()))  # damaged: prepare builds the store again
    code, err = cli(capsys, *argv)
    assert code == 0, err
    assert all((store / n).read_text() == t for n, t in user.items())
    data = validate_config({"data": {"files": [str(corpus)], "store": str(store), "shard_mb": 0.004}}).data
    assert open_store(data).damaged() is None


def test_a_failed_prepare_leaves_a_user_folder_as_it_was(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a" * 70_000}) + "\n" + '{"text": \n')  # the bad line is past the sniffed start
    empty, cache = tmp_path / "empty", tmp_path / "cache"
    empty.mkdir()
    for where in (f"data.store={empty}", f"data.cache_dir={cache}"):
        code, err = cli(capsys, "data", "prepare", "--set", f"data.files=[{bad}]", "--set", where)
        assert code == 2 and "invalid JSON" in err and len(err.strip().splitlines()) == 1, err
    assert empty.is_dir() and not list(empty.iterdir())
    assert not cache.exists()  # no store, no lock, no folder


def _corrupt(store, name="train_00000.bin", at=100):
    path = store / name
    data = bytearray(path.read_bytes())
    data[at : at + 4] = b"\xff\xfe\xff\xfe"  # same size; ids 65534+ are out of the byte vocabulary too
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_corrupted_shard_is_one_line_naming_it_and_prepare_rebuilds_it(tmp_path):
    corpus = write_jsonl(tmp_path / "src" / "c.jsonl", documents(300, seed=2))
    store = tmp_path / "store"
    data = ["--set", f"data.files=[{corpus}]", "--set", f"data.store={store}", "--set", "data.shard_mb=0.01"]
    run = tmp_path / "run"
    assert train(run, *args(4, 2), *data).returncode == 0
    good = (store / "train_00000.bin").read_bytes()
    _corrupt(store)
    r = train(tmp_path / "run2", *args(4, 2), *data)
    line = one_line_error(r)
    assert "train_00000.bin" in line and "damaged" in line and "data prepare" in line, line
    r = run_cli("data", "prepare", *TINY, *data)
    assert r.returncode == 0 and "damaged; preparing the store again" in r.stdout, r.stderr[-2000:]
    assert (store / "train_00000.bin").read_bytes() == good
    assert train(tmp_path / "run2", *args(4, 2), *data).returncode == 0


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", documents(40))
    cfg = validate_config({"data": {"files": [str(corpus)], "store": str(tmp_path / "s")}}).data
    store = open_store(cfg)
    manifest = json.loads((store.folder / "manifest.json").read_text())
    for entry in manifest["shards"]:
        entry["sha256"] = None  # a store whose checksums say nothing: the ids are still checked
    (store.folder / "manifest.json").write_text(json.dumps(manifest))
    _corrupt(store.folder)
    with pytest.raises(ValueError, match=r"train_00000.bin holds token id 6\d+, not below the vocabulary size 257"):
        open_store(cfg).train[:]


@pytest.mark.slow
def test_resume_on_changed_data_is_refused_naming_the_difference(tmp_path):
    corpus = write_jsonl(tmp_path / "src" / "c.jsonl", documents(200, seed=3))
    run, cache = tmp_path / "run", tmp_path / "cache"
    data = ["--set", f"data.files=[{corpus}]", "--set", f"data.cache_dir={cache}"]
    assert train(run, *args(4, 2), *data).returncode == 0
    corpus.touch()  # the same text, a new time: the same data
    r = train(run, *args(6, 2), *data)
    assert r.returncode == 0 and "at step 4" in r.stdout, r.stderr[-2000:]
    stores = set(cache.glob("store/*"))
    write_jsonl(corpus, documents(200, seed=4))  # the corpus edited between runs
    line = one_line_error(train(run, *args(8, 2), *data))
    assert "other data" in line and "tokens" in line, line
    assert set(cache.glob("store/*")) == stores  # the store built for the new text is removed again
    assert json.loads((run / "status.json").read_text())["step"] == 6


@pytest.mark.slow
def test_failing_train_leaves_no_store_and_no_lock(tmp_path):
    cache = tmp_path / "cache"
    tiny = write_jsonl(tmp_path / "tiny.jsonl", ["abcde"])  # 6 tokens with its end-of-document id
    corpus = write_jsonl(tmp_path / "c.jsonl", documents(50, seed=5))
    cases = [
        (["--set", f"data.files=[{tiny}]"], "train.seq_len"),
        (["--set", f"data.files=[{corpus}]", "--set", "train.seq_len=100000000"], "train.seq_len"),
        (["--set", f"data.files=[{corpus}]", "--set", "eval.heads.lengths=[8]", "--set", "eval.heads.at_end=true"],
         "eval.heads"),
    ]
    for extra, field in cases:
        line = one_line_error(train(tmp_path / "run", *args(4, 2), "--set", f"data.cache_dir={cache}", *extra))
        assert field in line, line
        assert not (tmp_path / "run").exists()
        assert not [p for p in cache.rglob("*") if p.is_file()], list(cache.rglob("*"))


@pytest.mark.parametrize("shards", [4, 40])
def test_first_batch_time_does_not_grow_with_the_store(tmp_path, shards):
    """Opening a store and reading a first batch checks only the shards read; printed for the notes."""
    from hybrid_lightning.data.datamodule import LMDataModule

    corpus = write_jsonl(tmp_path / "c.jsonl", documents(60 * shards, seed=6, words=(200, 201)))
    cfg = validate_config({"data": {"files": [str(corpus)], "store": str(tmp_path / "s"), "shard_mb": 0.06,
                                    "synthetic": {"fraction": 0.0}}, "train": {"batch_size": 4, "seq_len": 128}})
    open_store(cfg.data)
    t0 = time.perf_counter()
    dm = LMDataModule(cfg)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    seconds = time.perf_counter() - t0
    n = len(dm.train_tokens.paths)
    checked = sum(m is not None for m in dm.train_tokens._maps)
    print(f"\nstore of {n} shards ({dm.train_tokens.size:,} tokens): first batch in {seconds * 1000:.1f} ms, "
          f"{checked} shards checked")
    assert batch.shape == (4, 129) and n >= shards * 0.8 and checked <= 4
