"""The pieces every config section is made of: frozen strict models, numbers as written, and the role tag
of each key (config/roles.py)."""

from __future__ import annotations

import json
import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

# Each key's role for a run (config/roles.py): untagged = identity.
ROLE_KEY, IDENTITY, RESUMABLE, BOOKKEEPING, LABEL = "role", "identity", "resumable", "bookkeeping", "label"


def role(name: str) -> dict:
    """``Field`` arguments tagging a field (or a whole section) with its role (config/roles.py)."""
    return {"json_schema_extra": {ROLE_KEY: name}}


def _a_number(value):
    if isinstance(value, bool):
        raise ValueError(f"input should be a number, not {str(value).lower()}")
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:  # a word, not a quoted number
            raise ValueError(f"takes numbers, not the string {json.dumps(value)}; give a number") from None
        raise ValueError(f"takes numbers, not the string {json.dumps(value)}; write it without quotes")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"input should be a finite number, got {value}")
    return value


# Numbers as written: neither YAML's true/false nor a quoted number ("32" would otherwise pass as 32,
# and a grid would name it apart from 32), nor .inf or .nan. Configs are read with YAML 1.2's number rules
# (config/loading.read_yaml), so an unquoted 3e-4 is a float.
Number = Annotated[float, BeforeValidator(_a_number), AfterValidator(_finite)]
Whole = Annotated[int, BeforeValidator(_a_number)]


class _Frozen(BaseModel):
    """Numbers and switches are typed strictly (``Whole``, ``Number``, ``StrictBool``): YAML's
    true/false are not numbers (``window: true`` would otherwise pass as 1), and a switch takes true or
    false only (not 1 or "yes")."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
