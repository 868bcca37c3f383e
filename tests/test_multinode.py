"""Training across nodes, and the checks of a cell's world before anything is submitted.

The slow tests share one two-node cluster (``slurm/local-cluster.sh up --nodes 2``: two slurmd on
this machine, nodes n1 and n2, each declaring 4 CPUs and two fake GPUs), started once for the module;
pytest's ``--durations`` times each part. A 2 x 1 and a 2 x 2 cell (DDP over gloo) end with the
weights of one process at the same global batch, within float rounding. A 2 x 1 cell stopped
mid-run on both nodes (the requeue signal, then requeued; scancel, then submitted again) or failed
by a task killed on one node (naming it; then submitted again) ends with exactly the weights of the
uninterrupted one. The refusals are one line each, exit code 2, and submit nothing.
"""

import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from hybrid_lightning.cli import main
from hybrid_lightning.config import validate_config
from hybrid_lightning.grid import load_grid
from hybrid_lightning.grid.state import read_jobs
from hybrid_lightning.rundir.checkpoints import find_resume_checkpoint
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.training.cluster import machine_cores
from hybrid_lightning.training.run import train
from test_accumulation import rel, weights
from test_faults import one_line_error
from test_grid import loss_steps, write_grid
from test_grid_slurm import all_done, local_cluster, profile, submit, tiny, wait

STEPS, EVERY = 60, 20  # training steps of every run here, and its periodic checkpoints
GLOBAL_BATCH = 12  # sequences a step: 6 on each of 2 ranks, 3 on each of 4
# fp32 over 60 steps, measured against one process: 2.4e-5 (2 x 1) and 1.35e-4 (2 x 2) worst relative
# difference of a weight tensor; the gradient's sum over ranks rounds in another order, and AdamW's
# division by the root of the second moment grows it (2.1e-6 at step 20, 1.3e-5 at step 40 for 2 x 1).
# Both ranks training on the same half of the batch (one process at batch 6) gives 0.9.
TOLERANCE = {1: 1e-4, 2: 5e-4}  # tasks per node -> worst relative difference allowed


def base(devices: int = 1, num_nodes: int = 2) -> dict:
    """The runs' config: DDP over gloo on CPU, ``devices`` x ``num_nodes`` ranks sharing GLOBAL_BATCH."""
    return tiny(accelerator="cpu", devices=devices, num_nodes=num_nodes,
                batch_size=GLOBAL_BATCH // (devices * num_nodes),
                max_steps=STEPS, checkpoint_every_n_steps=EVERY)


