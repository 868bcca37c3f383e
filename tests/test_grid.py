"""Grid files, names, plans, profiles and the local executor (no SLURM needed)."""

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO, run_cli
from hybrid_lightning.config import TrainConfig, config_to_dict, validate_config
from hybrid_lightning.grid import cell_states, load_grid
from hybrid_lightning.grid.capacity import plan_gpu
from hybrid_lightning.grid.geometry import cell_resources
from hybrid_lightning.grid.report import plan_rows, status_table
from hybrid_lightning.grid.slurm import load_profile
from hybrid_lightning.grid.spec import MAX_NAME, cell_name_for
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.training.checkpoints import StopOnRequest
from hybrid_lightning.training.run import train

# A model small enough that a cell trains in seconds on 2 cores.
TINY_BASE = {
    "model": {"n_layers": 2, "d_model": 64, "n_heads": 2, "pattern": "EF", "window": 32},
    "train": {"max_steps": 20, "batch_size": 8, "seq_len": 128, "warmup_steps": 2, "progress_bar": False,
              "schedule": "constant", "log_every_n_steps": 1, "checkpoint_every_n_steps": 10,
              "val_every_n_steps": 1000},
    "data": {"max_tokens": 2_000_000},
    "eval": {"every_n_steps": 0, "at_end": False},  # the long-context evaluation is tested on its own
}


def write_grid(folder, name="g", base=None, **spec):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"base": base if base is not None else TINY_BASE,
                                    "root": str(folder / "runs" / name), **spec}, sort_keys=False))
    return path


def loss_steps(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]


@pytest.mark.slow
def test_plan_lists_the_product_minus_exclusions_with_stable_names(tmp_path):
    """E1: 3 axes x 2-3 values, one exclusion; the same names in two separate processes."""
    path = write_grid(
        tmp_path, axes={"model.window": [16, 32, 64], "model.pos.full": ["rope", "nope"], "seed": [0, 1]},
        exclude=[{"model.window": 64, "model.pos.full": "nope"}],
    )
    first = run_cli("grid", "plan", str(path), "--json", timeout=300)
    second = run_cli("grid", "plan", str(path), "--throughput", "1e4", timeout=300)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    cells = json.loads(first.stdout)
    expected = [f"window={w},pos.full={p},seed={s}" for w in (16, 32, 64) for p in ("rope", "nope") for s in (0, 1)
                if not (w == 64 and p == "nope")]
    assert [c["name"] for c in cells] == expected
    assert cells[0]["overrides"] == {"model.window": 16, "model.pos.full": "rope", "seed": 0}
    assert cells[0]["tokens"] == 20 * 8 * 128 and cells[0]["non_embedding_params"] > 0
    table = second.stdout.splitlines()
    assert table[0].split()[:4] == ["cell", "model.window", "model.pos.full", "seed"] and "GPU-h" in table[0]
    assert [line.split()[0] for line in table[1:11]] == expected  # same names from another process
    assert table[11].startswith("10 cells")
    assert [c.name for c in load_grid(path).cells] == expected  # and from this one


def test_the_shipped_grid_and_profiles_are_valid(tmp_path):
    grid = load_grid(REPO / "ablations" / "window-nope.yaml", root=tmp_path)
    assert len(grid.cells) == 10 and grid.cells[0].name == "size=s,window=64,pos.full=rope,seed=0"
    assert grid.cells[-1].config.model.d_model == 256 and grid.cells[-1].config.model.window == 128
    assert load_profile(REPO / "slurm" / "local.yaml")["slurm_partition"] == "debug"
    assert load_profile(REPO / "slurm" / "example.yaml")["gpus_per_node"] == 8


