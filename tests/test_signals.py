"""Signals, any number, any moment: a second signal ends the process at once with the last complete checkpoint
intact, a true ``status.json`` and the console's step equal to the resume point; ``grid status`` reports where a
stopped cell resumes; a local grid's cells stop when their submitter dies."""

import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO
from hybrid_lightning.fileio import RunLock
from hybrid_lightning.grid import cell_states, load_grid
from hybrid_lightning.grid.report import status_table
from hybrid_lightning.rundir.checkpoints import resume_step
from hybrid_lightning.rundir.status import read_status, write_status
from hybrid_lightning.training.checkpoints import StopOnSignals
from hybrid_lightning.training.stop import EndAtOnce
from test_grid import write_grid
from test_kill_loops import run_args, state, worst

DEAD_PID = 2**22 + 1  # above pid_max's default ceiling: never a live process


def fake_checkpoint(path: Path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {"w": torch.zeros(2)}}, path)


def test_halt_renames_nothing_more_and_removes_the_temporaries(tmp_path):
    from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    folder = tmp_path / "checkpoints"
    io.save_checkpoint({"global_step": 1}, folder / "last.ckpt")
    io.wait()  # step 1 has its name
    io.save_checkpoint({"global_step": 2}, folder / "step_2.ckpt")
    io.commit()  # queued to the writer thread: renamed, unless halted first
    io.save_checkpoint({"global_step": 2}, folder / "last.ckpt")  # saved, not committed
    io.halt()
    io.commit()
    time.sleep(0.2)
    names = sorted(p.name for p in folder.iterdir())
    assert names in (["last.ckpt"], ["last.ckpt", "step_2.ckpt"]), names  # the rename under way may finish
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 1


END_AT_ONCE = """
import signal, sys
from pathlib import Path
from hybrid_lightning.fileio import RunLock
from hybrid_lightning.rundir.status import write_status
from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
from hybrid_lightning.training.stop import EndAtOnce

run = Path(sys.argv[1])
lock = RunLock(run)
lock.acquire()
write_status(run, state="running", step=7, max_steps=10)  # the last logged step, past the checkpoint
end = EndAtOnce(run, 10, lock)
end.io = AtomicCheckpointIO()
end.io.save_checkpoint({"global_step": 7}, run / "checkpoints" / "last.ckpt")  # saved, never renamed
end(signal.SIGTERM)
"""