def refused(capsys, *args: str) -> str:
    """The one error line of ``hybrid-lightning ARGS`` run in this process, which must exit 2."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return one_line_error(subprocess.CompletedProcess(args, code, out, err))


def test_plan_refuses_a_profile_that_contradicts_a_cell(tmp_path, capsys):
    path = write_grid(tmp_path, base=base(), axes={"seed": [0]})
    line = refused(capsys, "grid", "plan", str(path), "--set", "nodes=4")
    assert "--set: nodes=4 disagrees with cell seed=0's train.num_nodes=2" in line, line
    prof = tmp_path / "p.yaml"
    prof.write_text("slurm_partition: debug\ntasks_per_node: 2\n")
    line = refused(capsys, "grid", "plan", str(path), "--profile", str(prof))
    assert f"profile {prof}: tasks_per_node=2 disagrees with cell seed=0's train.devices=1" in line, line
    assert main(["grid", "plan", str(path), "--profile", str(prof), "--set", "tasks_per_node=1",
                 "--set", "nodes=2"]) == 0


def test_cpu_devices_above_the_cores_are_refused(tmp_path, capsys):
    """``devices: N`` on CPU starts N processes on one node: more than this machine's cores is refused
    by grid plan, grid submit --executor local and train, before anything is written."""
    too_many = machine_cores() + 1
    path = write_grid(tmp_path, base=tiny(accelerator="cpu", devices=too_many), axes={"seed": [0]})
    expected = f"train.devices={too_many} on CPU (train.accelerator=cpu) starts {too_many} training processes"
    for args in (["grid", "plan", str(path)], ["grid", "submit", str(path), "--executor", "local"]):
        line = refused(capsys, *args)
        assert expected in line and f"this machine has {machine_cores()} cores" in line, line
    run = tmp_path / "run"
    line = refused(capsys, "train", "--set", "train.accelerator=cpu", "--set", f"train.devices={too_many}",
                   "--run-dir", str(run))
    assert expected in line, line
    assert not run.exists() and not (tmp_path / "runs").exists()


def test_the_local_executor_refuses_several_nodes(tmp_path, capsys):
    path = write_grid(tmp_path, base=base(), axes={"seed": [0]})
    line = refused(capsys, "grid", "submit", str(path), "--executor", "local")
    assert "cell seed=0: train.num_nodes=2, but --executor local trains on this machine alone" in line, line
    assert not (tmp_path / "runs").exists()


# A job's log (task 0's) as SLURM writes it, measured on the two-node cluster: a task killed on n2
# with srun's --kill-on-bad-exit, then a scancel of another run of the same job after a requeue.
KILLED = """submitit INFO (2026-12-02 06:12:30,001) - Starting with JobEnvironment(job_id=8, ...)
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=8.0
slurmstepd-n1: error: *** STEP 8.0 ON n1 CANCELLED AT 2026-12-02T06:12:52 ***
srun: error: n1: task 0: Exited with exit code 1
"""
CANCELLED = """submitit INFO (2026-12-02 06:24:30,001) - Starting with JobEnvironment(job_id=12, ...)
slurmstepd-n1: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-12-02T06:24:49 ***
slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026-12-02T06:24:49 ***
srun: error: n2: task 1: Killed
srun: error: n1: task 0: Killed
"""


def test_the_first_end_in_a_jobs_log_tells_a_lost_task_from_a_cancellation(tmp_path):
    from hybrid_lightning.grid.slurm import SlurmExecutor

    executor, log = SlurmExecutor(), tmp_path / "log.out"
    record = {"log": str(log)}
    log.write_text(KILLED)  # srun ended the step because task 1 died: not a cancellation
    assert executor.lost_task(record) == "rank 1 on n2: Killed" and executor.ending(record) is None
    assert executor.failure(record) == "rank 1 on n2: Killed"
    log.write_text(KILLED + CANCELLED)  # the current run (after the last start) was cancelled
    assert executor.lost_task(record) is None and executor.ending(record) == ("2026-12-02T06:24:49", "")
    log.write_text(KILLED.replace("n2: task 1: Killed", "n1: task 0: Exited with exit code 1"))
    assert executor.lost_task(record) is None and executor.ending(record) is None  # rank 0's error: the run records it
    log.write_text(KILLED.replace("task 1: Killed", "task 1: Exited with exit code 1"))  # rank 1 raised: its own error
    record["result"] = str(tmp_path / "8_0_result.pkl")
    (tmp_path / "8_1_result.pkl").write_bytes(pickle.dumps(("error",
                                                            "Traceback ...\nValueError: rank 1's own error\n")))
    assert executor.lost_task(record) == "rank 1 on n2: ValueError: rank 1's own error"


def test_the_main_address_is_the_first_nodes_node_addr_when_its_name_does_not_resolve(tmp_path, monkeypatch):
    from hybrid_lightning.training.cluster import set_main_address

    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "NodeName=$3 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=h1"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # set, then deleted: monkeypatch restores only what it saw, and set_main_address writes os.environ
    monkeypatch.setenv("MASTER_ADDR", "")
    monkeypatch.delenv("MASTER_ADDR")
    for key, value in {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "nowhere-node[1-2]"}.items():
        monkeypatch.setenv(key, value)
    set_main_address()
    assert os.environ["MASTER_ADDR"] == "10.1.2.3"
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost,nowhere-node2")  # resolves: Lightning's own choice stays
    set_main_address()
    assert "MASTER_ADDR" not in os.environ
    monkeypatch.setenv("SLURM_JOB_NODELIST", "nowhere-node[1-2]")
    scontrol.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(ValueError, match="the job's first node 'nowhere-node1' does not resolve "
                                         "and scontrol gives no NodeAddr"):
        set_main_address()


def test_train_in_an_allocation_of_several_tasks_needs_srun(monkeypatch):
    from hybrid_lightning.config import TrainConfig
    from hybrid_lightning.training.cluster import check_launch

    for key, value in {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
                       "SLURM_JOB_NUM_NODES": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_NAME", "batch")
    with pytest.raises(ValueError, match=r"SLURM job 7 \(2 node\(s\), 2 task\(s\)\) but not in a task started by srun"):
        check_launch(TrainConfig(accelerator="cpu", num_nodes=2))
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # a task srun started
    check_launch(TrainConfig(accelerator="cpu", num_nodes=2))


@pytest.fixture(scope="module")
def two_nodes():
    """A running two-node cluster; after it is taken down, none of its daemons is left."""
    with local_cluster("--nodes", "2") as folder:
        pids = [int(p.read_text()) for p in folder.glob("*.pid")]
        yield folder
    time.sleep(1)
    assert len(pids) == 3 and not [p for p in pids if Path(f"/proc/{p}").exists()], pids  # slurmctld and two slurmd


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process at the global batch: the weights every multi-node run must end with."""
    run = tmp_path_factory.mktemp("reference") / "run"
    train(validate_config(base(num_nodes=1, devices=1)), run)
    return weights(run)


