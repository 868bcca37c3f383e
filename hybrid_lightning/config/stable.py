"""The ``train.stable_phase:`` section: budgets as decay branches of one stable phase (docs/grids.md, Budgets as
branches). Under a WSD schedule the learning rate before a run's decay start does not depend on its budget, and the
batches are a function of (seed, step), so the checkpoint of any run of the same model, data and seed at this run's
decay start is this run's own at that step."""

from __future__ import annotations

from pydantic import Field, model_validator

from hybrid_lightning.config.fields import Whole, _Frozen


class StablePhaseConfig(_Frozen):
    """Where the runs of one stable phase publish their checkpoints and which steps this run publishes."""

    dir: str = Field(description="the folder shared by the stable phase's runs: `step_<N>.ckpt` of the step each "
                     "branch decays from (a grid puts it under its root's .grid/stable/)")
    publish: tuple[Whole, ...] = Field((), description="steps at which this run saves a checkpoint and publishes it "
                                       "into `dir` (the decay starts of the shorter budgets, before this run's own)")

    @model_validator(mode="after")
    def _check(self) -> StablePhaseConfig:
        if list(self.publish) != sorted(set(self.publish)) or any(s < 1 for s in self.publish):
            raise ValueError(f"train.stable_phase.publish must be increasing steps of at least 1, got "
                             f"{list(self.publish)}")
        return self
