"""The SLURM job of one grid cell: train (or resume) its run directory; on a timeout or preemption
signal, stop at the next step boundary with a checkpoint and have submitit requeue the job."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import submitit

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
    """

    def __init__(self, name: str, run_dir: str, config: dict, grace_s: float):
        self.name, self.run_dir, self.config, self.grace_s = name, run_dir, config, grace_s

    def __call__(self) -> str:
        from hybrid_lightning.config import validate_config
        from hybrid_lightning.rundir import read_status
        from hybrid_lightning.training.checkpoints import StopOnRequest
        from hybrid_lightning.training.run import train

        import torch

        env = submitit.JobEnvironment()
        if os.environ.get("SLURM_CPUS_PER_TASK"):  # torch would otherwise use every core of a shared node
            torch.set_num_threads(int(os.environ["SLURM_CPUS_PER_TASK"]))
        print(
            f"grid cell {self.name}: job {env.job_id}, task {env.global_rank} of {env.num_tasks} on {env.hostname}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
            flush=True,
        )
        requested = threading.Event()
        submitit_handler = signal.getsignal(REQUEUE_SIGNAL)
        timer = threading.Timer(self.grace_s, os.kill, (os.getpid(), REQUEUE_SIGNAL))
        timer.daemon = True

        def on_signal(signum, frame):
            if requested.is_set():  # the second call, from the grace timer: requeue now
                submitit_handler(signum, frame)
                return
            print(f"grid cell {self.name}: requeue signal; stopping at the next step", flush=True)
            requested.set()
            timer.start()

        signal.signal(REQUEUE_SIGNAL, on_signal)
        run_dir = Path(self.run_dir)
        train(validate_config(self.config), run_dir, [StopOnRequest(requested)])
        timer.cancel()
        finished = (read_status(run_dir) or {}).get("state") == "done"
        if requested.is_set() and not finished and callable(submitit_handler):
            submitit_handler(REQUEUE_SIGNAL, None)  # calls checkpoint(), requeues, exits (task 0)
        return str(run_dir)
