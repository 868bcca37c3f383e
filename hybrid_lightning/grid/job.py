"""The SLURM job of one grid cell: train (or resume) its run directory; on SLURM's signals, stop
every task at the next step boundary with a checkpoint, and have submitit requeue the job when
the signal asks for it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import submitit

from hybrid_lightning.fileio import set_job_identity

# submitit asks SLURM for this signal `signal_delay_s` before the time limit (and on preemption).
REQUEUE_SIGNAL = signal.SIGUSR2


class CellJob(submitit.helpers.Checkpointable):
    """Trains one cell; submitit pickles it into the job and, through ``checkpoint()`` (inherited:
    resubmit this same job), requeues it. Training resumes from ``last.ckpt`` on every start.

    Lightning's own SLURM requeue is off (``SLURMEnvironment(auto_requeue=False)``): submitit owns it.

    Args:
        name: the cell's name (for the log).
        run_dir: the cell's run directory.
        config: the cell's run config as plain data.
        grace_s: after the requeue signal, how long to wait for a step boundary before requeueing
            from the last periodic checkpoint anyway (a step or validation that hangs).
        planned: the cell's plan made at submission (plain data; None for a cell submitted unplanned): the job
            refuses a plan it makes that differs (``train(planned=...)``).
    """

    def __init__(self, name: str, run_dir: str, config: dict, grace_s: float, planned: dict | None = None):
        self.name, self.run_dir, self.config, self.grace_s, self.planned = name, run_dir, config, grace_s, planned

    def __call__(self) -> str:
        import torch

        from hybrid_lightning.config import validate_config
        from hybrid_lightning.rundir.status import read_status
        from hybrid_lightning.training.checkpoints import SigtermStaysWithTheJob, StopOnRequest
        from hybrid_lightning.training.run import train

        env = submitit.JobEnvironment()
        set_job_identity({"slurm_job_id": os.environ["SLURM_JOB_ID"]})  # a requeue takes over its earlier start's lock
        if os.environ.get("SLURM_CPUS_PER_TASK"):  # torch would otherwise use every core of a shared node
            torch.set_num_threads(int(os.environ["SLURM_CPUS_PER_TASK"]))
        print(
            f"grid cell {self.name}: job {env.job_id}, task {env.global_rank} of {env.num_tasks} on node "
            f"{os.environ.get('SLURMD_NODENAME', env.hostname)} ({env.hostname}, pid {os.getpid()}), "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
            flush=True,
        )
        signals = JobSignals(self.name, self.grace_s)
        signals.install()
        run_dir = Path(self.run_dir)
        callbacks = [StopOnRequest(signals.stop), SigtermStaysWithTheJob(signals.on_term)]
        train(validate_config(self.config), run_dir, callbacks, self.planned)
        signals.after_training(finished=(read_status(run_dir) or {}).get("state") == "done")
        return str(run_dir)


class JobSignals:
    """SLURM's signals to one task of a cell's job. Both of these stop training at the next step
    boundary with ``last.ckpt`` (``stop``; ``StopOnRequest`` makes every rank stop at the same step):

    - the requeue signal (time limit, preemption): the job is then requeued by submitit (task 0).
      If no step boundary comes within ``grace_s``, it is requeued from the newest periodic
      checkpoint anyway.
    - SIGTERM (``scancel``; a preemption sends it before the requeue signal): submitit only logs it.
      After stopping, the task waits up to ``grace_s`` for a requeue signal before it ends; SLURM's
      SIGKILL usually comes first (``KillWait`` after the SIGTERM).
    """

    def __init__(self, name: str, grace_s: float):
        self.name, self.grace_s = name, grace_s
        self.stop, self.requeue = threading.Event(), threading.Event()
        self.timer = threading.Timer(grace_s, os.kill, (os.getpid(), REQUEUE_SIGNAL))
        self.timer.daemon = True
        self.submitit_handler = None

    def install(self) -> None:
        self.submitit_handler = signal.getsignal(REQUEUE_SIGNAL)
        signal.signal(REQUEUE_SIGNAL, self._on_requeue)
        signal.signal(signal.SIGTERM, self.on_term)

    def _on_requeue(self, signum, frame) -> None:
        if self.requeue.is_set():  # the second call, from the grace timer: requeue now
            self.submitit_handler(signum, frame)
            return
        print(f"grid cell {self.name}: requeue signal; stopping at the next step", flush=True)
        self.requeue.set()
        self.stop.set()
        self.timer.start()

    def on_term(self, signum, frame) -> None:
        print(f"grid cell {self.name}: SIGTERM; stopping at the next step with a checkpoint", flush=True)
        self.stop.set()

    def after_training(self, finished: bool) -> None:
        """After ``train`` returned: a stop by SIGTERM alone waits for a requeue signal; a requeue
        signal requeues the job (submitit: ``checkpoint()``, requeue, exit on task 0)."""
        self.timer.cancel()
        if finished or not self.stop.is_set():
            return
        deadline = time.monotonic() + self.grace_s
        while not self.requeue.is_set() and time.monotonic() < deadline:  # set by the signal's handler
            time.sleep(0.2)
        if self.requeue.is_set() and callable(self.submitit_handler):
            self.submitit_handler(REQUEUE_SIGNAL, None)
