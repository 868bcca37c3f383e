"""(e) ``data prepare``: throughput against the tokenizer's own batch encoding of the same text, the
speed-up from 1 to 2 workers, peak memory (PSS) for 4x more text, and the time from a prepared
store to the first training batch for two store sizes.

The corpora are generated JSON lines: documents of Zipf-distributed pseudo-words (a vocabulary of
50k, lengths log-normal around 600 words), a pool of unique documents written again in shuffled
order until the corpus has its size. The BPE is a byte-level BPE of 8192 tokens trained here
(``train_bpe``) on the pool.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.store import open_store
from hybrid_lightning.data.synthetic import pseudo_word
from hybrid_lightning.data.tokenizer import load_tokenizer, train_bpe

MB = 2**20


def write_corpus(path: Path, megabytes: float, pool: list[str], seed: int) -> None:
    """JSON lines of documents drawn from ``pool`` in shuffled order until ``megabytes`` are written."""
    rng = np.random.default_rng(seed)
    lines = [json.dumps({"text": d}) + "\n" for d in pool]
    written = 0
    with open(path, "w") as f:
        while written < megabytes * MB:
            for i in rng.permutation(len(lines)):
                f.write(lines[i])
                written += len(lines[i])
                if written >= megabytes * MB:
                    break


def document_pool(megabytes: float, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = np.array([pseudo_word(rng, int(rng.integers(1, 5))) for _ in range(50_000)])
    docs, size = [], 0
    while size < megabytes * MB:
        words = vocab[np.minimum(rng.zipf(1.2, int(rng.lognormal(6.2, 0.6))) - 1, vocab.size - 1)]
        lines = [" ".join(words[i : i + 14]) + "." for i in range(0, words.size, 14)]
        docs.append("\n".join(lines))
        size += len(docs[-1])
    return docs


def tree_pss(pid: int) -> int:
    """Proportional set size in bytes of a process and all its descendants, from /proc: pages that
    forked workers share with their parent are counted once, not once per process."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            total += int(rollup.split("\nPss:")[1].split()[0]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def peak_pss(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak PSS of the process tree in bytes) of a command, sampled every 20 ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_pss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed: {err[-2000:]}")
    return time.perf_counter() - t0, peak[0]