def test_the_replica_grids(tmp_path):
    """The replica (its fifth edition): the 1 : 1 hybrids with their seeds as declared, on the files cpu_replica.sh
    writes under runs/ (stand-ins beside a copy), LongPPL on the committed pilot's key tokens, every checkpoint
    kept; the scaling grid's 4 architectures x 4 sizes x 4 budgets as branches of one stable phase each."""
    from hybrid_lightning.training.preflight import check_evaluator

    (tmp_path / "ablations").mkdir()
    for name in ("cpu_replica.yaml", "cpu_replica_scaling.yaml"):
        shutil.copy(REPO / "ablations" / name, tmp_path / "ablations")
    evaluator = tmp_path / "analysis" / "results" / "cpu_replica_pilot5" / "evaluator"
    shutil.copytree(REPO / "analysis" / "results" / "cpu_replica_pilot5" / "evaluator", evaluator)
    data = tmp_path / "runs" / "cpu_replica"
    data.mkdir(parents=True)
    for name in ("probes", "text", "text_val"):
        (data / f"{name}.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    main = load_grid(tmp_path / "ablations" / "cpu_replica.yaml", root=tmp_path / "grid")
    seeds = {}
    for c in main.cells:
        seeds.setdefault(c.name.split("arch=")[1], set()).add(c.config.seed)
    assert seeds.pop("swa8") == seeds.pop("swa32") == set(range(5)) and len(main.cells) == 39
    assert seeds.pop("swa128") == seeds.pop("swa8-nope") == set(range(4))
    assert all(s == {0, 1, 2} for s in seeds.values()) and len(seeds) == 7
    patterns = {c.name.split("arch=")[1]: c.config.model.pattern for c in main.cells}
    assert patterns["swa8-1to3"] == "EEEF" and patterns["headwise8"] == "H" and patterns["fe32"] == "FE"
    assert {p for a, p in patterns.items() if a not in ("swa8-1to3", "headwise8", "fe32", "full")} == {"EF"}
    ev = main.cells[0].config.eval
    assert ev.longppl_evaluator == str(evaluator.resolve()) and (ev.position_sequences, ev.position_len) == (64, 512)
    check_evaluator(ev.longppl_evaluator, tmp_path / "grid" / main.cells[0].name)  # a finished run's directory
    assert main.cells[0].config.train.keep_checkpoints == -1 and main.verdicts.declared()["ablation"]["pooled"]
    assert {c.config.data.text_val_files for c in main.cells} == {(str((data / "text_val.jsonl").resolve()),)}
    assert {c.config.model.n_heads for c in main.cells} == {4} and not [c for c in main.cells if c.exploratory]
    scaling = load_grid(tmp_path / "ablations" / "cpu_replica_scaling.yaml", root=tmp_path / "scaling")
    assert len(scaling.cells) == 64 and {c.config.model.d_model for c in scaling.cells} == {24, 32, 48, 64}
    assert {c.config.train.max_steps for c in scaling.cells} == {1000, 2000, 3000, 4000}
    assert {c.config.train.stable_phase is not None for c in scaling.cells} == {True}


def test_presets_zip_and_long_names(tmp_path):
    path = write_grid(
        tmp_path,
        axes={"size": {"small": {"model.d_model": 64}, "wide": {"model": {"d_model": 128, "n_heads": 4}}}},
        zip=[{"model.window": [8, 16], "train.lr": [1e-3, 3e-4]}],
        exclude=[{"size": "wide", "model.window": 16}],
    )
    grid = load_grid(path)
    assert [c.name for c in grid.cells] == ["size=small,window=8,lr=0.001", "size=small,window=16,lr=0.0003",
                                            "size=wide,window=8,lr=0.001"]
    wide = grid.cells[2]
    assert wide.config.model.d_model == 128 and wide.config.model.n_heads == 4 and wide.config.name == wide.name
    assert wide.overrides == {"model.d_model": 128, "model.n_heads": 4, "model.window": 8, "train.lr": 0.001}
    # Long or unsafe names keep a readable prefix and end in a hash of the values: unique, stable.
    labels = {"data.files": ["/data/a very long path/shard-000.jsonl"] * 4, "seed": 0}
    name = cell_name_for(labels)
    assert len(name) <= MAX_NAME and name.startswith("data.files=") and name == cell_name_for(dict(labels))
    assert name != cell_name_for({**labels, "seed": 1}) and "/" not in name and " " not in name
    assert cell_name_for({"model.window": 8, "other.window": 8},
                         {"model.window": "model.window"}) == "model.window=8,other.window=8"


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"axes": {"model.windw": [8, 16]}}, "unknown config key 'model.windw'; did you mean 'model.window'"),
        ({"axes": {"model.window": []}}, "axes.model.window: empty axis"),
        ({"axes": {"model.window": 8}}, "axes.model.window: an axis is a list"),
        ({"axes": {"model.window": [8, 0]}}, "cell window=0: invalid config: model.window"),
        ({"axes": {"model.window": [8]}, "exclude": [{"model.windo": 8}]},
         "'model.windo' is not an axis; did you mean 'model.window'"),
        ({"axes": {"model.window": [8]}, "exclude": [{"model.window": 9}]},
         "model.window=9 is not a value of that axis"),
        ({"axes": {"model.window": [8, 16]}, "exclude": [{"model.window": 8}, {"model.window": 16}]}, "leave no cell"),
        ({"axes": {"model.window": [8]}, "exploratory": [{"model.windo": 8}]}, "exploratory[0]: 'model.windo' is not"),
        ({"axes": {"model.window": [8, 16]}, "exclude": [{"model.window": 8}], "exploratory": [{"model.window": 8}]},
         "exploratory[0] {'model.window': 8} matches no cell (left after the exclusions)"),
        ({"axes": {"model.window": [8]}, "exploratory": [{}]}, "exploratory[0]: an empty entry"),
        ({"zip": [{"model.window": [8, 16], "seed": [0]}]}, "need equal lengths"),
        ({"axes": {"model.window": [8]}, "zip": [{"model.window": [8]}]}, "varied more than once"),
        ({"axis": {"model.window": [8]}}, "unknown grid key 'axis'; did you mean 'axes'"),
        ({"base": "missing.yaml"}, "base: config file not found"),
        ({"axes": {"seed": [1, "1"]}}, 'seed: takes numbers, not the string "1"'),
        ({"axes": {"model.window": [16, 16.0]}}, "model.window: takes whole numbers, not 16.0; write 16"),
        ({"axes": {"train.lr": [0.001, 1.0e-3]}}, "are one run (lr=0.001)"),
        ({"axes": {"eval.at_end": [True], "eval.lengths": [[1024], [200]]}}, "eval.lengths: 200 tokens is too short"),
        ({"axes": {"eval.heads.at_end": [True], "eval.heads.lengths": [[256]]}}, "eval.heads.lengths"),
    ],
)
def test_bad_grids_name_the_problem(tmp_path, spec, message):
    """E7 (no SLURM needed): every problem is a ValueError naming it, found before anything runs."""
    base = spec.pop("base", None)
    with pytest.raises(ValueError) as e:
        load_grid(write_grid(tmp_path, base=base, **spec))
    assert message in str(e.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_bad_grid_on_the_command_line_exits_2_and_submits_nothing(tmp_path):
    path = write_grid(tmp_path, axes={"model.window": [8, 0]})
    for args in (["plan", str(path)], ["submit", str(path), "--executor", "local"]):
        r = run_cli("grid", *args, timeout=300)
        assert r.returncode == 2 and "cell window=0" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()
    good = write_grid(tmp_path, name="ok", axes={"model.window": [8]})
    r = run_cli("grid", "submit", str(good), "--executor", "slurm", "--profile", str(tmp_path / "nope.yaml"),
                timeout=300)
    assert r.returncode == 2 and "profile not found" in r.stderr and not (tmp_path / "runs").exists(), r.stderr


def test_profiles_are_checked_and_resources_follow_the_cell(tmp_path):
    cases = [
        ({"slurm_partitoin": "debug"}, "unknown submitit parameter 'slurm_partitoin'; did you mean 'slurm_partition'"),
        ({"slurm_gpus_per_task": 1}, "'slurm_gpus_per_task' follows from each cell (train.devices GPUs per node)"),
        ({"nodes": "two"}, "nodes must be a whole number >= 1, got 'two'"),
        ({"timeout_min": "soon"}, "timeout_min"),
    ]
    for profile, message in cases:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(profile))
        with pytest.raises(ValueError) as e:
            load_profile(path)
        assert message in str(e.value)
    with pytest.raises(ValueError, match="needs --profile"):
        load_profile(None)

    def res(default_gpus=0, **train):
        return cell_resources(TrainConfig(**train), default_gpus)

    assert res() == (1, 1, 0)  # a CPU cell: one task
    assert res(accelerator="cpu", devices=2) == (1, 2, 0)  # CPU DDP: one task per process
    assert res(accelerator="gpu", devices=2) == (1, 2, 2)  # tasks per node = GPUs per node
    assert res(accelerator="gpu", devices=4, num_nodes=2) == (2, 4, 4)
    assert res(8) == (1, 8, 8)  # devices: auto takes the profile's gpus_per_node
    assert res(8, accelerator="cpu") == (1, 1, 0)


