"""The ``local`` executor: cells run on this machine without SLURM, the same cells and run
directories, N at a time.

Each cell is one ``hybrid-lightning train <cell config> --run-dir <run dir>`` process whose output
goes to ``<root>/.grid/logs/<cell>.log``; the submitting process waits for all of them and prints
one line per start and end (and, every minute, where the running cells are). A job record holds
the submitting process and, once the cell started, the cell's process (both with their start
times, so that a reused pid is not taken for them) and its exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hybrid_lightning.config import dump_config
from hybrid_lightning.fileio import pid_alive, process_start
from hybrid_lightning.grid.branches import ready
from hybrid_lightning.grid.executor import Executor, register
from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.grid.state import (
    CELLS_DIR,
    add_records,
    cell_plan_path,
    cell_states,
    lock,
    now,
    read_jobs,
    write_jobs,
)
from hybrid_lightning.grid.tensorboard import write_seed_runs
from hybrid_lightning.training.cluster import check_cpu_devices, trains_on_cpu_here
from hybrid_lightning.training.layout import viewer_hint
from hybrid_lightning.training.threads import share

PROGRESS_EVERY_S = 60.0
POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


@register
class LocalExecutor(Executor):
    """This machine: ``submit`` claims the cells in the job records, ``run`` trains them
    ``parallel`` at a time in this process."""

    name = "local"
    help = "this machine, --parallel cells at a time"

    def check(self) -> None:
        if self.profile is not None or self.overrides:
            raise ValueError("--profile and --set (a SLURM profile's parameters) do not apply to --executor "
                             f"{self.name}")
        if self.parallel < 1:
            raise ValueError(f"--parallel must be at least 1, got {self.parallel}")

    def check_cells(self, cells: list[Cell]) -> None:
        """Refuses cells this machine cannot train alone: several nodes, or more CPU processes than cores."""
        for cell in cells:
            train = cell.config.train
            if train.num_nodes > 1:
                raise ValueError(f"cell {cell.name}: train.num_nodes={train.num_nodes}, but --executor {self.name} "
                                 f"trains on this machine alone; submit it with --executor slurm")
            try:
                check_cpu_devices(train, trains_on_cpu_here(train))
            except ValueError as e:
                raise ValueError(f"cell {cell.name}: {e}") from None

    def check_plan(self, cells: list[Cell]) -> str | None:
        """On this machine's cores, for cells with ``train.accelerator: cpu`` (``auto`` means the GPUs of wherever
        it runs)."""
        for cell in cells:
            try:
                check_cpu_devices(cell.config.train)
            except ValueError as e:
                raise ValueError(f"cell {cell.name}: {e}") from None
        return None

    def submit(self, grid: Grid, cells: list[Cell], say: Callable[[str], None]) -> None:
        """Claims ``cells`` for this process and writes their config files."""
        configs = grid.state_dir / CELLS_DIR
        configs.mkdir(parents=True, exist_ok=True)
        records = {}
        for cell in cells:
            path = configs / f"{cell.name}.yaml"
            path.write_text(dump_config(cell.config))
            records[cell.name] = {
                "executor": self.name, "host": socket.gethostname(), "submitter": os.getpid(),
                "submitter_start": process_start(os.getpid()), "pid": None, "config": str(path),
                "log": str(grid.state_dir / "logs" / f"{cell.name}.log"), "submitted": now(),
            }
            if cell.plan is not None:  # recorded by submit_grid
                records[cell.name]["plan"] = str(cell_plan_path(grid, cell))
        add_records(grid, records)

    def run(self, grid: Grid, cells: list[Cell], say: Callable[[str], None]) -> int:
        """Trains the claimed ``cells``; exit code 1 when one did not finish."""
        left = run_local(grid, cells, self.parallel, say)
        write_seed_runs(grid)  # the margin charts over seeds (grid/tensorboard.py)
        say(f"grid {grid.name}: {len(cells) - left} of {len(cells)} cell(s) finished" + (
            f"; see `hybrid-lightning grid status {grid.path}`" if left else "")
            + f"\n{viewer_hint(grid.root)}")
        return min(left, 1)

    def cancel(self, records: list[dict]) -> None:
        """SIGTERM to the cells' processes; a cell not started yet is skipped by its submitter."""
        for record in records:
            if record.get("pid"):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(record["pid"], signal.SIGTERM)

    def live_states(self, records: list[dict]) -> list[str | None]:
        return [_live_state(r) for r in records]

    def job_id(self, record: dict) -> str | None:
        return str(record["pid"]) if record.get("pid") else None

    def abandoned(self, record: dict) -> bool:
        """Queued by a submit that ended before starting it."""
        return not record.get("pid") and not record.get("cancelled")

    def failure(self, record: dict) -> str | None:
        """The exit code and the last line the cell's process wrote (its one-line error, or a traceback's last)."""
        code = record.get("exit")
        if code in (None, 0):
            return None
        line = last_line(Path(record["log"])) if record.get("log") else None
        return f"exit code {code}: {line}" if line else f"exit code {code}; see the log"


