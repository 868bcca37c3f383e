"""Every refusal ``train`` makes before it writes anything, in one place, so that a preview that passes means the
job starts: ``train`` and ``train --dry-run`` call ``preflight``; ``grid plan`` calls ``check_start`` for each
cell, where the cell would start being the executor's to check (``grid/submit.check_plan``).

What a preview cannot know is left to the run: a store not prepared yet (its tokens, hence whether each split
holds a window, are known once it is), and the checkpoint a run resumes from (read under the run's lock).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hybrid_lightning.config import RunConfig
from hybrid_lightning.data.run_store import check_store
from hybrid_lightning.fileio import RunLock, refuse_file_for_folder
from hybrid_lightning.plan.resolve import check_planned, default_run_dir, plan_run
from hybrid_lightning.rundir import CKPT_DIR, EVAL_DIR
from hybrid_lightning.rundir.checkpoints import not_run_or_checkpoint
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.training.cluster import check_launch
from hybrid_lightning.training.resume import check_same_run


def preflight(cfg: RunConfig, run_dir: str | Path | None = None,
              planned: Mapping | None = None) -> tuple[RunConfig, RunPlan, Path]:
    """(resolved config, its plan, run directory) of a run that would start on this machine, or the
    ``ValueError`` ``train`` would raise: the config's geometry, windows and probes (``plan_run``), a plan that
    differs from ``planned``, the one made where a grid's cell was submitted (``plan.resolve.check_planned``), this
    machine (``check_here``), a run directory in use by a live process and the start (``check_start``)."""
    cfg, plan = plan_run(cfg)  # every derived fact, once; bad probes are refused here
    if planned is not None:
        check_planned(cfg, plan, planned)
    check_here(cfg, plan)
    if run_dir is not None and not str(run_dir).strip():  # Path("") is the working directory
        raise ValueError("--run-dir is empty; give a folder (default: runs/<name>)")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    if run_dir.is_dir() and is_rank_zero():  # the other ranks start while rank 0 holds the lock
        RunLock(run_dir).refuse_live_holder()  # in use: said before what the run's config or store would refuse
    check_start(cfg, run_dir)
    return cfg, plan, run_dir


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, from the environment (before any Trainer exists):
    Lightning's launcher, torchrun and SLURM set these for every other rank."""
    return all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK"))


def check_here(cfg: RunConfig, plan: RunPlan) -> None:
    """Refuses what this machine cannot give: the estimated peak memory (``plan.memory.check_fits``), the devices
    asked for (``check_devices``), and a launch that would hang or crowd it (``training.cluster.check_launch``)."""
    from hybrid_lightning.plan.memory import check_fits  # torch: imported when a run is checked, not by grid status

    check_fits(cfg, plan.memory_estimate)  # a size beyond the machine's memory is refused before anything is allocated
    check_devices(cfg)
    check_launch(cfg.train)  # outside srun in a SLURM allocation, or more CPU processes than cores


def check_devices(cfg: RunConfig) -> None:
    """Refuses, before anything is prepared, devices that this machine cannot give, and what needs a GPU on a run
    that trains on CPU."""
    import torch

    from hybrid_lightning.plan.precision import on_gpu

    t = cfg.train
    if t.accelerator == "gpu" and not torch.cuda.is_available():
        raise ValueError("train.accelerator=gpu, but torch sees no GPU on this machine; "
                         "use train.accelerator=auto or cpu")
    if t.accelerator == "gpu" and t.devices != "auto" and t.devices > torch.cuda.device_count():
        raise ValueError(f"train.devices={t.devices}, but this machine has {torch.cuda.device_count()} GPUs")
    if not on_gpu(t) and (t.precision == "16-mixed" or t.strategy == "fsdp"):
        key, value = ("precision", t.precision) if t.precision == "16-mixed" else ("strategy", t.strategy)
        raise ValueError(f"train.{key}={value} needs a GPU, and this run trains on CPU (Lightning has no fp16 "
                         "autocast or FSDP there); use train.precision bf16-mixed or 32, train.strategy auto or ddp")


def check_start(cfg: RunConfig, run_dir: Path, flag: str = "--run-dir") -> None:
    """Refuses, wherever the run starts, a run directory (or its checkpoints or eval folder) that is a file, or
    that holds a run of another config (``flag`` names the option that chose it), an evaluator that is none
    (``check_evaluator``), and the token store the run would
    refuse (``check_store``: its sources, a ``data.store`` that is someone else's folder, a prepared store too short
    for the windows)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{flag} {run_dir} is a file, not a folder; give a run directory")
    refuse_file_for_folder(run_dir, flag)  # a file above it, or a place nothing can be written
    for folder in (CKPT_DIR, EVAL_DIR):  # folders the run writes into, refused as files before anything is made
        refuse_file_for_folder(run_dir / folder, f"the run's {folder} folder:")
    check_same_run(run_dir, cfg, flag=flag)
    check_evaluator(cfg.eval.longppl_evaluator, run_dir)
    check_store(cfg)


def check_evaluator(spec: str | None, run_dir: Path) -> None:
    """Refuses an ``eval.longppl_evaluator`` that is not a run directory or a checkpoint of one, whether or not the
    run evaluates; one not there yet is taken only beside ``run_dir``: another cell of its grid, trained by it."""
    if spec is None:
        return
    path = Path(spec)
    if not path.exists() and path.parent.resolve() == run_dir.absolute().parent.resolve():
        return
    why = not_run_or_checkpoint(path)
    if why is not None:
        raise ValueError(f"eval.longppl_evaluator: {why}; give a run directory, or a checkpoint in its {CKPT_DIR}/ "
                         "(in a grid, the run directory of one of its cells)")
