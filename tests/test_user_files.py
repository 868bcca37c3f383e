"""Nothing of the user's touched: temporaries removed only when provably the package's, every write path refusing a
file where a folder is expected in one line (exit 2, nothing created, the file unchanged), and ``data prepare``
preparing again a truncated shard of a store it owns."""

import hashlib
import os

from conftest import run_cli
from hybrid_lightning.fileio import temporary_beside
from hybrid_lightning.rundir import remove_temporaries
from test_analysis import fabricated  # noqa: F401 (a fixture: six fabricated runs, five done, one running)
from test_faults import args, one_line_error, train
from test_faults_data import cli, write_jsonl
from test_store import documents

DEAD_PID = 2**22 + 1  # above pid_max's default ceiling: never a live process


def checksums(folder) -> dict:
    """Every file under ``folder`` (itself a file too) by path: its SHA-256."""
    paths = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_only_the_temporaries_of_a_writer_that_is_gone_are_removed(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    users = [run / "checkpoints" / ".my.tmp", run / "checkpoints" / ".notes.abcdefgh.tmp", run / ".x.12-abc.tmp"]
    for path in users:
        path.write_text("the user's")
    stale = run / "checkpoints" / f".last.ckpt.{DEAD_PID}-k2j4h_9z.tmp"
    stale.write_bytes(b"half a checkpoint")
    fd, live = temporary_beside(run / "checkpoints" / "last.ckpt")  # this process's: its writer is alive
    os.close(fd)
    assert remove_temporaries(run) == [stale]
    assert all(p.read_text() == "the user's" for p in users) and live.exists() and not stale.exists()


def test_a_refused_train_leaves_a_users_temporary_file(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")  # damaged: the run is refused
    (run / "checkpoints" / ".my.tmp").write_text("the user's")
    before = checksums(run)
    line = one_line_error(train(run, *args(4, 2)))
    assert "every checkpoint is damaged" in line, line
    assert checksums(run) == before


def test_a_checkpoints_path_that_is_a_file_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("the user's")
    before = checksums(run)
    line = one_line_error(train(run, *args(4, 2)))
    assert str(run / "checkpoints") in line and "is a file" in line, line
    assert checksums(run) == before and sorted(p.name for p in run.iterdir()) == ["checkpoints"]


def test_pack_out_onto_a_file_is_one_line(fabricated, tmp_path):  # noqa: F811
    root, _ = fabricated
    out = tmp_path / "out"
    out.write_text("the user's")
    before = checksums(tmp_path)
    line = one_line_error(run_cli("pack", str(root), "--out", str(out)))
    assert "--out" in line and str(out) in line and "is a file" in line, line
    assert checksums(tmp_path) == before


def test_unpack_into_a_file_is_one_line(fabricated, tmp_path):  # noqa: F811
    root, _ = fabricated
    packed, into = tmp_path / "packed", tmp_path / "into"
    assert run_cli("pack", str(root), "--out", str(packed)).returncode == 0
    into.write_text("the user's")
    before = checksums(tmp_path)
    line = one_line_error(run_cli("unpack", str(packed), "--into", str(into)))
    assert "--into" in line and str(into) in line and "is a file" in line, line
    assert checksums(tmp_path) == before


def test_prepare_prepares_a_truncated_shard_again(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "src" / "c.jsonl", documents(60))
    store = tmp_path / "store"
    argv = ["data", "prepare", "--set", f"data.files=[{corpus}]", "--set", f"data.store={store}",
            "--set", "data.shard_mb=0.004"]
    assert cli(capsys, *argv)[0] == 0
    shard = store / "train_00001.bin"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-7])  # truncated
    code, err = cli(capsys, *argv)
    assert code == 0, err
    assert shard.read_bytes() == whole  # prepared again: the same bytes


def test_a_train_of_a_truncated_shard_says_to_prepare(tmp_path):
    """Opening (``train``) reads only sizes: a truncated shard is one line naming it and saying what rebuilds it."""
    corpus = write_jsonl(tmp_path / "src" / "c.jsonl", documents(60))
    store = tmp_path / "store"
    data = ["--set", f"data.files=[{corpus}]", "--set", f"data.store={store}", "--set", "data.shard_mb=0.004",
            "--set", "data.max_tokens=2000000"]  # as TINY's
    assert run_cli("data", "prepare", *data).returncode == 0
    shard = store / "train_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-7])
    line = one_line_error(train(tmp_path / "run", *args(4, 2), *data))
    assert str(shard) in line and "data prepare" in line, line
    assert not (tmp_path / "run").exists()
