"""Many processes on one token store at once (hybrid_lightning/data/store_folder.py): claimed, prepared,
resumed, repaired, failed on and discarded together, as every cell of a grid starts against one
``data.store``. Every valid process succeeds and reads the same tokens; a process on bad input fails alone
and leaves no file of its own behind."""

import hashlib
import json
import multiprocessing
import shutil
import traceback

import numpy as np
import pytest

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.store import open_store
from hybrid_lightning.data.store_folder import LOCK, MARKER

PROCESSES = 8
ROUNDS = 3
WORDS = ["the", "model", "reads", "a", "long", "document", "and", "recalls", "every", "key", "ünïcödé"]


def documents(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, int(rng.integers(5, 400)))) + "\n" for _ in range(n)]


def _config(tmp_path, corpus, store):
    return validate_config({"data": {"files": [str(corpus)], "store": str(store), "shard_mb": 0.01,
                                     "val_fraction": 0.1}}).data


def _open(cfg, verify: bool, start, out, index: int) -> None:
    """One process: waits for the others, opens the store and reports (index, outcome, digest of its tokens)."""
    start.wait(timeout=60)
    try:
        store = open_store(cfg, workers=1, verify=verify)
        digest = hashlib.sha256(store.train[:].tobytes() + b"|" + store.val.tobytes()).hexdigest()
        out.put((index, "ok", digest))
    except ValueError as e:
        out.put((index, "refused", str(e)))
    except BaseException:  # noqa: BLE001 - any other failure is the test's finding
        out.put((index, "crashed", traceback.format_exc()))


def _all_at_once(configs: list, verify: bool) -> dict[int, tuple[str, str]]:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(len(configs)), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(cfg, verify, start, out, i)) for i, cfg in enumerate(configs)]
    for p in procs:
        p.start()
    results = {i: (what, detail) for i, what, detail in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    return results


def _half_prepared(store) -> None:
    """A prepare killed before its manifest: finished shards left, the last one torn."""
    (store / "manifest.json").unlink()
    (store / "val.bin").unlink()
    shards = sorted(store.glob("shard_*.json"))
    shards[-1].write_text("{torn")


def _damaged(store) -> None:
    shard = store / "train_00001.bin"
    shard.write_bytes(bytes(255 - b for b in shard.read_bytes()))


@pytest.mark.parametrize("state", ["fresh", "only a lock", "half-prepared", "damaged"])
def test_eight_processes_on_one_store(tmp_path, state):
    """8 processes x ROUNDS rounds against one store folder, all started at once: in every round each valid
    process reads the tokens of a store prepared alone, and the one on bad input (where there is one) is
    refused with its own error (its input, or another config's store), whatever the order the lock took them in;
    when it came first it removed what it prepared, and the others prepared the store after it."""
    corpus, bad = tmp_path / "docs.jsonl", tmp_path / "bad.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents(60)))
    bad.write_text(json.dumps({"text": "a" * 70_000}) + "\n" + '{"text": \n')  # the bad line is past the sniffed start
    alone = open_store(_config(tmp_path, corpus, tmp_path / "alone"), workers=1)
    expected = hashlib.sha256(alone.train[:].tobytes() + b"|" + alone.val.tobytes()).hexdigest()
    store = tmp_path / "shared" / "store"
    good = _config(tmp_path, corpus, store)
    configs = [good] * (PROCESSES - 1) + [_config(tmp_path, bad, store)]
    if state in ("half-prepared", "damaged"):
        open_store(good, workers=1)
    for _ in range(ROUNDS):
        if state == "fresh":
            shutil.rmtree(store.parent, ignore_errors=True)
        elif state == "only a lock":  # an empty folder but for the package's lock file: adopted
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir(parents=True)
            (store / LOCK).touch()
        else:
            (_half_prepared if state == "half-prepared" else _damaged)(store)
        results = _all_at_once(configs, verify=state == "damaged")
        assert all(results[i] == ("ok", expected) for i in range(PROCESSES - 1)), results
        what, message = results[PROCESSES - 1]
        assert what == "refused" and ("invalid JSON" in message or "another config" in message), results
        assert json.loads((store / MARKER).read_text())["files"] and open_store(good).damaged() is None


def test_a_failure_alone_leaves_nothing_and_a_foreign_folder_stays(tmp_path):
    """8 processes on bad input at once on a new folder: all refused, no folder left; on a folder of other
    files: all refused as not a store, and the folder's files (no lock among them) as they were."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a" * 70_000}) + "\n" + '{"text": \n')
    store = tmp_path / "new" / "store"
    results = _all_at_once([_config(tmp_path, bad, store)] * PROCESSES, verify=False)
    assert {what for what, _ in results.values()} == {"refused"}, results
    assert all("invalid JSON" in message for _, message in results.values())
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    results = _all_at_once([_config(tmp_path, bad, mine)] * PROCESSES, verify=False)
    assert all(what == "refused" and "not a token store" in m for what, m in results.values()), results
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
