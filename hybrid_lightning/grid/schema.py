"""The grid file's schema (``ablations/*.yaml``): one base run config and the settings that vary."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from hybrid_lightning.config.fields import CONVERGENCE_MEASURES, Number, _Frozen
from hybrid_lightning.config.loading import validate


class ConvergenceSpec(_Frozen):
    """The convergence verdict's measure and equivalence margin, declared before the results are seen."""

    measure: Literal[tuple(CONVERGENCE_MEASURES)] = Field(
        "score_beyond", description="the probe score judged: `score_beyond` (answer-token accuracy minus "
        "chance beyond the training length), `loss_gain` or `loss_gain_beyond` (chance loss minus answer loss, nats "
        "per answer token, within or beyond the training length)")
    margin: Number | None = Field(None, gt=0, description="arms whose means differ by less are equivalent, in the "
                                  "measure's units; null = 0.05 for score_beyond (required for the others)")

    @model_validator(mode="after")
    def _check(self) -> ConvergenceSpec:
        if self.margin is None and CONVERGENCE_MEASURES[self.measure] is None:
            raise ValueError(f"{self.measure} has no default equivalence margin: state `margin` in its units (nats "
                             "per answer token), before the results are seen")
        return self

    @property
    def equivalence_margin(self) -> float:
        return self.margin if self.margin is not None else CONVERGENCE_MEASURES[self.measure]


class AblationSpec(_Frozen):
    """How the head-ablation claims of finding 2 are counted, declared before the results are seen."""

    pooled: StrictBool = Field(False, description="one claim over every architecture's runs (checkpoints as strata, "
                               "each run weighing as one) instead of one claim per architecture: for heads too few a "
                               "layer to give each architecture's few seeds a p below 0.05 (analysis/mechanism.py)")


class VerdictsSpec(_Frozen):
    """What a grid declares for its verdicts before looking (docs/grids.md, Declared verdict settings)."""

    convergence: ConvergenceSpec = Field(default_factory=ConvergenceSpec)
    ablation: AblationSpec = Field(default_factory=AblationSpec)
    tests: tuple[str, ...] | None = Field(
        None, min_length=1, description="the tests the grid is built to decide, by their names in findings.csv "
        "(e.g. `scaling (LongPPL laws)`); null: every registered test. The others are left out of its verdicts, their "
        "Holm families and its design check")

    @field_validator("tests")
    @classmethod
    def _once_each(cls, tests: tuple[str, ...] | None) -> tuple[str, ...] | None:
        twice = sorted({t for t in tests or () if tests.count(t) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is named twice")
        return tests

    def declared(self) -> dict:
        """As plain data, every default filled in, for ``analysis.registry.verdicts``."""
        return {"convergence": {"measure": self.convergence.measure, "margin": self.convergence.equivalence_margin},
                "ablation": {"pooled": self.ablation.pooled}, "tests": None if self.tests is None else list(self.tests)}


class GridConfig(_Frozen):
    """A grid file (``ablations/*.yaml``): one base run config and the settings that vary.

    The cells are the cartesian product of the ``axes`` (each a list of values, or a mapping of
    named presets, each a set of config values) and the ``zip`` groups (keys whose value lists
    vary together), minus the cells that match an ``exclude`` entry.
    """

    name: str | None = Field(None, description="grid name; default: the grid file's stem")
    base: str | dict[str, Any] = Field(
        default_factory=dict, description="a run config file (relative to the grid file) or an inline run config"
    )
    root: str | None = Field(None, description="folder holding the cells' run directories; default runs/<name>")
    axes: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted config key -> list of values, or axis name -> {preset name: {dotted key: value}}",
    )
    zip: tuple[dict[str, list[Any]], ...] = Field(
        (),
        description="groups of dotted keys whose value lists vary together",
    )
    exclude: tuple[dict[str, Any], ...] = Field(
        (),
        description="partial assignments (axis: value) whose cells are dropped",
    )
    exploratory: tuple[dict[str, Any], ...] = Field(
        (),
        description="partial assignments (axis: value) whose cells are exploratory arms (added after results were "
                    "seen): trained and reported, left out of the verdicts and the design check (docs/grids.md)",
    )
    verdicts: VerdictsSpec = Field(
        default_factory=VerdictsSpec,
        description="settings of the verdicts declared before the results are seen: `convergence: {measure, margin}`, "
                    "`ablation: {pooled}`, `tests` "
                    "(docs/grids.md)",
    )
    share_stable_phase: StrictBool = Field(
        False,
        description="budgets as decay branches: cells that differ only in their budget share a WSD stable phase "
                    "(docs/grids.md, Budgets as branches)",
    )

    @model_validator(mode="after")
    def _check(self) -> GridConfig:
        if self.name is not None and (self.name in ("", ".", "..") or any(c in self.name for c in "/\\\0")):
            raise ValueError(f"name: {self.name!r} is not a folder name (runs/<name> holds the cells): no path "
                             "separators, not . or ..")
        for key, values in self.axes.items():
            if isinstance(values, dict):
                if not values:
                    raise ValueError(f"axes.{key}: empty preset axis (it needs at least one named preset)")
                for preset, settings in values.items():
                    if not isinstance(settings, dict) or not settings:
                        raise ValueError(
                            f"axes.{key}.{preset}: a preset is a non-empty mapping of config keys to values, "
                            f"got {settings!r}"
                        )
            elif not isinstance(values, list):
                raise ValueError(f"axes.{key}: an axis is a list of values or a mapping of named presets, "
                                 f"got {values!r}")
            elif not values:
                raise ValueError(f"axes.{key}: empty axis (it needs at least one value)")
        for i, group in enumerate(self.zip):
            lengths = {key: len(values) for key, values in group.items()}
            if not group or 0 in lengths.values():
                raise ValueError(f"zip[{i}]: a zip group needs at least one key with at least one value")
            if len(set(lengths.values())) > 1:
                raise ValueError(f"zip[{i}]: the lists of a zip group vary together and need equal lengths, "
                                 f"got {lengths}")
        keys = [*self.axes, *(key for group in self.zip for key in group)]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"axes and zip: {repeated} varied more than once")
        for field in ("exclude", "exploratory"):
            for i, entry in enumerate(getattr(self, field)):
                if not entry:
                    raise ValueError(f"{field}[{i}]: an empty entry would match every cell")
        return self


def validate_grid_config(raw: dict | None) -> GridConfig:
    """Builds a ``GridConfig`` from a grid file's plain data; every problem becomes one ``ValueError``."""
    return validate(GridConfig, raw, "a grid file", "grid")
