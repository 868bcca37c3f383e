"""The pieces every config section is made of: frozen strict models, numbers as written, and the role tag
of each key (config/roles.py)."""

from __future__ import annotations

import json
import math
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

# Each key's role for a run (config/roles.py): untagged = identity.
ROLE_KEY, IDENTITY, RESUMABLE, BOOKKEEPING, LABEL = "role", "identity", "resumable", "bookkeeping", "label"


def role(name: str) -> dict:
    """``Field`` arguments tagging a field (or a whole section) with its role (config/roles.py)."""
    return {"json_schema_extra": {ROLE_KEY: name}}


_YAML_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")  # a number as YAML 1.2 writes it


def _a_number(value):
    if isinstance(value, bool):
        raise ValueError(f"input should be a number, not {str(value).lower()}")
    if isinstance(value, str):
        if _YAML_NUMBER.match(value.strip()):  # a quoted number
            raise ValueError(f"takes numbers, not the string {json.dumps(value)}; write it without quotes")
        try:  # a literal YAML 1.2 does not read as a number (0b11, 0x1f, 1_000)
            how = f"write it in decimal: {int(value, 0)}"
        except ValueError:
            how = "give a number"
        raise ValueError(f"takes numbers, not the string {json.dumps(value)}; {how}")
    return value


def _whole(value):
    """A whole number as written: not a float, however round (``max_steps: 3.0``), nor a string of another base."""
    value = _a_number(value)
    if isinstance(value, float):
        shown = f"{value:.0f}" if value.is_integer() and abs(value) < 1e16 else None
        raise ValueError(f"takes whole numbers, not {value!r}" + (f"; write {shown}" if shown else ""))
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"input should be a finite number, got {value}")
    return value


# Numbers as written: neither YAML's true/false nor a quoted number ("32" would otherwise pass as 32,
# and a grid would name it apart from 32), nor .inf or .nan. Configs are read with YAML 1.2's number rules
# (config/loading.read_yaml), so an unquoted 3e-4 is a float, 0b11 and 1_000 are strings and 010 is ten. A whole
# number is an integer as written: 3.0 is refused, not read as 3.
Number = Annotated[float, BeforeValidator(_a_number), AfterValidator(_finite)]
Whole = Annotated[int, BeforeValidator(_whole)]


class _Frozen(BaseModel):
    """Numbers and switches are typed strictly (``Whole``, ``Number``, ``StrictBool``): YAML's
    true/false are not numbers (``window: true`` would otherwise pass as 1), and a switch takes true or
    false only (not 1 or "yes")."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


MAX_SEED = 2**32 - 1  # seeds are numpy's and Lightning's seed_everything's: 0 to 2^32 - 1
# The convergence verdict's measures (analysis/convergence.py), a grid's ``verdicts.convergence.measure``: none at
# its ceiling where the arms have risen (the within-length token score ends near 1 - chance for every risen arm, so
# equivalence there would be automatic). Each with its default equivalence margin, None where a grid must state one.
CONVERGENCE_MEASURES = {"score_beyond": 0.05, "loss_gain": None, "loss_gain_beyond": None}
MAX_PROBE_TOKENS = 2**21  # probe and evaluation lengths: 2M tokens, beyond any evaluated context


def check_probes(section: str, tasks: tuple[str, ...], lengths: tuple[int, ...], depths: tuple[float, ...]) -> None:
    """Checks the probe grid of ``section`` (eval or eval.heads); errors name its keys. Task names are
    checked by the evaluation code that owns them (probes/tasks.py ``check_tasks``)."""
    if len(set(tasks)) != len(tasks) or len(set(lengths)) != len(lengths):
        raise ValueError(f"{section}.tasks and {section}.lengths must not repeat an entry")
    if any(not 2 <= n <= MAX_PROBE_TOKENS for n in lengths):
        raise ValueError(f"{section}.lengths must be 2 to {MAX_PROBE_TOKENS:,} tokens each, got {list(lengths)}")
    if any(not 0 <= d <= 1 for d in depths) or not depths:
        raise ValueError(f"{section}.depths must be between 0 and 1 (and not empty), got {list(depths)}")