def test_status_reads_the_last_loss_and_a_long_context_score_when_present(tmp_path):
    """score (longctx/score, lengths up to train.seq_len) and beyond (longctx/score_beyond): a run whose
    probes are all longer than its training length still shows a score."""
    from torch.utils.tensorboard import SummaryWriter

    grid = load_grid(write_grid(tmp_path, axes={"seed": [0, 1]}))
    with_score, without = grid.cells
    writer = SummaryWriter(str(with_score.run_dir))
    for step in range(1, 6):  # the optimizer steps completed
        writer.add_scalar("train/loss", 3.0 - (step - 1) / 4, step)
    writer.add_scalar("val_longctx/score", 0.375, 5)
    writer.close()
    writer = SummaryWriter(str(without.run_dir))
    writer.add_scalar("train/loss", 2.5, 1)
    writer.add_scalar("val_longctx/score_beyond", 0.125, 1)
    writer.close()
    rows = cell_states(grid)
    assert (rows[0].step, rows[0].loss, rows[0].longctx, rows[0].longctx_beyond) == (5, 2.0, 0.375, None)
    assert (rows[1].step, rows[1].loss, rows[1].longctx, rows[1].longctx_beyond) == (1, 2.5, None, 0.125)
    table = status_table(rows).splitlines()
    assert table[0].split() == ["cell", "state", "step", "loss", "score", "beyond", "job", "log"]
    assert table[1].split()[:7] == ["seed=0", "not", "submitted", "5/20", "2.000", "0.375", "-"]
    assert table[2].split()[4:7] == ["2.500", "-", "0.125"] and table[3] == "2 cells: 2 not submitted"