def next_job_id() -> str:
    """The id the next submitted job gets: unchanged when nothing was submitted."""
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True, timeout=60).stdout
    return re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", out).group(1)


def step_of(run_dir: Path) -> int:
    return (read_status(run_dir) or {}).get("step") or 0


def wait_for_step(run_dir: Path, step: int, timeout: float = 300) -> int:
    """Polls the run's status (every 0.1 s) until it has trained ``step`` steps; fails if it ends first.
    Returns the step reached."""
    deadline = time.time() + timeout
    while (reached := step_of(run_dir)) < step:
        state = (read_status(run_dir) or {}).get("state")
        assert state not in ("done", "failed") and time.time() < deadline, (
            f"{run_dir.name}: {state} at step {reached} of {step}")
        time.sleep(0.1)
    assert reached < STEPS, f"{run_dir.name} ended before step {step}"
    return reached


def task_logs(grid, cell) -> list[str]:
    """The logs of every task of the cell's newest job, task 0 first."""
    job = read_jobs(grid)[cell.name][-1]["job_id"]
    return [p.read_text() for p in sorted((grid.state_dir / "slurm").glob(f"{job}_*_log.out"))]


@pytest.mark.slow
def test_the_cluster_has_two_nodes_one_task_on_each(two_nodes):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %G %t"], capture_output=True, text=True, timeout=60).stdout
    assert out.split("\n")[:2] == ["n1 4 gpu:2 idle", "n2 4 gpu:2 idle"], out
    ports = re.findall(r"^NodeName=(n\d) NodeHostname=localhost NodeAddr=127.0.0.1 Port=(\d+)",
                       (two_nodes / "slurm.conf").read_text(), re.M)
    assert [n for n, _ in ports] == ["n1", "n2"] and ports[0][1] != ports[1][1]
    tasks = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c",
                            "echo $SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID"],
                           capture_output=True, text=True, timeout=120)
    assert sorted(tasks.stdout.split("\n")[:2]) == ["n1 0 0", "n2 1 1"], tasks.stdout + tasks.stderr


