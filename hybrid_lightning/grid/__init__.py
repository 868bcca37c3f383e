"""Ablation grids: a grid file expanded into named cells, run by an executor (SLURM job arrays
through submitit, or this machine), with status, idempotent resubmission and TensorBoard over the grid.

    grid file (ablations/*.yaml) -> spec.load_grid -> cells (one run config each)
        -> submit.submit_grid -> executor.EXECUTORS[name]:
               slurm.SlurmExecutor (job.CellJob per cell) | local.LocalExecutor
        -> state.cell_states (grid status) ; tensorboard.write_hparams (HParams dashboard)
"""

from hybrid_lightning.grid.executor import EXECUTORS, Executor, register
from hybrid_lightning.grid.local import LocalExecutor
from hybrid_lightning.grid.slurm import SlurmExecutor
from hybrid_lightning.grid.spec import Cell, Grid, load_grid
from hybrid_lightning.grid.state import CellState, cell_states
from hybrid_lightning.grid.submit import cancel_grid, submit_grid

__all__ = [
    "EXECUTORS", "Cell", "CellState", "Executor", "Grid", "LocalExecutor", "SlurmExecutor", "cancel_grid",
    "cell_states", "load_grid", "register", "submit_grid",
]
