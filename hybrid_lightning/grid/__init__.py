"""Ablation grids: a grid file expanded into named cells, submitted to SLURM (submitit job arrays)
or run locally, with status, idempotent resubmission and TensorBoard over the grid.

    grid file (ablations/*.yaml) -> spec.load_grid -> cells (one run config each)
        -> submit.submit_grid -> slurm.submit_slurm (job.CellJob per cell) | local.run_local
        -> state.cell_states (grid status) ; tensorboard.write_hparams (HParams dashboard)
"""

from hybrid_lightning.grid.spec import Cell, Grid, load_grid
from hybrid_lightning.grid.state import CellState, cell_states
from hybrid_lightning.grid.submit import cancel_grid, submit_grid

__all__ = ["Cell", "CellState", "Grid", "cancel_grid", "cell_states", "load_grid", "submit_grid"]
