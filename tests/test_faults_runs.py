"""Faults of runs and grids that let a wrong run through or cost a trained one: an export onto its own
run, duplicate grid cells, quoted numbers, extended schedules, untruthful states and exit codes, and
user errors that were tracebacks."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from hybrid_lightning.fileio import LOCK_FILE
from hybrid_lightning.grid import load_grid
from hybrid_lightning.rundir.status import read_status
from test_faults import (  # noqa: F401 (mounts: a fixture)
    args,
    loss_steps,
    mounts,
    one_line_error,
    start,
    stored_step,
    train,
    wait_for_step,
)

COSINE = ("--set", "train.schedule=cosine")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run of the tiny model (cosine schedule, warmup 2)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    r = train(run, *args(4, 2), *COSINE)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


@pytest.mark.slow
def test_export_never_replaces_what_it_reads(trained, tmp_path):
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    probes = tmp_path / "probes" / "p.jsonl"
    assert run_cli("probes", "passkey", "--out", str(probes), "--lengths", "300", "--samples", "1").returncode == 0
    for out, extra in ((trained, []), (trained.parent, []), (trained / "exported", []),
                       (trained / "checkpoints", []), (probes.parent, ["--probes", str(probes)])):
        line = one_line_error(run_cli("export", str(trained), "--out", str(out), "--force", *extra))
        assert "which the export reads" in line, line
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before and probes.is_file()
    assert stored_step(trained / "checkpoints" / "last.ckpt") == 4


def write_grid(tmp_path, axes: str) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(f"base:\n  model: {{n_layers: 2, d_model: 64, n_heads: 2, pattern: EF}}\naxes:\n{axes}")
    return path


@pytest.mark.slow
def test_grid_cells_are_normalised_and_float_integers_refused(tmp_path):
    grid = load_grid(write_grid(tmp_path, "  model.window: [16, 32]\n  train.lr: [3e-4, 1.0e-3]\n"))
    assert [c.name for c in grid.cells] == ["window=16,lr=0.0003", "window=16,lr=0.001", "window=32,lr=0.0003",
                                            "window=32,lr=0.001"]
    assert grid.cells[2].labels["model.window"] == 32 and isinstance(grid.cells[2].labels["model.window"], int)
    # integers are written as integers (issue 53 item 5): 16.0 is refused, never taken for 16 (and one run twice)
    line = one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, "  model.window: [16, 16.0]\n"))))
    assert "model.window" in line and "not 16.0; write 16" in line, line
    presets = "  arch:\n    a: {model.window: 16}\n    b: {model.window: 16.0}\n"
    assert "not 16.0; write 16" in one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, presets))))


@pytest.mark.parametrize("axis", ['model.window: ["32"]', 'train.lr: ["3e-4"]', 'eval.lengths: [["512"]]',
                                  'train.batch_size: [8, "8"]', 'seed: ["0"]'])
@pytest.mark.slow
def test_grid_numbers_are_strict(tmp_path, axis):
    line = one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, f"  {axis}\n"))))
    assert "not the string" in line and axis.split(":")[0].split(".")[-1] in line, line


def test_grid_plan_of_a_huge_model_does_not_hang(tmp_path):
    t0 = time.perf_counter()
    r = run_cli("grid", "plan", str(write_grid(tmp_path, "  model.n_layers: [100000]\n  model.pattern: [F]\n")),
                timeout=120)
    assert time.perf_counter() - t0 < 60, "grid plan took a minute"
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_counts_over_distinct_layers_equal_the_whole_model():
    """The plan's count (one block per distinct layer, plan/count.py) against the built model's own parameters and
    the FLOPs of every one of its blocks."""
    from hybrid_lightning.config import validate_config
    from hybrid_lightning.model import block_flops_per_token, matmul_weights
    from hybrid_lightning.plan import build_model, resolve_model_config
    from hybrid_lightning.plan.count import count
    from hybrid_lightning.plan.matching import non_embedding_params

    for model in ({"pattern": "SGMLF", "n_layers": 10, "match_params": "F"}, {"pattern": "EF", "tie_embeddings": True}):
        cfg = resolve_model_config(validate_config({"model": model}).model)
        with torch.device("meta"):
            whole = build_model(cfg)
        counts = count(whole.opts, whole.plan, (256,))
        embedding = whole.embed.weight.numel() + (0 if cfg.tie_embeddings else whole.lm_head.weight.numel())
        assert counts.total == sum(p.numel() for p in whole.parameters())
        assert non_embedding_params(cfg) == counts.non_embedding == counts.total - embedding
        flops = 6 * matmul_weights(whole.lm_head) + sum(block_flops_per_token(b, 256) for b in whole.layers)
        assert counts.flops[256] == pytest.approx(flops, rel=1e-12)


@pytest.mark.slow
def test_user_errors_are_one_line_and_leave_nothing(tmp_path):
    cache = tmp_path / "cache"
    env = {"HYBRID_LIGHTNING_CACHE": str(cache)}
    a_file = tmp_path / "a_file"
    a_file.write_text("not a run")
    line = one_line_error(train(a_file, *args(4, 2), env=env))
    assert str(a_file) in line and "not a folder" in line and a_file.read_text() == "not a run"
    for setting, field in (("train.devices=0", "train.devices"), ("train.accelerator=gpu", "train.accelerator")):
        if setting.endswith("gpu") and torch.cuda.is_available():
            continue
        line = one_line_error(train(tmp_path / "run", *args(4, 2), "--set", setting, env=env))
        assert field in line, line
    assert not (tmp_path / "run").exists() and not cache.exists()


def test_analyze_a_truncated_config_is_one_line_and_writes_nothing(trained, tmp_path):
    import shutil

    text = (trained / "config.yaml").read_text()
    # in a line; at one's end
    for i, cut in enumerate((text[: len(text) // 2], text[: text.index("\nprovenance:") + 1])):
        root = tmp_path / f"runs{i}"
        shutil.copytree(trained, root / "run")
        (root / "run" / "config.yaml").write_text(cut)
        line = one_line_error(run_cli("analyze", str(root)))
        assert "config.yaml" in line, line
        assert not (root / "analysis").exists()


def test_early_full_disk_names_the_file(tmp_path, mounts):  # noqa: F811 (the fixture imported above)
    from test_faults import mount_tmpfs

    disk = tmp_path / "disk"
    mount_tmpfs(disk, "64k")
    mounts.append(disk)
    (disk / "filler").write_bytes(b"\0" * 60_000)
    line = one_line_error(train(disk / "run", *args(4, 2)))
    assert "No space left" in line and "?" not in line and str(disk / "run") in line, line


def test_a_killed_run_reads_interrupted(tmp_path):
    run = tmp_path / "run"
    proc = start(run, *args(100000, 5))
    wait_for_step(proc, run, 6)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    status = read_status(run)
    assert status["state"] == "interrupted" and f"pid {proc.pid}" in status["error"], status
    assert json.loads((run / "status.json").read_text())["state"] == "running"  # as the killed process left it
    assert (run / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_double_signal_names_the_checkpoints_step(tmp_path):
    run = tmp_path / "run"
    proc = start(run, *args(100000, 10))
    wait_for_step(proc, run, 13)
    proc.send_signal(signal.SIGINT)  # a second signal of the same number would merge with it: another one
    proc.send_signal(signal.SIGTERM)  # the second stops at once, inside the step, before any checkpoint of it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    step = stored_step(run / "checkpoints" / "last.ckpt")
    status = read_status(run)
    assert status["state"] == "interrupted" and status["step"] == step, (status, step)
    assert f"at step {step};" in err, err[-2000:]


@pytest.mark.slow
def test_ctrl_c_during_the_final_evaluation_keeps_the_last_step(tmp_path):
    run = tmp_path / "run"
    slow_eval = ["--set", "eval.at_end=true", "--set", "eval.lengths=[2048]", "--set", "eval.samples=6",
                 "--set", "eval.tasks=[passkey]"]
    proc = start(run, *args(7, 5), *slow_eval)
    for line in proc.stdout:  # the console says when the end-of-training evaluation starts
        if line.startswith("step 7: val_longctx evaluation..."):
            break
    else:
        raise AssertionError(proc.communicate()[1][-3000:])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "at step 7;" in err, err[-3000:]
    assert stored_step(run / "checkpoints" / "last.ckpt") == 7
    assert read_status(run)["step"] == 7
    r = train(run, *args(7, 5), *slow_eval)
    assert r.returncode == 0 and "already complete (7/7" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
def test_a_signal_to_one_ddp_rank_is_the_runs_exit_code(tmp_path):
    import psutil

    run = tmp_path / "run"
    ddp = ["--set", "train.strategy=ddp", "--set", "train.devices=2", "--set", "train.accelerator=cpu"]
    proc = start(run, *args(100000, 1000), *ddp)
    wait_for_step(proc, run, 4, timeout=300)
    (child,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train" in " ".join(p.cmdline())]
    child.send_signal(signal.SIGTERM)  # rank 1 only
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    status = read_status(run)
    step = stored_step(run / "checkpoints" / "last.ckpt")
    assert status["state"] == "interrupted" and status["error"] == "SIGTERM" and status["step"] == step >= 4


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.0, 0.05, 0.3])
def test_a_double_signal_to_one_ddp_rank_ends_the_run_by_it(tmp_path, gap):
    """Two signals ``gap`` seconds apart to rank 1 alone: the run ends within 30 s by one of them, status.json
    interrupted at the step of the checkpoint on disk; never the failed run that rank 0's broken collective
    would report (rank 1 leaves its signal for rank 0: stop.rank_signal); no mark survives the next start."""
    import psutil

    run = tmp_path / "run"
    ddp = ["--set", "train.strategy=ddp", "--set", "train.devices=2", "--set", "train.accelerator=cpu"]
    proc = start(run, *args(100000, 5), *ddp)
    wait_for_step(proc, run, 6, timeout=300)
    (child,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train" in " ".join(p.cmdline())]
    began = time.monotonic()
    child.send_signal(signal.SIGINT)  # two of one number would merge
    time.sleep(gap)
    child.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert time.monotonic() - began < 30 and proc.returncode in (130, 143), err[-3000:]
    status, step = read_status(run), stored_step(run / "checkpoints" / "last.ckpt")
    name = {130: "SIGINT", 143: "SIGTERM"}[proc.returncode]
    assert status["state"] == "interrupted" and status["error"] == name and status["step"] == step >= 5, status
    assert f"stopped by {name} at step {step};" in err and "Traceback" not in err, err[-3000:]
    # rank 1 may outlive rank 0 by a moment: a mark it writes then is left, and is the second signal's; the next
    # start removes it, holding the run lock, before it trains
    child.wait(timeout=30)
    assert all(m.read_text() == str(int(signal.SIGTERM)) for m in run.glob(".rank-ended-by-signal.*"))
    again = start(run, *args(100000, 5), *ddp)
    wait_for_step(again, run, step + 1, timeout=300)
    for p in [*psutil.Process(again.pid).children(recursive=True), psutil.Process(again.pid)]:
        p.kill()
    again.communicate()
    assert not list(run.glob(".rank-ended-by-signal.*"))


def weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def test_extending_a_cosine_run_is_refused(trained):
    line = one_line_error(train(trained, *args(8, 2), *COSINE))
    assert "train.max_steps: 4 -> 8" in line and "train.schedule=cosine" in line and "step 3" in line, line
    assert stored_step(trained / "checkpoints" / "last.ckpt") == 4


@pytest.mark.slow  # five short runs: about a minute
def test_extending_max_steps_is_exact_or_refused(tmp_path):
    const = ["--set", "train.schedule=constant"]
    for run, steps in (("straight", [12]), ("extended", [6, 12])):
        for n in steps:
            r = train(tmp_path / run, *args(n, 3), *const)
            assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 6" in r.stdout
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "extended")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert loss_steps(tmp_path / "extended") == list(range(1, 13))
    for schedule in ("cosine", "wsd"):  # a finished run: the cosine decays all along, the WSD decay is over
        run = tmp_path / schedule
        assert train(run, *args(6, 3), "--set", f"train.schedule={schedule}").returncode == 0
        line = one_line_error(train(run, *args(12, 3), "--set", f"train.schedule={schedule}"))
        assert "train.max_steps: 6 -> 12" in line and f"train.schedule={schedule}" in line, line
        assert stored_step(run / "checkpoints" / "last.ckpt") == 6


@pytest.mark.slow
def test_a_wsd_run_extends_before_its_decay(tmp_path):
    run = tmp_path / "run"
    wsd = ["--set", "train.schedule=wsd", "--set", "train.decay_fraction=0.5"]
    proc = start(run, *args(20, 4), *wsd)  # the decay would begin at step 10
    wait_for_step(proc, run, 5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    step = stored_step(run / "checkpoints" / "last.ckpt")
    assert 4 <= step < 10
    r = train(run, *args(24, 4), *wsd)
    assert r.returncode == 0 and f"at step {step}" in r.stdout, r.stderr[-3000:]
