"""Before a job: ``--print-config`` (the resolved YAML, which ``train`` reads back), ``--dry-run`` (the
cost, nothing written), ``--version``, fast ``--help`` naming the docs pages, a closed pipe."""

import os
import subprocess
import sys
import time

import pytest
import yaml

from conftest import TINY
from hybrid_lightning import __version__
from hybrid_lightning.cli import main
from hybrid_lightning.config import load_config
from hybrid_lightning.plan.resolve import resolve_config
from test_grid import write_grid


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


def test_print_config_round_trips_through_train(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "--set", "model.window=16", "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "resolved.yaml").write_text(printed)
    again = load_config(tmp_path / "resolved.yaml")
    assert again == resolve_config(load_config(None, [*TINY[1::2], "model.window=16"]))
    assert again.model.window == 16 and again.model.vocab_size == 257 and again.name == "run"
    assert yaml.safe_load(printed)["data"]["files"] is None  # the embedded corpus: an empty list would be refused
    assert main(["train", "resolved.yaml", "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert _files(tmp_path) == [tmp_path.joinpath("resolved.yaml").relative_to(tmp_path)]


def test_dry_run_prints_the_cost_and_writes_nothing(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("HYBRID_LIGHTNING_CACHE", str(cache))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["train", *TINY, "--set", "train.max_steps=50", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "non-embedding" in out and "    1   full" in out  # the per-layer table (pattern EF)
    assert "50 steps, 51,200 tokens; measured" in out and "tokens/s on cpu (batch 8, " in out
    assert "median of 7 steps)" in out
    assert "run directory runs/run (new); nothing written" in out
    assert _files(tmp_path) == [cache.relative_to(tmp_path), work.relative_to(tmp_path)]


def test_grid_submit_previews_write_nothing(tmp_path, capsys):
    grid = write_grid(tmp_path, axes={"model.window": [8, 16]})
    before = _files(tmp_path)
    assert main(["grid", "submit", str(grid), "--print-config"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["model"]["window"] for d in documents] == [8, 16] and documents[0]["name"] == "window=8"
    assert main(["grid", "submit", str(grid), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "window=16  not submitted     20" in out and "2 of 2 cells to submit" in out and "nothing written" in out
    assert _files(tmp_path) == before
    assert main(["grid", "submit", str(grid)]) == 2  # submitting needs an executor
    assert "--executor is missing: one of ['local', 'slurm']" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out == f"hybrid-lightning {__version__}\n"


@pytest.mark.parametrize("command, page", [([], "docs/configuration.md"), (["train"], "docs/training.md"),
                                           (["grid", "submit"], "docs/grids.md"), (["eval"], "docs/evaluation.md"),
                                           (["analyze"], "docs/analysis.md"), (["export"], "docs/export.md")])
def test_help_is_quick_and_names_the_docs_page(command, page):
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "hybrid_lightning", *command, "--help"], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=60)
    seconds = time.perf_counter() - start
    assert r.returncode == 0 and page in r.stdout.replace("\n", " "), r.stdout
    assert seconds < 3, f"--help took {seconds:.1f} s"


def test_a_closed_pipe_ends_quietly(tmp_path):
    """``grid plan --json | head``: the reader leaves early; no BrokenPipeError traceback."""
    grid = write_grid(tmp_path, axes={"seed": [0, 1, 2]})
    proc = subprocess.Popen([sys.executable, "-m", "hybrid_lightning", "grid", "plan", str(grid), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the command writes anything: it takes longer than this to start
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err


def test_a_warmup_longer_than_the_run_says_what_to_set():
    with pytest.raises(ValueError, match=r"set train.warmup_steps to at most 2 \(e.g. --set train.warmup_steps=0\)"):
        load_config(None, ["train.max_steps=3"])


def test_a_record_without_files_in_either_form_is_the_same_run(tmp_path):
    """Run records write no ``data.files`` as null; those written before as []: both are the embedded corpus,
    and a run resumes under either."""
    from hybrid_lightning.config import config_to_dict
    from hybrid_lightning.training.resume import check_same_config

    cfg = load_config(None, TINY[1::2])
    for files in ([], None):
        old = config_to_dict(cfg)
        old["data"]["files"] = files
        check_same_config(tmp_path, old, cfg, "config.yaml")
    old["data"]["files"] = ["/elsewhere/a.txt"]
    with pytest.raises(ValueError, match="data.files"):
        check_same_config(tmp_path, old, cfg, "config.yaml")