def prepare_cmd(corpus: Path, tokenizer: str, store: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "hybrid_lightning", "data", "prepare", "--workers", str(workers),
            "--set", f"data.files=[{corpus}]", "--set", f"data.tokenizer={tokenizer}", "--set", f"data.store={store}"]


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the prepare workers, once joined)."""
    return sum(r.ru_utime + r.ru_stime
               for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def prepare_seconds(corpus: Path, tokenizer: str, store: Path, workers: int, shard_mb: float) -> tuple[float, float]:
    """(wall, CPU) seconds of preparing a store in this process (workers forked from it), one thread per worker."""
    cfg = validate_config({"data": {"files": [str(corpus)], "tokenizer": tokenizer, "store": str(store),
                                    "shard_mb": shard_mb}})
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    t0, c0 = time.perf_counter(), cpu_seconds()
    open_store(cfg.data, workers=workers)
    return time.perf_counter() - t0, cpu_seconds() - c0


def reference_seconds(corpus: Path, tokenizer: str) -> tuple[float, float]:
    """Seconds of the tokenizer's own batch encoding (all cores, as it chooses) of the corpus's texts,
    in batches of 1 MiB as the workers encode them; reading the file is not counted."""
    tok = load_tokenizer(tokenizer)
    texts = [json.loads(line)["text"] for line in open(corpus)]
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    t0, c0 = time.perf_counter(), cpu_seconds()
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= MB:
            tok.encode_batch(batch)
            batch, size = [], 0
    tok.encode_batch(batch)
    return time.perf_counter() - t0, cpu_seconds() - c0


def first_batch_seconds(corpus: Path, tokenizer: str, store: Path) -> float:
    """Seconds from nothing loaded to the first training batch with a prepared store (median of 3)."""
    from hybrid_lightning.data.datamodule import LMDataModule

    cfg = validate_config({"data": {"files": [str(corpus)], "tokenizer": tokenizer, "store": str(store)},
                           "train": {"batch_size": 16, "seq_len": 1024}})
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        dm = LMDataModule(cfg)
        dm.setup()
        next(iter(dm.train_dataloader()))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run(quick: bool) -> dict:
    small, large, speed_mb, shard_mb, reps = (6, 24, 2, 0.25, 1) if quick else (60, 240, 8, 1, 3)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pool = document_pool(2 if quick else 8)
        bpe = str(tmp / "bpe.json")
        train_bpe(iter(pool[: len(pool) // 2]), 8192, bpe)
        for name, spec, mb in (("byte", "byte", 4 * speed_mb), ("BPE 8192", bpe, speed_mb)):
            corpus = tmp / f"speed{mb}.jsonl"
            write_corpus(corpus, mb, pool, 1)
            runs: dict = {"ref": [], 1: [], 2: []}
            for _ in range(reps):  # round-robin, so that a change in the machine's load falls on all three
                runs["ref"].append(reference_seconds(corpus, spec))
                for w in (1, 2):
                    shutil.rmtree(tmp / "speed-store", ignore_errors=True)
                    runs[w].append(prepare_seconds(corpus, spec, tmp / "speed-store", w, shard_mb))
            med = [tuple(np.median(runs[k], axis=0)) for k in ("ref", 1, 2)]  # (wall, CPU) of each
            ref, ref_cpu = med[0]
            rows.append({"measure": f"tokenizer's own batch encoding, {mb} MB, {name} (all cores)", "seconds": ref,
                         "CPU s": ref_cpu, "MB/s": mb / ref, "MB per CPU s": mb / ref_cpu})
            for w, (wall, cpu) in zip((1, 2), med[1:]):
                rows.append({"measure": f"prepare {mb} MB, {name}, {w} worker{'s' * (w > 1)}", "seconds": wall,
                             "CPU s": cpu, "MB/s": mb / wall, "MB per CPU s": mb / cpu,
                             "vs tokenizer batch speed": ref / wall,
                             "speed-up 1 -> 2 workers": med[1][0] / wall if w == 2 else ""})
        peaks = {}
        for mb in (small, large):
            corpus = tmp / f"c{mb}.jsonl"
            write_corpus(corpus, mb, pool, 2)
            wall, peaks[mb] = peak_pss(prepare_cmd(corpus, "byte", tmp / f"store{mb}", 2))
            rows.append({"measure": f"prepare {mb} MB, byte, 2 workers, default shards (command)", "seconds": wall,
                         "MB/s": mb / wall, "peak PSS (MB)": peaks[mb] / MB,
                         "PSS ratio to the smaller": peaks[mb] / peaks[small] if mb == large else ""})
        for mb in (small, large):
            manifest = json.loads((tmp / f"store{mb}" / "manifest.json").read_text())
            rows.append({"measure": f"prepared store of {manifest['train_tokens'] / 1e6:.0f}M tokens "
                                    f"({len(manifest['shards'])} shards) to the first batch of 16 x 1024",
                         "seconds": first_batch_seconds(tmp / f"c{mb}.jsonl", "byte", tmp / f"store{mb}")})
    notes = ("Generated JSON-lines corpora (Zipf pseudo-words); the BPE is trained here on half of the unique "
             f"documents. Throughput rows, medians of {reps} rounds run round-robin: the tokenizer's batch encoding "
             "(1 MiB batches, its own thread pool over all "
             f"cores) of the texts already in memory, then `data prepare` of the same file in the same process "
             f"(shards of {shard_mb} MiB so that both workers have units; one thread per worker; reading JSON, "
             "splitting, checksums and writing included); 'vs tokenizer batch speed' is the ratio of the two "
             "throughputs; 'CPU s' counts this process and the joined workers, which the machine's load does not "
             "inflate as it does the wall-clock seconds ('MB per CPU s': throughput per core busy). Memory rows: the "
             "`hybrid-lightning data prepare` command (default 32 MiB shards; "
             "interpreter start and imports included in its seconds), peak PSS of its process tree (main + workers; "
             "pages the forked workers share with the main process counted once) sampled every 20 ms from /proc. "
             "First batch: store opened, data module set up, first training batch read, in this process, median of 3. "
             "Measured on a shared 2-core machine with other jobs running: the load average above says how busy it "
             "was; timings vary by tens of percent between runs, the ratios less.")
    return {"title": SECTION_TITLE, "columns": ["measure", "seconds", "CPU s", "MB/s", "MB per CPU s",
                                                "vs tokenizer batch speed", "speed-up 1 -> 2 workers", "peak PSS (MB)",
                                                "PSS ratio to the smaller"],
            "rows": rows, "notes": notes}


SECTION_TITLE = "(e) data prepare: throughput, workers, bounded memory, time to the first batch"