@pytest.fixture(scope="module")
def across(two_nodes, tmp_path_factory):
    """A 2 x 1 and a 2 x 2 cell submitted through grid submit and left alone (``finished`` waits for them)."""
    folder = tmp_path_factory.mktemp("across")
    path = write_grid(folder, "across", base=base(), axes={"world": {
        "2x1": {"train.devices": 1, "train.batch_size": GLOBAL_BATCH // 2},
        "2x2": {"train.devices": 2, "train.batch_size": GLOBAL_BATCH // 4},
    }})
    out = submit(path, profile(folder))
    assert ("(2 node(s) x 1 task(s), 0 GPU(s) per node each)" in out
            and "(2 node(s) x 2 task(s), 0 GPU(s) per node each)" in out)
    return load_grid(path)


def submit_2x1(folder: Path, name: str):
    """A grid of one 2 x 1 cell (the config of ``across``'s first) submitted through grid submit:
    (grid file, grid, cell)."""
    path = write_grid(folder, name, base=base(), axes={"seed": [0]})
    submit(path, profile(folder))
    grid = load_grid(path)
    return path, grid, grid.cells[0]


def finished(grid):
    wait(grid, all_done)
    return grid


def same_weights(run_dir: Path, grid) -> bool:
    """Whether the run ended with exactly the weights of the uninterrupted 2 x 1 cell of ``grid``."""
    a, b = weights(run_dir), weights(finished(grid).cells[0].run_dir)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_forced_requeue_stops_both_nodes_and_resumes_exactly(across, tmp_path):
    """The requeue signal (USR2: what SLURM sends ``slurm_signal_delay_s`` before the time limit;
    ``scancel --signal`` is submitit's own way to test it) mid-run: both tasks stop at the next step,
    the job is requeued, both nodes resume, and the run ends with the uninterrupted run's weights."""
    _, grid, cell = submit_2x1(tmp_path, "requeue")
    wait_for_step(cell.run_dir, 4)
    subprocess.run(["scancel", "--signal=USR2", read_jobs(grid)[cell.name][0]["job_id"]], check=True, timeout=60)
    seen = {}
    wait(grid, all_done, seen=seen)
    assert "requeued" in seen[cell.name], seen
    assert len(read_jobs(grid)[cell.name]) == 1  # one submission, requeued by SLURM
    logs = task_logs(grid, cell)
    assert all("requeue signal; stopping at the next step" in log for log in logs)
    assert all(log.count("Initializing distributed") == 2 for log in logs)  # both nodes started twice
    assert "Requeued job" in logs[0]
    stopped = int(re.search(r"resuming from last.ckpt at step (\d+)", logs[0]).group(1))
    assert 4 <= stopped < STEPS and stopped % EVERY  # the stop's own checkpoint, not a periodic one
    assert loss_steps(cell.run_dir) == list(range(1, STEPS + 1))  # every step once
    assert same_weights(cell.run_dir, across)


@pytest.mark.slow
def test_2x1_and_2x2_cells_equal_one_process(across, reference):
    """DDP across the two nodes (gloo on CPU): rank 0 alone logs and checkpoints, and the weights
    equal one process at the same global batch within float rounding."""
    grid = finished(across)
    for cell, devices in zip(grid.cells, (1, 2)):
        logs = task_logs(grid, cell)
        assert len(logs) == 2 * devices
        for task, log in enumerate(logs):  # block distribution: tasks 0.. on n1, the others on n2
            assert f"task {task} of {2 * devices} on node n{1 + task // devices}" in log, log[-3000:]
            assert "node n1 does not resolve: MASTER_ADDR=127.0.0.1 (its NodeAddr)" in log
        assert [bool(re.search(r"^step \d+/", log, re.M)) for log in logs] == [True] + [False] * (2 * devices - 1)
        events = [p for p in cell.run_dir.glob("events.out.tfevents.*") if not p.name.endswith(".hparams")]
        assert len(events) == 1 and loss_steps(cell.run_dir) == list(range(1, STEPS + 1))  # one writer, every step once
        assert sorted(p.name for p in (cell.run_dir / "checkpoints").iterdir()) == [
            "last.ckpt", *(f"step_{s:07d}.ckpt" for s in range(EVERY, STEPS + 1, EVERY))]
        got = weights(cell.run_dir)
        assert max(rel(got[k], reference[k]) for k in reference) <= TOLERANCE[devices], cell.name


@pytest.mark.slow
def test_scancel_stops_both_nodes_at_a_checkpoint_and_a_resubmit_resumes_exactly(across, tmp_path):
    path, grid, cell = submit_2x1(tmp_path, "cancel")
    wait_for_step(cell.run_dir, 4)
    subprocess.run(["scancel", read_jobs(grid)[cell.name][0]["job_id"]], check=True, timeout=60)
    wait(grid, lambda rows: rows[cell.name].state == "cancelled", timeout=120)
    assert all("SIGTERM; stopping at the next step with a checkpoint" in log for log in task_logs(grid, cell))
    status = read_status(cell.run_dir)
    assert status["state"] == "interrupted" and status["step"] % EVERY, status  # stopped between periodic checkpoints
    assert find_resume_checkpoint(cell.run_dir)[1] == status["step"]

    submit(path, profile(tmp_path))
    wait(grid, all_done)
    assert f"resuming from last.ckpt at step {status['step']}" in task_logs(grid, cell)[0]
    assert loss_steps(cell.run_dir) == list(range(1, STEPS + 1))
    assert same_weights(cell.run_dir, across)


@pytest.mark.slow
def test_a_task_killed_on_one_node_fails_the_job_naming_it(across, tmp_path):
    path, grid, cell = submit_2x1(tmp_path, "kill")
    wait_for_step(cell.run_dir, EVERY + 2)  # past a periodic checkpoint
    pid = int(re.search(r"task 1 of 2 on node n2 \(\S+, pid (\d+)\)", task_logs(grid, cell)[1]).group(1))
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rows = wait(grid, lambda rows: rows[cell.name].state == "failed", timeout=120)
    took = time.monotonic() - start
    assert took < 60, took  # srun ends the step (--kill-on-bad-exit); measured 2 s
    assert rows[cell.name].reason.startswith("rank 1 on n2: Killed"), rows[cell.name].reason
    status = run_cli("grid", "status", str(path), timeout=300).stdout
    assert "failed seed=0: rank 1 on n2: Killed" in status, status

    submit(path, profile(tmp_path))
    wait(grid, all_done)
    resumed = int(re.search(r"resuming from last.ckpt at step (\d+)", task_logs(grid, cell)[0]).group(1))
    assert resumed % EVERY == 0 and EVERY <= resumed < STEPS  # the newest periodic checkpoint before the kill
    assert loss_steps(cell.run_dir) == list(range(1, STEPS + 1))
    assert same_weights(cell.run_dir, across)


@pytest.mark.slow
def test_worlds_the_profile_or_the_partition_cannot_give_are_refused(two_nodes, tmp_path, capsys):
    """grid plan and grid submit, one line each naming the cell's setting and what it meets."""
    prof = profile(tmp_path)
    cases = [  # (train settings, --set items, what the line says)
        ({"num_nodes": 3}, [], "cell seed=0: train.num_nodes=3, but partition 'debug' has 2 node(s)"),
        ({"devices": 5}, [], "5 task(s) per node (train.devices=5) x cpus_per_task=1 = 5 CPUs per node, "
                             "but the nodes of "
                             "partition 'debug' have at most 4"),
        ({"devices": 2}, ["cpus_per_task=3"], "x cpus_per_task=3 = 6 CPUs per node"),
        ({"accelerator": "gpu", "devices": 3}, [], "3 GPU(s) per node (train.devices=3), "
                                                   "but the nodes of partition 'debug' "
                                                   "have at most 2"),
        ({"devices": 2}, ["tasks_per_node=1"], "--set: tasks_per_node=1 disagrees with cell seed=0's train.devices=2"),
        ({"num_nodes": 2}, ["slurm_nodes=1"], "--set: slurm_nodes=1 disagrees with cell seed=0's train.num_nodes=2"),
    ]
    before = next_job_id()
    for i, (settings, sets, message) in enumerate(cases):
        path = write_grid(tmp_path, f"refused{i}", base=tiny(**{"accelerator": "cpu", **settings}), axes={"seed": [0]})
        extra = [a for item in sets for a in ("--set", item)]
        for args in (["plan", str(path), "--profile", str(prof)],
                     ["submit", str(path), "--executor", "slurm", "--profile", str(prof)]):
            line = refused(capsys, "grid", *args, *extra)
            assert message in line and f"grid refused{i}: " in line, (args, line)
        assert not (tmp_path / "runs" / f"refused{i}").exists()
    assert next_job_id() == before  # nothing submitted


@pytest.mark.slow
def test_train_outside_srun_in_a_two_node_allocation_says_what_to_do(two_nodes, tmp_path):
    """salloc's command runs on the submitting host with the allocation's environment, as a batch
    script does: no srun, so the second node's task would never start."""
    run = tmp_path / "run"
    command = ["salloc", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "hybrid_lightning", "train",
               "--run-dir", str(run),
               "--set", "train.accelerator=cpu", "--set", "train.num_nodes=2", "--set", "train.devices=1"]
    r = subprocess.run(command, capture_output=True, text=True, timeout=300)
    line = one_line_error(r)
    assert ("(2 node(s), 2 task(s)) but not in a task started by srun" in line
            and "`srun hybrid-lightning train ...`" in line), line
    assert not run.exists()
