"""Grids on a real SLURM cluster: the single-node cluster of slurm/local-cluster.sh (munge,
slurmctld, slurmd and two fake GPUs on this machine), started once for this module.

The tests skip, with the reason, only when the cluster cannot be started (e.g. not root and
SLURM not installed). Training steps here are as small as possible; times are dominated by
SLURM's own clock (a 30 s cycle for time-limit signals, ~10 s before a requeued job restarts).
"""

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from hybrid_lightning.grid import cell_states, load_grid
from hybrid_lightning.grid.slurm import squeue_jobs
from hybrid_lightning.grid.spec import format_value
from hybrid_lightning.grid.state import read_jobs
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.training.hparams import STUDY_KEYS
from test_grid import TINY_BASE, loss_steps, write_grid

pytestmark = pytest.mark.slow
SCRIPT = REPO / "slurm" / "local-cluster.sh"


@contextlib.contextmanager
def local_cluster(*args: str, cpus: int = 4):
    """A running cluster of slurm/local-cluster.sh (``up ARGS``), each node declaring ``cpus`` CPUs;
    SLURM_CONF points at it meanwhile. Skips, with the reason, where SLURM cannot be started."""
    folder = Path(tempfile.mkdtemp(prefix="hl-slurm-"))
    try:
        up = subprocess.run(["bash", str(SCRIPT), "up", *args, str(folder)], capture_output=True, text=True,
                            timeout=900,
                            env={**os.environ, "LOCAL_CLUSTER_CPUS": str(cpus)})
        reason = up.stderr.strip()[-1500:] if up.returncode else None
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = str(e)
    if reason is not None:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"SLURM could not be started on this machine, so the SLURM tests did not run: {reason}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    try:
        yield folder
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", str(folder)], capture_output=True, timeout=300)
        if previous is None:
            os.environ.pop("SLURM_CONF")
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="module")
def cluster():
    """A running single-node cluster; 4 CPUs declared on this 2-core machine: the tests' small jobs run side by side."""
    with local_cluster() as folder:
        yield folder


def profile(folder, **params):
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump({"slurm_partition": "debug", "timeout_min": 10, "cpus_per_task": 1, "mem_gb": 1,
                                    **params}))
    return path


def tiny(**train):
    return {**TINY_BASE, "train": {**TINY_BASE["train"], **train}}