def last_line(log: Path, tail: int = 8192) -> str | None:
    """The last non-empty line of the file ``log`` (its last ``tail`` bytes read), None without one."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), None)


def _live_state(record: dict) -> str | None:
    """running while the cell's process lives, pending while its submitter does (not cancelled)."""
    if record.get("host") != socket.gethostname():
        return None  # another machine's processes cannot be checked from here
    if record.get("pid"):
        return "running" if pid_alive(record["pid"], record.get("pid_start")) else None
    if record.get("cancelled"):
        return None
    return "pending" if pid_alive(record.get("submitter"), record.get("submitter_start")) else None


def _mine(record: dict | None) -> bool:
    return bool(record) and record.get("host") == socket.gethostname() and record.get("submitter") == os.getpid()


def run_local(grid: Grid, cells: list[Cell], parallel: int, say: Callable[[str], None]) -> int:
    """Trains the queued ``cells``, ``parallel`` at a time, a branch of a stable phase once that phase's running
    cell has published its start (``branches.ready``); returns how many did not finish.

    A cell cancelled (``grid cancel``) meanwhile is skipped. On Ctrl-C or SIGTERM the running
    cells are stopped (SIGINT, then SIGKILL after 30 s); they resume on the next submit.
    """
    (grid.state_dir / "logs").mkdir(parents=True, exist_ok=True)
    waiting, running = list(cells), {}
    failed, total = 0, len(cells)
    threads = share(parallel)  # parallel cells share the cores this process was given
    last_progress = time.monotonic()
    sigterm = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sigterm.append(True))
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                started = [c for c, _, _ in running.values()]
                cell = next((c for c in waiting if ready(c, started)), None)
                if cell is None:  # every branch left waits for a stable phase that is running
                    break
                waiting.remove(cell)
                proc = _start(grid, cell, threads)
                stamp = time.strftime("%H:%M:%S")
                if proc is None:
                    say(f"[{stamp}] skip   {cell.name} (cancelled)")
                    continue
                running[cell.name] = (cell, proc, time.monotonic())
                say(f"[{stamp}] start  {cell.name}  ({total - len(waiting)}/{total})")
            time.sleep(POLL_S)
            for name, (cell, proc, t0) in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    failed += _finish(grid, cell, proc.returncode, time.monotonic() - t0, say)
            if running and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                rows = cell_states(grid, [c for c, _, _ in running.values()])
                say(f"[{time.strftime('%H:%M:%S')}] running: "
                    + "; ".join(f"{r.name} {r.step or 0}/{r.max_steps}" for r in rows))
            if sigterm:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        say(f"interrupted: stopping {len(running)} running cell(s); submit again to resume")
        for _, proc, _ in running.values():  # Ctrl-C reached them already; SIGTERM to us did not
            proc.send_signal(signal.SIGINT)  # Lightning's graceful stop
        for _, proc, _ in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        return failed + len(waiting) + len(running)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed


def _start(grid: Grid, cell: Cell, threads: int) -> subprocess.Popen | None:
    with lock(grid):
        jobs = read_jobs(grid)
        record = (jobs.get(cell.name) or [None])[-1]
        if not _mine(record) or record.get("cancelled"):
            return None
        with open(record["log"], "a") as log:
            log.write(f"==== {now()} grid {grid.name}: cell {cell.name} on {socket.gethostname()}\n")
            log.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            env.setdefault("OMP_NUM_THREADS", str(threads))
            proc = subprocess.Popen(
                [sys.executable, "-m", "hybrid_lightning", "train", record["config"], "--run-dir", str(cell.run_dir),
                 *(["--planned", record["plan"]] if record.get("plan") else [])],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=functools.partial(cell_process_setup, os.getpid()),
            )
        record.update(pid=proc.pid, pid_start=process_start(proc.pid), started=now())
        write_jobs(grid, jobs)
    return proc


def cell_process_setup(submitter: int) -> None:
    """Run in a cell's process before it starts ``train``. A grid started in the background (nohup ... &) ignores
    SIGINT: its cells must not, for ``run_local``'s stop. And a cell stops when its submitter dies, however it dies
    (a SIGKILL included): on Linux the kernel sends it SIGTERM then (``PR_SET_PDEATHSIG``), which stops training
    at the end of the step with a checkpoint, as ``grid cancel`` does. Elsewhere the cell trains on, and the next
    ``grid status`` shows it running."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != submitter:  # it died before the line above: nobody would send the signal
            os._exit(128 + signal.SIGTERM)


def _finish(grid: Grid, cell: Cell, code: int, seconds: float, say: Callable[[str], None]) -> int:
    with lock(grid):
        jobs = read_jobs(grid)
        record = (jobs.get(cell.name) or [None])[-1]
        if _mine(record):
            record.update(exit=code, ended=now())
            write_jobs(grid, jobs)
    row = cell_states(grid, [cell])[0]
    took = f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    stamp = time.strftime("%H:%M:%S")
    if row.state == "done":
        loss = f", loss {row.loss:.3f}" if row.loss is not None else ""
        say(f"[{stamp}] done   {cell.name}  ({row.step}/{row.max_steps} steps{loss}, {took})")
        return 0
    say(f"[{stamp}] {row.state.upper()} {cell.name}: {row.reason or f'exit code {code}'} (log: {Path(row.log or '')})")
    return 1
