"""Bad inputs and output targets, each refused in one line (exit 2) before anything is created: no run directory,
no token store, no output file; and no command writes over a file the package did not write."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import TINY
from hybrid_lightning.cli import main
from hybrid_lightning.config import dump_config, load_config

QUIET = ["--set", "eval.every_n_steps=0", "--set", "eval.at_end=false", "--set", "eval.heads.every_n_steps=0",
         "--set", "eval.heads.at_end=false"]
LEVELS = ["a: &a [x,x,x,x,x,x,x,x,x,x]"] + [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 10)}]"
                                            for i in range(9)]  # 10^10 values once expanded
BOMB = "".join(line + "\n" for line in LEVELS)


def files(*roots: Path) -> set[Path]:
    return {p for root in roots for p in Path(root).rglob("*")}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A working folder and an empty cache of its own: whatever a command creates shows there."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    cache.mkdir()
    work.mkdir()
    monkeypatch.setenv("HYBRID_LIGHTNING_CACHE", str(cache))
    monkeypatch.chdir(work)
    return tmp_path


def refused(world: Path, capsys, *argv: str) -> str:
    """Runs the command line in-process; asserts one line on stderr, exit 2 and nothing new under ``world``."""
    before = files(world)
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    assert files(world) == before, sorted(map(str, files(world) - before))
    return lines[0]


def config(world: Path, text: str, name: str = "c.yaml") -> str:
    path = world / "work" / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("setting, key", [
    ("model.vocab_size=100", "model.vocab_size"),  # below the byte tokenizer's 257
    ("train.lr=.inf", "train.lr"), ("train.lr=.nan", "train.lr"), ("train.max_steps=1e25", "train.max_steps"),
    ("train.tokens_per_param=1e12", "train.tokens_per_param"), ("model.window=100000000000000000000", "model.window"),
    ("data.text_val_files=[missing.txt]", "data.text_val_files"),
])
def test_a_bad_value_is_refused_before_any_store_or_run(world, capsys, setting, key):
    line = refused(world, capsys, "train", *TINY, *QUIET, "--run-dir", str(world / "run"), "--set", setting)
    assert key in line, line


def test_yaml_that_no_config_can_be_is_refused(world, capsys):
    deep = config(world, "name: " + "[" * 20000 + "]" * 20000 + "\n")
    assert "nested deeper" in refused(world, capsys, "train", deep, "--run-dir", str(world / "run"))
    bomb = config(world, BOMB + "name: *j\n", "bomb.yaml")
    assert "aliases" in refused(world, capsys, "train", bomb, "--run-dir", str(world / "run"))
    files_bomb = config(world, BOMB + "data:\n  files: *j\n", "files.yaml")
    assert "aliases" in refused(world, capsys, "train", files_bomb, "--run-dir", str(world / "run"))
    flow = "{" + ", ".join(LEVELS) + "}"  # the same bomb in one --set value
    assert "aliases" in refused(world, capsys, "train", "--set", f"name={flow}", "--run-dir", str(world / "run"))
    twice = config(world, "model:\n  window: 8\n  window: 16\n", "twice.yaml")
    assert "'window' is given twice" in refused(world, capsys, "train", twice, "--run-dir", str(world / "run"))


def test_a_config_that_is_no_file_is_named_for_what_it_is(world, capsys):
    folder = world / "work" / "folder.yaml"
    folder.mkdir()
    fifo = world / "work" / "fifo.yaml"
    os.mkfifo(fifo)
    for path in (folder, fifo, Path("/dev/zero")):
        assert "is not a regular file" in refused(world, capsys, "train", str(path))
    latin = world / "work" / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    line = refused(world, capsys, "train", str(latin))
    assert str(latin) in line and "not UTF-8" in line
    assert "not found" in refused(world, capsys, "train", str(world / "work" / "missing.yaml"))


def test_commands_check_their_arguments_before_preparing_data(world, capsys):
    assert "--lengths" in refused(world, capsys, "probes", "passkey", "--lengths", "0", "--out",
                                  str(world / "work" / "p.jsonl"))
    assert "--workers" in refused(world, capsys, "data", "prepare", *TINY, "--workers", "0")


@pytest.mark.parametrize("argv, named", [
    ([], "COMMAND"), (["train", "--bogus"], "--bogus"), (["grid", "plan"], "grid"), (["grid"], "ACTION"),
    (["data", "prepare", "--workers", "x"], "--workers"),
])
def test_a_usage_error_is_one_line_that_points_at_help(world, capsys, argv, named):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit.value.code == 2 and len(lines) == 1, err
    assert named in lines[0] and "--help)" in lines[0], lines[0]


def fabricated_run(world: Path) -> Path:
    """A run directory with config.yaml, a checkpoint of step 0 (a whole torch archive, no weights) and its scalars as
    a packed run holds them."""
    import torch

    run = world / "work" / "run"
    (run / "checkpoints").mkdir(parents=True)
    raw = yaml.safe_load(dump_config(load_config(None, TINY[1::2])))
    (run / "config.yaml").write_text(yaml.safe_dump({**raw, "provenance": {"git_revision": None}}, sort_keys=False))
    torch.save({"global_step": 0, "state_dict": {}, "hyper_parameters": {"config": raw}},
               run / "checkpoints" / "last.ckpt")
    (run / "scalars.csv").write_text("step,metric,value\n0,train/loss,5.5\n")
    return run


def test_a_checkpoint_that_is_none_is_refused(world, capsys):
    run = fabricated_run(world)
    empty, yml, cut = world / "work" / "empty.ckpt", world / "work" / "c.ckpt", world / "work" / "cut.ckpt"
    empty.write_bytes(b"")
    yml.write_text("model: {}\n")
    cut.write_bytes(b"PK\x03\x04" + b"\0" * 100)  # a zip's first bytes, cut short
    for ckpt in (empty, yml, cut):
        assert "--ckpt" in refused(world, capsys, "export", str(run), "--ckpt", str(ckpt), "--out",
                                   str(world / "work" / "x"))
        assert "--ckpt" in refused(world, capsys, "eval", str(run), "--ckpt", str(ckpt))


def test_analyze_and_export_never_write_over_a_users_files(world, capsys):
    run = fabricated_run(world)
    (run / "status.json").write_text(json.dumps({"state": "done", "step": 0, "max_steps": 1}))
    mine = world / "work" / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    link = world / "work" / "link"
    link.symlink_to(mine)
    for out in (mine, link):
        line = refused(world, capsys, "analyze", str(run.parent), "--out", str(out))
        assert "report.md" in line and "not written by hybrid-lightning" in line
    assert (mine / "report.md").read_text() == "my notes" and sorted(p.name for p in mine.iterdir()) == ["report.md"]
    (mine / "model.safetensors").write_text("my weights")
    assert "symbolic link" in refused(world, capsys, "export", str(run), "--out", str(link), "--force")
    line = refused(world, capsys, "export", str(run), "--out", str(mine), "--force")
    assert "not written by hybrid-lightning export" in line and (mine / "model.safetensors").read_text() == "my weights"
    assert "give a new or empty folder" in refused(world, capsys, "export", str(run), "--out", str(mine))  # not --force
    tokenizer = world / "work" / "tok.json"
    tokenizer.write_text("my tokenizer")
    assert "exists" in refused(world, capsys, "data", "tokenizer", *TINY, "--vocab-size", "300", "--out",
                               str(tokenizer))
    assert "exists" in refused(world, capsys, "probes", "passkey", "--lengths", "512", "--out", str(tokenizer))
    assert tokenizer.read_text() == "my tokenizer"


def test_an_unreadable_store_marker_is_refused_and_nothing_deleted(world, capsys):
    store = world / "work" / "store"
    store.mkdir()
    (store / ".hybrid-lightning-store").write_text("{not json")
    (store / "train_00000.bin").write_bytes(b"\0" * 8)
    line = refused(world, capsys, "data", "prepare", *TINY, "--set", f"data.store={store}")
    assert ".hybrid-lightning-store" in line and str(store) in line
    assert sorted(p.name for p in store.iterdir()) == [".hybrid-lightning-store", "train_00000.bin"]


def test_damaged_status_is_named_and_the_run_not_done(world, capsys):
    from hybrid_lightning.rundir.status import read_status

    run = fabricated_run(world)
    for text in ("[]", "{not json", '{"step": 3}'):
        (run / "status.json").write_text(text)
        status = read_status(run)
        assert status["state"] == "damaged" and "status.json" in status["error"]
    shutil.rmtree(run / "checkpoints")
    assert main(["analyze", str(run.parent), "--out", str(world / "work" / "a")]) == 0
    assert "status.json does not read as a run status" in capsys.readouterr().err


def _store_too_short(world: Path, capsys) -> list[str]:
    text = world / "work" / "short.txt"
    text.write_text("a short corpus.\n" * 3)
    setting = ["--set", f"data.files=[{text}]", "--set", f"data.store={world / 'work' / 'short'}"]
    assert main(["data", "prepare", *TINY, *setting]) == 0
    capsys.readouterr()
    return setting


def _foreign_store(world: Path, capsys) -> list[str]:
    (world / "work" / "mine").mkdir()
    (world / "work" / "mine" / "notes.txt").write_text("mine")
    return ["--set", f"data.store={world / 'work' / 'mine'}"]


def _binary_source(world: Path, capsys) -> list[str]:
    (world / "work" / "x.txt").write_bytes(b"\x00\x01binary")
    return ["--set", f"data.files=[{world / 'work' / 'x.txt'}]"]


def _more_gpus_than_here(world: Path, capsys) -> list[str]:
    import torch

    return ["--set", "train.accelerator=gpu"] + (["--set", f"train.devices={torch.cuda.device_count() + 1}"]
                                                 if torch.cuda.is_available() else [])


def _run_dir_a_file(world: Path, capsys) -> list[str]:
    (world / "work" / "file").write_text("")
    return ["--run-dir", str(world / "work" / "file")]


def _run_of_another_config(world: Path, capsys) -> list[str]:
    return ["--run-dir", str(fabricated_run(world)), "--set", "model.window=16"]


REFUSALS = {  # what train refuses before it writes anything: (the arguments, or what makes them; a part of the line)
    "geometry": (["--set", "model.d_model=65"], "must divide model.d_model=65"),
    "window": (["--set", "model.window=1000000"], "model.window=1000000 is longer"),
    "memory": (["--set", "train.batch_size=10000000"], "estimated peak memory"),
    "CPU devices": (["--set", "train.accelerator=cpu", "--set", f"train.devices={len(os.sched_getaffinity(0)) + 1}"],
                    "training processes on one node"),
    "GPU": (_more_gpus_than_here, "GPU"),
    "sources": (_binary_source, "looks binary"),
    "foreign store": (_foreign_store, "is not empty and is not a token store"),
    "store too short": (_store_too_short, "fewer than train.seq_len + 1"),
    "run directory a file": (_run_dir_a_file, "is a file, not a folder"),
    "run of another config": (_run_of_another_config, "holds a run with another config"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_dry_run_refuses_what_train_refuses_with_the_same_line(world, capsys, case):
    """train/preflight.py is the one place: `train --dry-run` exits 2 with the line `train` gives, for each refusal."""
    make, part = REFUSALS[case]
    extra = make(world, capsys) if callable(make) else make
    dry = refused(world, capsys, "train", *TINY, *QUIET, *extra, "--dry-run")
    assert part in dry and dry == refused(world, capsys, "train", *TINY, *QUIET, *extra), dry


def test_grid_plan_and_a_grid_preview_refuse_what_train_refuses_of_a_cell(world, capsys):
    """grid plan and grid submit --dry-run check each cell as train would start it (training/preflight.check_start),
    naming the grid, the cell and the grid's own option for the run directories."""
    store = _foreign_store(world, capsys)[1]
    grid = config(world, yaml.safe_dump({"base": {"model": {"n_layers": 2, "d_model": 64, "n_heads": 2, "pattern": "EF",
                                                            "window": 32}, "data": {"store": store.split("=", 1)[1]}},
                                         "axes": {"seed": [0]}}), "g.yaml")
    for argv in (["grid", "plan", grid], ["grid", "submit", grid, "--dry-run"]):
        line = refused(world, capsys, *argv)
        assert "grid g: cell seed=0: data.store:" in line and "is not a token store" in line, line
    run = world / "work" / "runs" / "g" / "seed=0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config(None, ["model.window=16"])))
    line = refused(world, capsys, "grid", "plan", grid, "--set", "data.store=null")
    assert "holds a run with another config" in line and line.endswith("use another --root"), line


def test_a_record_older_than_a_key_holds_the_same_run(tmp_path):
    """A config.yaml written before a mixer or option existed lacks its keys: they take their defaults (the run was
    made without them), so adding a mixer to the package leaves every earlier run resumable; a key the record has
    is still compared."""
    from hybrid_lightning.config import config_to_dict, load_config
    from hybrid_lightning.training.resume import check_same_config

    cfg = load_config(None, [])
    old = config_to_dict(cfg)
    del old["model"]["kda"], old["train"]["stable_phase"]  # a run recorded before KDA and budget branches
    check_same_config(tmp_path, old, cfg, "config.yaml")
    old["model"]["window"] = 7
    with pytest.raises(ValueError, match="model.window: 7"):
        check_same_config(tmp_path, old, cfg, "config.yaml")