def test_stop_on_request_saves_and_resumes_without_a_gap(tmp_path):
    """The requeue path without SLURM: asked to stop, training ends at the step boundary with
    last.ckpt; the next start resumes there and TensorBoard holds every step once."""
    cfg = validate_config({**TINY_BASE, "train": {**TINY_BASE["train"], "max_steps": 12,
                                                  "checkpoint_every_n_steps": 100}})
    run_dir = tmp_path / "run"
    request = threading.Event()
    request.set()
    train(cfg, run_dir, [StopOnRequest(request)])
    status = read_status(run_dir)
    assert status["state"] == "interrupted" and status["step"] == 1
    assert checkpoint_is_valid(run_dir / "checkpoints" / "last.ckpt")
    train(cfg, run_dir)
    assert read_status(run_dir)["state"] == "done"
    assert loss_steps(run_dir) == list(range(1, 13))


@pytest.mark.slow
def test_local_executor_failures_resume_and_concurrent_submits(tmp_path):
    """E9, E10 and idempotence on the local executor: a NaN cell fails with its diagnostic and
    keeps its good checkpoint; a corrupted last.ckpt resumes from the newest valid checkpoint;
    a second concurrent submit runs nothing twice."""
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "warmup_steps": 0, "grad_clip": None}}
    # lr 1e4 makes the gradient non-finite within a few steps, after a checkpoint of every good step
    axes = {"run": {"ok": {"train.lr": 0.003}, "nan": {"train.lr": 10000.0, "train.checkpoint_every_n_steps": 1}}}
    path = write_grid(tmp_path, base=base, axes=axes)
    first = subprocess.Popen([sys.executable, "-m", "hybrid_lightning", "grid", "submit", str(path),
                              "--executor", "local"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    grid = load_grid(path)
    deadline = time.time() + 120
    while not (grid.state_dir / "jobs.json").is_file():  # the first submit has claimed the cells
        assert time.time() < deadline and first.poll() is None
        time.sleep(0.2)
    second = run_cli("grid", "submit", str(path), "--executor", "local", timeout=300)
    assert second.returncode == 0 and "0 to submit" in second.stdout, second.stdout + second.stderr
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 1, out  # one cell failed
    assert "done   run=ok" in out and "FAILED run=nan: NonFiniteLossError" in out, out

    ok, nan = grid.cells
    rows = {r.name: r for r in cell_states(grid)}
    assert rows[ok.name].state == "done" and rows[ok.name].step == 20
    assert rows[nan.name].state == "failed"
    reason = rows[nan.name].reason
    bad = re.fullmatch(r"NonFiniteLossError: non-finite (?:gradient of \S+|training loss \(\S+\)) at step (\d+)",
                       reason)
    assert bad and int(bad[1]) >= 1, reason
    assert checkpoint_is_valid(nan.run_dir / "checkpoints" / "last.ckpt")  # the last good step's checkpoint is kept
    assert torch.load(nan.run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == int(bad[1])
    assert f"failed run=nan: {reason}" in status_table(cell_states(grid))

    # Train the finished cell 10 steps more, after damaging its two newest checkpoints.
    longer = write_grid(tmp_path, base={**base, "train": {**base["train"], "max_steps": 30}}, axes=axes,
                        exclude=[{"run": "nan"}])
    (ok.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"truncated")
    step20 = ok.run_dir / "checkpoints" / "step_0000020.ckpt"
    step20.write_bytes(step20.read_bytes()[: step20.stat().st_size // 2])
    assert [r.state for r in cell_states(load_grid(longer))] == ["incomplete"]
    again = run_cli("grid", "submit", str(longer), "--executor", "local", timeout=600)
    assert again.returncode == 0 and "1 to submit" in again.stdout, again.stdout + again.stderr
    log = (grid.state_dir / "logs" / f"{ok.name}.log").read_text()
    assert f"skipping damaged checkpoint {ok.run_dir / 'checkpoints' / 'last.ckpt'}" in log
    assert f"skipping damaged checkpoint {step20}" in log
    assert "resuming from step_0000010.ckpt at step 10" in log  # at most one checkpoint interval lost
    assert "done   run=ok" in again.stdout and read_status(ok.run_dir)["step"] == 30
    assert loss_steps(ok.run_dir) == list(range(1, 31))


def test_the_paper_grid_spans_the_papers_sizes_and_budgets(tmp_path):
    """H1: the paper's matrix, parameter-matched, 15M-477M non-embedding parameters, 100N-1000N tokens."""
    grid = load_grid(REPO / "ablations" / "paper.yaml", root=tmp_path)
    rows = plan_rows(grid, plan_gpu(None, 400, None))
    assert len(rows) == 12 * 5 * 6
    by_size: dict[str, list[int]] = {}
    for row in rows:
        by_size.setdefault(row["axes"]["size"], []).append(row["non_embedding_params"])
        budget = row["axes"]["train.tokens_per_param"]
        assert (budget * row["non_embedding_params"] <= row["tokens"]
                < budget * row["non_embedding_params"] + 8 * 4 * 16384)
        assert row["gpu_hours"] > 0
    for counts in by_size.values():  # parameter-matched: every architecture within 2% of full attention
        assert max(counts) / min(counts) < 1.02
    sizes = sorted(min(c) for c in by_size.values())
    assert 14e6 < sizes[0] < 16e6 and 460e6 < sizes[-1] < 480e6


def test_tokens_per_param_sets_the_steps(tmp_path):
    from hybrid_lightning.plan.matching import non_embedding_params
    from hybrid_lightning.plan.resolve import resolve_config

    train = {"tokens_per_param": 20, "devices": 1, "batch_size": 4, "seq_len": 64, "warmup_steps": 5}
    cfg = resolve_config(validate_config({**TINY_BASE, "train": {**TINY_BASE["train"], **train}}))
    n = non_embedding_params(cfg.model)
    assert cfg.train.max_steps == -(-20 * n // (4 * 64))
    # config.yaml round trip
    assert resolve_config(validate_config(config_to_dict(cfg))).train.max_steps == cfg.train.max_steps
    with pytest.raises(ValueError, match="train.tokens_per_param needs train.devices"):
        validate_config({"train": {"tokens_per_param": 20}})
    with pytest.raises(ValueError, match="warmup_steps=50000 must be below"):
        resolve_config(validate_config({**TINY_BASE, "train": {**TINY_BASE["train"], **train, "warmup_steps": 50000}}))


@pytest.mark.slow
def test_a_grid_started_in_the_background_stops_its_cells_with_a_checkpoint(tmp_path):
    """``nohup hybrid-lightning grid submit ... &`` ignores SIGINT, and its cells inherited that: SIGTERM to
    the grid then sent them a SIGINT they ignored, and 30 s later killed them mid-step."""
    base = {**TINY_BASE, "train": {**TINY_BASE["train"], "max_steps": 100000, "checkpoint_every_n_steps": 100000}}
    path = write_grid(tmp_path, base=base, axes={"seed": [0]})
    grid = load_grid(path)
    proc = subprocess.Popen([sys.executable, "-m", "hybrid_lightning", "grid", "submit", str(path),
                             "--executor", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as a background job
    (cell,) = grid.cells
    deadline = time.time() + 300
    while ((read_status(cell.run_dir) or {}).get("step") or 0) < 3:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    status = read_status(cell.run_dir)
    assert status["state"] == "interrupted" and status["error"] == "SIGINT" and time.time() - t0 < 25, (
        status, out[-2000:])
    assert torch.load(cell.run_dir / "checkpoints" / "last.ckpt",
                      weights_only=False)["global_step"] == status["step"] >= 3


def test_a_cell_that_failed_before_its_run_directory_reads_as_failed(tmp_path):
    """A local cell whose process exited 2 before it made a run directory (a refused store): `grid status` gives the
    last line it wrote, and the report lists it as failed with that line, never as not started."""
    import os
    import socket

    from hybrid_lightning.cli.analysis import planned_cells
    from hybrid_lightning.grid.state import add_records

    grid = load_grid(write_grid(tmp_path, axes={"seed": [0, 1]}), resolve=False)
    failed, idle = grid.cells
    log = tmp_path / "failed.log"
    log.write_text("==== grid g: cell seed=0\nerror: data.store: /s is not empty and is not a token store\n\n")
    add_records(grid, {failed.name: {"executor": "local", "host": socket.gethostname(), "submitter": os.getpid(),
                                     "pid": 1, "pid_start": "gone", "exit": 2, "log": str(log)}})
    rows = {r.name: r for r in cell_states(grid)}
    line = "exit code 2: error: data.store: /s is not empty and is not a token store"
    assert (rows[failed.name].state, rows[failed.name].reason) == ("failed", line)
    assert f"failed {failed.name}: {line}" in status_table(list(rows.values()))
    assert planned_cells(grid) == [(failed.name, failed.run_dir, line), (idle.name, idle.run_dir, None)]


def test_exploratory_cells_are_marked_and_left_out_of_the_design_check(tmp_path):
    from hybrid_lightning.cli.analysis import exploratory_dirs
    from hybrid_lightning.grid.report import design_cells

    grid = load_grid(write_grid(tmp_path, axes={"model.window": [8, 16, 32], "seed": [0, 1]},
                                exploratory=[{"model.window": 32}]), resolve=False)
    assert [c.name for c in grid.cells if c.exploratory] == ["window=32,seed=0", "window=32,seed=1"]
    assert exploratory_dirs(grid) == {grid.root / "window=32,seed=0", grid.root / "window=32,seed=1"}
    assert [name for name, _, _ in design_cells(grid)] == [c.name for c in grid.cells[:4]]