def test_end_at_once_names_the_checkpoint_on_disk_and_exits_by_the_signal(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints" / "last.ckpt", 5)
    r = subprocess.run([sys.executable, "-c", END_AT_ONCE, str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 143, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == ("hybrid-lightning train: stopped by SIGTERM at step 5; "
                                                "run the same command again to resume")
    status = read_status(run)
    assert (status["state"], status["step"], status["error"]) == ("interrupted", 5, "SIGTERM")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]  # the temporary went
    assert not (run / ".lock").exists()


LATE_SECOND = """
import os, signal, sys, time
from pathlib import Path
from hybrid_lightning.fileio import RunLock
from hybrid_lightning.rundir.status import write_status
from hybrid_lightning.training.checkpoints import StopOnSignals
from hybrid_lightning.training.stop import EndAtOnce

run = Path(sys.argv[1])
signals = StopOnSignals(ends_process=True)  # as the command line trains
signals.install()
with RunLock(run) as lock:
    signals.at_once = EndAtOnce(run, 10, lock)
    signals.signum = signal.SIGTERM  # the first signal's stop, recorded with the lock held
    write_status(run, state="interrupted", step=5, max_steps=10, error="SIGTERM")
signals.restore()  # train's end: the lock is released, Stopped on its way to the command's exit
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("outlived the second signal")
"""


def test_a_second_signal_after_the_stop_is_recorded_still_ends_with_the_exit_code_and_message(tmp_path):
    """CI: a second SIGTERM between ``train``'s end and the process's exit killed it by the default action (-15,
    nothing said). It ends at once with 143 and the stop's message; the status, no longer this process's, is kept."""
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints" / "last.ckpt", 5)
    r = subprocess.run([sys.executable, "-c", LATE_SECOND, str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 143, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert r.stderr.strip().splitlines()[-1] == ("hybrid-lightning train: stopped by SIGTERM at step 5; "
                                                "run the same command again to resume")
    status = read_status(run)
    assert (status["state"], status["step"], status["error"]) == ("interrupted", 5, "SIGTERM")
    assert "pid" not in status  # written by the stop, not rewritten after the lock went


def test_a_library_caller_gets_its_signal_handlers_back_after_a_stop(tmp_path):
    """Without ``ends_process`` (``train`` called from Python: a notebook goes on after ``Stopped``) the handlers go
    back even after a stop, so a later Ctrl-C interrupts as Python's own handler does instead of ending the process."""
    before = {sig: signal.getsignal(sig) for sig in StopOnSignals.SIGNALS}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        signals = StopOnSignals()
        signals.install()
        assert signal.getsignal(signal.SIGTERM) == signals._handle
        with RunLock(tmp_path / "run") as lock:
            signals.at_once = EndAtOnce(tmp_path / "run", 10, lock)
            signals.signum = signal.SIGINT
        signals.restore()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)

def test_grid_status_reports_the_resume_point_not_the_last_logged_step(tmp_path):
    """A rank killed at step 15, its checkpoint of step 12 on disk: the cell resumes from 12."""
    grid = load_grid(write_grid(tmp_path, axes={"seed": [0]}))
    (cell,) = grid.cells
    fake_checkpoint(cell.run_dir / "checkpoints" / "last.ckpt", 12)
    write_status(cell.run_dir, state="running", step=15, max_steps=20, host=os.uname().nodename, pid=DEAD_PID)
    (row,) = cell_states(grid)
    assert (row.state, row.step) == ("incomplete", 12), row
    assert "12/20" in status_table([row])


SUBMITTER = """
import functools, os, subprocess, sys, time
from hybrid_lightning.grid.local import cell_process_setup

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         preexec_fn=functools.partial(cell_process_setup, os.getpid()))
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_local_cell_process_ends_with_its_submitter(tmp_path):
    submitter = subprocess.Popen([sys.executable, "-c", SUBMITTER], stdout=subprocess.PIPE, text=True)
    child = int(submitter.stdout.readline())
    submitter.kill()  # SIGKILL: no handler of the submitter runs
    submitter.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the cell's process outlived its submitter")


@pytest.mark.slow
def test_a_killed_local_submit_stops_its_cell_at_a_checkpoint(tmp_path):
    """A SIGKILLed ``grid submit --executor local`` left its cell training for 14 minutes."""
    path = write_grid(tmp_path, axes={"seed": [0]}, base=_long_base())
    (cell,) = load_grid(path).cells
    proc = subprocess.Popen([sys.executable, "-m", "hybrid_lightning", "grid", "submit", str(path),
                             "--executor", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while ((read_status(cell.run_dir) or {}).get("step") or 0) < 3:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while (row := cell_states(load_grid(path))[0]).live:  # its process still runs
        assert time.time() < deadline, "the cell trains on without its submitter"
        time.sleep(0.1)
    status = read_status(cell.run_dir)
    assert (status["state"], status["error"]) == ("interrupted", "SIGTERM"), status
    assert row.state == "incomplete" and row.step == status["step"] == resume_step(cell.run_dir) >= 3, row


def _long_base() -> dict:
    from test_grid import TINY_BASE

    return {**TINY_BASE, "train": {**TINY_BASE["train"], "max_steps": 100000, "checkpoint_every_n_steps": 2}}


def _temporaries(run: Path) -> list[Path]:
    return [p for folder in (run, run / "checkpoints") if folder.is_dir() for p in folder.glob(".*.tmp")]


# Starts each `train` as a fork of one process that imported the package, torch and Lightning once: a trial then
# costs its training, not the imports (a minute each on 2 loaded cores). Reads a JSON argv and output path per
# line; prints the child's pid, then its exit code once it ends.
FORKER = """
import json, os, signal, sys
import hybrid_lightning.training.run, hybrid_lightning.training.trainer  # noqa: F401 (imported once, before the forks)
from hybrid_lightning.cli import main

for line in sys.stdin:
    argv, out = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(out + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code or 0)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Forker:
    """``start`` runs ``hybrid-lightning train`` in a fork (``FORKER``); ``wait`` gives its (exit code, stdout,
    stderr), or raises after ``timeout`` seconds."""

    def __init__(self, folder: Path):
        self.folder, self.n = folder, 0
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=REPO)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def start(self, run: Path, *a: str) -> int:
        self.n += 1
        self.out = self.folder / f"trial{self.n}"
        self.proc.stdin.write(json.dumps([["train", "--run-dir", str(run), *a], str(self.out)]) + "\n")
        self.proc.stdin.flush()
        return int(self.lines.get(timeout=120))

    def wait(self, timeout: float) -> tuple[int, str, str]:
        code = int(self.lines.get(timeout=timeout))
        return code, Path(f"{self.out}.out").read_text(), Path(f"{self.out}.err").read_text()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _running_at(pid: int, run: Path, step: int, timeout: float = 300) -> None:
    """Waits until process ``pid``'s status shows ``step`` or more."""
    deadline = time.time() + timeout
    while True:
        status = read_status(run) or {}
        if status.get("pid") == pid and status.get("state") == "running" and (status.get("step") or 0) >= step:
            return
        assert time.time() < deadline, "the run did not reach the step in time"
        time.sleep(0.005)


def _during_a_checkpoint_write(run: Path, timeout: float = 10) -> None:
    """Waits until a checkpoint's temporary exists (a write under way), or ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline and not list((run / "checkpoints").glob(".*.tmp")):
        time.sleep(0.002)


TRIALS, MAX_STEPS = 40, 200  # a trial advances the run by one to four steps: the run must outlast the trials


@pytest.mark.slow
def test_double_signals_at_any_moment_end_promptly_with_a_true_status_and_an_exact_resume(tmp_path):
    """One run stopped again and again by two SIGTERMs 0-300 ms apart, half of them sent while a checkpoint is being
    written: each process ends within 30 s with 143, a status naming the step of the checkpoint on disk (which the
    console names too, and the next process resumes from), no temporary left; the run then ends with the weights
    and optimizer state of an uninterrupted one."""
    random.seed(53)
    run, straight = tmp_path / "run", tmp_path / "straight"
    args = [*run_args(1, MAX_STEPS), "--set", "train.checkpoint_every_n_steps=1", "--set", "train.keep_checkpoints=2"]
    forker, resumed, t0 = Forker(tmp_path), 0, time.time()
    for trial in range(TRIALS):
        pid = forker.start(run, *args)
        _running_at(pid, run, resumed + 1)
        if trial % 2:
            _during_a_checkpoint_write(run)
        os.kill(pid, signal.SIGTERM)
        time.sleep(random.uniform(0.0, 0.3))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        code, out, err = forker.wait(timeout=30)
        assert code == 143, (trial, code, err[-3000:])
        assert resumed == 0 or f"at step {resumed}\n" in out, (trial, out[-2000:])
        step, status = resume_step(run), read_status(run)
        assert (status["state"], status["step"], status["error"]) == ("interrupted", step, "SIGTERM"), (trial, status)
        assert f"stopped by SIGTERM at step {step};" in err, (trial, err[-2000:])
        assert not _temporaries(run), (trial, _temporaries(run))
        assert step >= resumed
        resumed = step
    print(f"{TRIALS} double-signal trials in {time.time() - t0:.0f} s, the run stopped at step {resumed}")
    assert resumed < MAX_STEPS
    for folder in (run, straight):  # the same settings but for the checkpoint cadence, which a resume may change
        forker.start(folder, *args, "--set", f"train.checkpoint_every_n_steps={MAX_STEPS}")
        code, _, err = forker.wait(timeout=600)
        assert code == 0, err[-3000:]
    forker.close()
    (w_a, o_a), (w_b, o_b) = state(straight), state(run)
    assert worst(w_a, w_b) == 0.0 and worst(o_a, o_b) == 0.0
