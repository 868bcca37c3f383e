"""Every bad input of the fifth fault round (issue 53) refused before anything is created: exit 2, one line naming
the problem, no file made or changed anywhere under the test's folder (the token store's cache included), within
10 s of CPU time (the wall time of a shared CI machine says little). The commands run in-process (``cli.main``), as a
user's would, without a new interpreter each."""

import hashlib
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import TINY
from hybrid_lightning.cli import main
from test_refusals import QUIET, fabricated_run, world  # noqa: F401  (world: the fixture)

GRID = {"base": {"model": {"n_layers": 2, "d_model": 64, "n_heads": 2, "pattern": "EF", "window": 32}},
        "axes": {"seed": [0, 1]}}


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` by path: a file's SHA-256, a folder's mark."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
            for p in sorted(root.rglob("*"))}


def write(folder: Path, name: str, text: str) -> str:
    path = folder / "work" / name
    path.write_text(text)
    return str(path)


def train(*settings: str) -> list[str]:
    return ["train", *TINY, *[a for s in settings for a in ("--set", s)]]


def grid(folder: Path, *extra: str, **fields) -> list[str]:
    return ["grid", "plan", write(folder, "g.yaml", yaml.safe_dump({**GRID, **fields})), *extra]


def not_packed(folder: Path) -> list[str]:
    (folder / "work" / "notes").mkdir()
    (folder / "work" / "notes" / "x.txt").write_text("mine")
    return ["unpack", str(folder / "work" / "notes"), "--into", str(folder / "work" / "root")]


def root_a_file(folder: Path) -> list[str]:
    return grid(folder, "--root", write(folder, "f", "a file of mine"))


CASES = {  # name: (the command, or what makes it from the test's folder; a part of the line)
    "an unknown eval task": (train("eval.tasks=[nosuchtask]"), "eval.tasks"),
    "an unknown heads task": (train("eval.heads.tasks=[foo]"), "eval.heads.tasks"),
    "a probe length too short": (train("eval.lengths=[10]"), "eval.lengths"),
    "eval settings, evaluation off": (["train", *TINY, *QUIET, "--set", "eval.lengths=[10]"], "eval.lengths"),
    "no such LongPPL evaluator": (train("eval.longppl_evaluator=/no/such/run"), "eval.longppl_evaluator"),
    "threads beyond the cores": (train("train.threads=1000"), "train.threads"),
    "probes --value-tokens 0": (["probes", "passkey", "--lengths", "512", "--value-tokens", "0", "--out", "p.jsonl"],
                                "--value-tokens"),
    "an empty --run-dir": (["train", *TINY, "--run-dir", ""], "--run-dir"),
    "fp16 on a CPU": (train("train.precision=16-mixed", "train.accelerator=cpu"), "train.precision"),
    "FSDP on a CPU": (train("train.strategy=fsdp", "train.accelerator=cpu"), "train.strategy"),
    "unpack of what is not packed": (not_packed, "holds no packed run"),
    "a grid name leaving the root": (lambda w: grid(w, name="../escape"), "name"),
    "--set making two cells one": (lambda w: grid(w, "--set", "seed=3"), "one run"),
    "betas beyond 1": (train("train.betas=[1.5,0.95]"), "train.betas"),
    "a float seed": (train("seed=-1.0"), "seed"),
    "a negative seed": (train("seed=-1"), "seed"),
    "heads --mask of no head": (lambda w: ["heads", str(fabricated_run(w)), "--mask", "99.99"], "--mask"),
    "heads --mask-top 0": (lambda w: ["heads", str(fabricated_run(w)), "--mask-top", "0"], "--mask-top"),
    "eval --tasks nosuch": (lambda w: ["eval", str(fabricated_run(w)), "--tasks", "nosuch"], "eval.tasks"),
    "a billion layers": (train("model.n_layers=1000000000"), "model.n_layers"),
    "two nodes outside a cluster": (train("train.num_nodes=2"), "train.num_nodes"),
    "an empty grid file": (lambda w: ["grid", "plan", write(w, "g.yaml", "")], "empty"),
    "a binary integer literal": (lambda w: ["train", write(w, "c.yaml", "model:\n  window: 0b100000\n")],
                                 "model.window: takes numbers, not the string \"0b100000\"; write it in decimal: 32"),
    "a float for an integer": (train("train.max_steps=300.0"), "train.max_steps: takes whole numbers"),
    "probes of a billion tokens": (["probes", "passkey", "--lengths", "1000000000", "--out", "p.jsonl"], "--lengths"),
    "a --run-dir nothing can be made in": (["train", *TINY, "--run-dir", "/proc/nope/run"], "--run-dir"),
    "a --root that is a file": (root_a_file, "--root"),
    "a BPE of a billion tokens": (["data", "tokenizer", *TINY, "--vocab-size", "1000000000", "--out", "t.json"],
                                  "--vocab-size"),
    "a YAML list as a key": (lambda w: ["train", write(w, "c.yaml", "? [a, b]\n: 1\n")], "a key is"),
    "data.files empty": (train("data.files=[]"), "data.files: [] names no file"),
    "an unknown tracing task": (train("eval.trace.task=nosuch"), "eval.trace.task"),
    "a tracing probe too short": (train("eval.trace.length=16"), "eval.trace.length"),
    "data.files empty in a config": (lambda w: ["train", write(w, "c.yaml", "data:\n  files: []\n")], "data.files"),
    "data.files empty in a grid's base": (lambda w: grid(w, base={**GRID["base"], "data": {"files": []}}),
                                          "base: data.files: [] names no file"),
    "data.files empty on a grid axis": (lambda w: grid(w, axes={"seed": [0], "data.files": [[]]}), "data.files"),
    "data.files empty by grid --set": (lambda w: grid(w, "--set", "data.files=[]"), "--set: data.files"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_is_refused_before_anything_is_created(world, capsys, monkeypatch, case):  # noqa: F811
    for key in ("SLURM_JOB_ID", "SLURM_STEP_ID", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)  # a test run inside a cluster's job is outside its steps
    if "CPU" in case and torch.cuda.is_available():
        pytest.skip("checks a run that trains on CPU")
    make, part = CASES[case]
    argv = make(world) if callable(make) else make
    capsys.readouterr()
    before, start = tree(world), time.process_time()
    code = main(list(argv))
    took = time.process_time() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    assert part in lines[0], lines[0]
    assert tree(world) == before, sorted(set(tree(world).items()) ^ set(before.items()))
    assert took < 10, f"refused after {took:.1f} s of CPU time"
