"""The verdicts of ``analyze --findings`` (analysis/findings.py) and of the design check (``grid plan
--verdicts``, analysis/design.py), one registration line each, in the order of ``findings.csv`` and of the
check's table; the claims of the verdicts of one finding form its Holm family. A verdict is defined in one module
(``verdict.Verdict``: docs/extending.md, "Adding a verdict") and registered here, or at run time by
``register``; ``verdicts`` gives them under what a grid declares."""

from __future__ import annotations

from hybrid_lightning.analysis import (
    convergence,
    diagnostic_verdicts,
    emergence,
    laziness,
    mechanism,
    nope,
    scaling_runs,
)
from hybrid_lightning.analysis.verdict import Verdict

VERDICTS: list[Verdict] = []


def register(verdict: Verdict) -> Verdict:
    """Adds ``verdict`` after those registered; a ``ValueError`` for a second one of the same finding and name."""
    if any((v.finding, v.name) == (verdict.finding, verdict.name) for v in VERDICTS):
        raise ValueError(f"verdict {verdict.name!r} of finding {verdict.finding!r} is registered already")
    VERDICTS.append(verdict)
    return verdict


def verdicts(declared: dict | None = None) -> list[Verdict]:
    """The registered verdicts, each that reads a grid's declarations (``Verdict.declare``) under ``declared``
    (``grid.schema.VerdictsSpec.declared``; None: the defaults); only those it names where it declares ``tests``
    (a ``ValueError`` for a name no verdict has)."""
    chosen = VERDICTS
    if (names := (declared or {}).get("tests")) is not None:
        known = [v.name for v in VERDICTS]
        for name in names:
            if name not in known:
                raise ValueError(f"verdicts.tests: {name!r} is no test's name; the tests: {', '.join(known)}")
        chosen = [v for v in VERDICTS if v.name in names]
    return [v.declare(declared) if declared is not None and v.declare else v for v in chosen]


register(emergence.SPEED)
register(emergence.EMERGES)
register(convergence.CONVERGENCE)
register(emergence.RETRIEVAL_ACC)
register(scaling_runs.SCALING)
register(mechanism.WHERE)
register(mechanism.ABLATION)
register(laziness.LAZINESS)
register(diagnostic_verdicts.RESTRICTION)
register(diagnostic_verdicts.LAYER_PROBES)
register(nope.BEYOND)
register(nope.COST)