def submit(path, profile_path, *extra):
    r = run_cli("grid", "submit", str(path), "--executor", "slurm", "--profile", str(profile_path), *extra, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def wait(grid, until, timeout=600, seen=None):
    """Polls the grid's states until ``until(rows)``; ``seen`` collects each cell's states in order."""
    deadline = time.time() + timeout
    while True:
        rows = {r.name: r for r in cell_states(grid)}
        for r in rows.values():
            if seen is not None and (not seen.get(r.name) or seen[r.name][-1] != r.state):
                seen.setdefault(r.name, []).append(r.state)
        if until(rows):
            return rows
        if time.time() > deadline:
            tails = {n: Path(r.log).read_text()[-2000:] for n, r in rows.items() if r.log and Path(r.log).is_file()}
            pytest.fail(f"timed out; states {[(r.name, r.state, r.step) for r in rows.values()]}; logs: {tails}")
        time.sleep(1)


def all_done(rows):
    return all(r.state == "done" for r in rows.values())


def steps_per_second(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("train/loss")[2:]  # the first steps include warm-up work
    return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time)


@pytest.fixture(scope="module")
def finished_grid(cluster, tmp_path_factory):
    """E2's grid: three cells submitted as one job array with the shipped local profile, run to the end."""
    folder = tmp_path_factory.mktemp("e2")
    path = write_grid(folder, "e2", base=tiny(), axes={"model.window": [8, 16, 32]})
    out = submit(path, REPO / "slurm" / "local.yaml")
    assert "3 to submit" in out and "submitted 3 cell(s) as SLURM job" in out, out
    grid = load_grid(path)
    wait(grid, all_done)
    return path, grid


@pytest.fixture(scope="module")
def rate(finished_grid):
    """Training steps per second of a tiny cell in a 1-CPU job on this machine, now."""
    return statistics.median(steps_per_second(c.run_dir) for c in finished_grid[1].cells)


def test_job_array_runs_every_cell_where_status_says(finished_grid, requeue_run):
    """E2. (``requeue_run`` starts E3's long cell now, so that it trains during the other tests.)"""
    path, grid = finished_grid
    r = run_cli("grid", "status", str(path), "--json", timeout=300)
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == ["window=8", "window=16", "window=32"]
    array = {row["job_id"].split("_")[0] for row in rows}
    assert len(array) == 1  # one job array
    for row, cell in zip(rows, grid.cells):
        assert row["state"] == "done" and row["step"] == row["max_steps"] == 20 and row["loss"] > 0
        assert row["run_dir"] == str(cell.run_dir) and read_status(cell.run_dir)["slurm_job_id"]
        assert checkpoint_is_valid(cell.run_dir / "checkpoints" / "last.ckpt")
        log = Path(row["log"]).read_text()
        assert f"grid cell {cell.name}: job {row['job_id']}" in log and "Job completed successfully" in log
    again = submit(path, REPO / "slurm" / "local.yaml")
    assert "0 to submit" in again and "submitted" not in again


def test_tensorboard_server_lists_every_cell_with_hparams(finished_grid):
    """E8: a real TensorBoard server over the grid's root, read through its HTTP API."""
    _, grid = finished_grid
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tensorboard = Path(sys.executable).parent / "tensorboard"
    server = subprocess.Popen([str(tensorboard), "--logdir", str(grid.root), "--host", "127.0.0.1", "--port", str(port),
                               "--reload_interval", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def get(route, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base + route, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    names = [c.name for c in grid.cells]
    try:
        deadline = time.time() + 120
        while True:
            try:
                tags = get("/data/plugin/scalars/tags")
                if all("train/loss" in tags.get(n, {}) for n in names):
                    break
            except OSError:
                pass
            assert time.time() < deadline and server.poll() is None, "TensorBoard did not list the cells"
            time.sleep(1)
        assert set(names) <= set(get("/data/runs"))
        for name in names:
            points = get(f"/data/plugin/scalars/scalars?run={urllib.parse.quote(name)}&tag=train/loss")
            assert [step for _, step, _ in points] == list(range(1, 21))
        experiment = get("/data/plugin/hparams/experiment", {"experimentName": ""})
        assert sorted(h["name"] for h in experiment["hparamInfos"]) == sorted(STUDY_KEYS)  # the axis is one of them
        assert "." not in get("/data/runs")  # the grid's root holds no event file
        assert {m["name"]["tag"] for m in experiment["metricInfos"]} >= {"train/loss", "val/loss", "val_longctx/score"}
        groups = get("/data/plugin/hparams/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 100,
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
            "colParams": [{"hparam": "model.window"}, {"metric": {"group": "", "tag": "train/loss"}}],
        })["sessionGroups"]
        by_window = {g["hparams"]["model.window"]: g for g in groups}
        assert sorted(by_window, key=int) == ["8", "16", "32"]  # as the grid writes them (grid.spec.format_value)
        for row, cell in zip(cell_states(grid), grid.cells):  # each cell's final train/loss is its metric
            final = [m for m in by_window[format_value(cell.labels["model.window"])]["metricValues"]
                     if m["name"]["tag"] == "train/loss"]
            assert final[0]["trainingStep"] == 20 and final[0]["value"] == pytest.approx(row.loss)
    finally:
        server.terminate()
        server.wait(timeout=30)


class Watcher(threading.Thread):
    """Polls a one-cell grid every second and keeps each change of state; after the cell's first
    requeue it raises the job's time limit, so the rest trains in one go."""

    def __init__(self, grid, timeout: float):
        super().__init__(daemon=True)
        self.grid, self.deadline, self.states, self.error = grid, time.time() + timeout, [], None

    def run(self):
        try:
            while time.time() < self.deadline:
                row = cell_states(self.grid)[0]
                if not self.states or self.states[-1] != row.state:
                    self.states.append(row.state)
                    if row.state == "requeued" and self.states.count("requeued") == 1:
                        job = read_jobs(self.grid)[row.name][-1]["job_id"]
                        subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], check=True, timeout=60)
                if row.state in ("done", "failed"):
                    return
                time.sleep(1)
        except Exception as e:  # reported by the test
            self.error = e


@pytest.fixture(scope="module")
def requeue_run(cluster, rate, tmp_path_factory):
    """E3's cell: about two minutes of training (at the measured speed) under a 1-minute time
    limit. slurmctld signals at its first 30 s check within delay + 30 s of the limit: with a
    10 s delay, 20-50 s into the job, after the job's signal handlers are in place. Submitted
    early, it trains while the following tests run."""
    folder = tmp_path_factory.mktemp("e3")
    steps = max(100, int(rate * 120))
    short = profile(folder, timeout_min=1, slurm_signal_delay_s=10, slurm_max_num_timeout=30)
    path = write_grid(folder, "e3", base=tiny(max_steps=steps, checkpoint_every_n_steps=max(10, steps // 4)),
                      axes={"seed": [0]})
    submit(path, short)
    grid = load_grid(path)
    watcher = Watcher(grid, timeout=900)
    watcher.start()
    return grid, steps, watcher


def test_scancelled_cell_is_resubmitted_alone_and_resumes(cluster, rate, tmp_path):
    """E4."""
    long_steps = max(60, int(rate * 60))  # about a minute: still running when the short cell is done
    path = write_grid(tmp_path, "e4", base=tiny(checkpoint_every_n_steps=5), axes={
        "length": {"short": {"train.max_steps": 10}, "long": {"train.max_steps": long_steps}},
    })
    submit(path, profile(tmp_path))
    grid = load_grid(path)
    short, long = grid.cells
    wait(grid, lambda rows: rows[short.name].state == "done" and rows[long.name].state == "running"
         and (long.run_dir / "checkpoints" / "last.ckpt").is_file())
    job = read_jobs(grid)[long.name][-1]["job_id"]
    subprocess.run(["scancel", job], check=True, timeout=60)
    rows = wait(grid, lambda rows: rows[long.name].state == "cancelled", timeout=120)
    assert rows[short.name].state == "done"
    status = run_cli("grid", "status", str(path), timeout=300).stdout
    assert f"cancelled {long.name}: cancelled at" in status and "2 cells: 1 cancelled, 1 done" in status, status
    assert read_jobs(grid)[short.name][-1]["log"] in status  # where the log is
    before = {p: p.stat().st_mtime_ns for p in short.run_dir.rglob("*")}

    out = submit(path, profile(tmp_path))
    assert "1 to submit" in out and "submitted 1 cell(s)" in out, out
    wait(grid, all_done)
    jobs = read_jobs(grid)
    assert len(jobs[short.name]) == 1 and len(jobs[long.name]) == 2
    assert "resuming from" in Path(jobs[long.name][-1]["log"]).read_text()
    assert loss_steps(long.run_dir) == list(range(1, long_steps + 1))
    assert {p: p.stat().st_mtime_ns for p in short.run_dir.rglob("*")} == before  # the done cell is untouched


def test_concurrent_submits_submit_each_cell_once_and_cancel(cluster, tmp_path):
    """E5, and ``grid cancel``."""
    path = write_grid(tmp_path, "e5", base=tiny(max_steps=100000), axes={"model.window": [8, 16, 32]})
    command = [sys.executable, "-m", "hybrid_lightning", "grid", "submit", str(path), "--executor", "slurm",
               "--profile", str(profile(tmp_path))]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (sorted("3 to submit" in o for o in outs) == [False, True]
            and sum("0 to submit" in o for o in outs) == 1), outs
    grid = load_grid(path)
    jobs = read_jobs(grid)
    assert all(len(jobs[c.name]) == 1 for c in grid.cells)
    ids = {jobs[c.name][0]["job_id"] for c in grid.cells}
    assert ids <= set(squeue_jobs()) and len(ids) == 3

    r = run_cli("grid", "cancel", str(path), timeout=300)
    assert r.returncode == 0 and "cancelled 3 cell(s)" in r.stdout, r.stdout + r.stderr
    wait(grid, lambda rows: not set(squeue_jobs()) & ids, timeout=120)
    # read after the queue is seen empty: states read before it may still show a job completing
    assert {r.state for r in cell_states(grid)} == {"cancelled"}


def test_gpu_request_and_cpu_ddp_through_slurm(cluster, tmp_path):
    """E6: a 2-GPU cell asks SLURM for 2 GPUs and 2 tasks (its tasks see both fake GPUs; with no
    CUDA here it then fails, naming why); a 2-task CPU DDP cell trains, and only rank 0 writes."""
    path = write_grid(tmp_path, "e6", base=tiny(max_steps=10, checkpoint_every_n_steps=5), axes={"world": {
        "gpu2": {"train.accelerator": "gpu", "train.devices": 2},
        "ddp2": {"train.accelerator": "cpu", "train.devices": 2, "train.strategy": "ddp"},
    }})
    out = submit(path, profile(tmp_path))
    assert ("(1 node(s) x 2 task(s), 2 GPU(s) per node each)" in out
            and "(1 node(s) x 2 task(s), 0 GPU(s) per node each)" in out)
    grid = load_grid(path)
    gpu, ddp = grid.cells
    rows = wait(grid, lambda rows: rows[gpu.name].state == "failed" and rows[ddp.name].state == "done")
    assert "gpu" in rows[gpu.name].reason.lower(), rows[gpu.name]
    jobs = read_jobs(grid)
    gpu_job, ddp_job = jobs[gpu.name][0]["job_id"], jobs[ddp.name][0]["job_id"]
    folder = grid.state_dir / "slurm"
    script = (folder / f"{gpu_job}_submission.sh").read_text()
    assert "#SBATCH --gpus-per-node=2" in script and "#SBATCH --ntasks-per-node=2" in script
    for task in (0, 1):
        assert f"task {task} of 2 on" in (log := (folder / f"{gpu_job}_{task}_log.out").read_text())
        assert "CUDA_VISIBLE_DEVICES=0,1" in log
    script = (folder / f"{ddp_job}_submission.sh").read_text()
    assert "#SBATCH --ntasks-per-node=2" in script and "gpus" not in script
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (folder / f"{ddp_job}_1_log.out").read_text()
    events = [p for p in ddp.run_dir.glob("events.out.tfevents.*") if not p.name.endswith(".hparams")]
    assert len(events) == 1  # one writer: rank 0
    assert loss_steps(ddp.run_dir) == list(range(1, 11))
    assert sorted(p.name for p in (ddp.run_dir / "checkpoints").iterdir()) == ["last.ckpt", "step_0000005.ckpt",
                                                                               "step_0000010.ckpt"]
    assert read_status(ddp.run_dir)["state"] == "done"


def test_bad_submissions_submit_nothing(cluster, tmp_path):
    """E7 with SLURM: an unreachable controller, a partition the cluster does not have and a request
    sbatch refuses fail with a clear message and leave no job; bad grid files and profiles are tested
    in test_grid.py."""
    path = write_grid(tmp_path, "e7", base=tiny(), axes={"model.window": [8]})
    conf = Path(os.environ["SLURM_CONF"]).read_text().splitlines()
    dead = tmp_path / "dead.conf"
    dead.write_text("\n".join("SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line for line in conf) + "\n")
    r = run_cli("grid", "submit", str(path), "--executor", "slurm", "--profile", str(profile(tmp_path)),
                env={"SLURM_CONF": str(dead)}, timeout=300)
    assert r.returncode == 2 and "SLURM is unreachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli("grid", "submit", str(path), "--executor", "slurm",
                "--profile", str(profile(tmp_path, slurm_partition="nope")),
                timeout=300)
    assert (r.returncode == 2
            and "'nope' is not a partition of this cluster (sinfo lists ['debug'])" in r.stderr), r.stderr
    r = run_cli("grid", "submit", str(path), "--executor", "slurm", "--profile", str(profile(tmp_path, mem_gb=100000)),
                timeout=300)
    assert r.returncode == 2 and "sbatch refused" in r.stderr and "memory specification" in r.stderr.lower(), r.stderr
    assert read_jobs(load_grid(path)) == {}


def test_timeout_requeues_and_resumes_without_gaps(requeue_run):
    """E3: the cell is signalled before its time limit, stops at a step boundary with last.ckpt, is
    requeued by submitit (grid status shows it), resumes, and reaches max_steps; its TensorBoard
    series has every step once."""
    grid, steps, watcher = requeue_run
    watcher.join(timeout=900)
    assert watcher.error is None and not watcher.is_alive()
    row = cell_states(grid)[0]
    assert "requeued" in watcher.states, f"never requeued (states {watcher.states}): finished within one time limit?"
    assert row.state == "done" and row.step == steps, (row, watcher.states)
    log = Path(row.log).read_text()
    assert "requeue signal; stopping at the next step" in log and "Requeued job" in log
    assert "resuming from last.ckpt at step" in log
    assert len(read_jobs(grid)[row.name]) == 1  # one submission, requeued by SLURM
    assert loss_steps(grid.cells[0].run_dir) == list(range(1, steps + 1))  # no duplicated, no missing step
