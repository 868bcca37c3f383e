"""The ``model.<mixer>`` config sections, derived from the mixers' settings dataclasses (``kinds/``): one
schema per mixer that has a section, which ``ModelConfig`` (config/schema.py) adds as a field."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import Field, StrictBool, create_model

from hybrid_lightning.config.fields import Number, Whole, _Frozen
from hybrid_lightning.kinds import KINDS, MixerKind


def setting_type(annotation: Any) -> Any:
    """A settings dataclass's field type as the schema types it: numbers as written (``Whole``, ``Number``),
    switches strict, ``X | None`` kept optional."""
    strict = {int: Whole, float: Number, bool: StrictBool}
    args = typing.get_args(annotation)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return strict.get(inner, inner) | None
    return strict.get(annotation, annotation)


def mixer_section(kind: MixerKind) -> type[_Frozen]:
    """The ``model.<kind.section>`` section, derived from the kind's settings dataclass (``kinds/``): a field
    per setting with its default, bounds and doc, and the dataclass's ``check(model)`` run by ``ModelConfig``."""
    hints = typing.get_type_hints(kind.settings)
    fields = {f.name: (setting_type(hints[f.name]),
                       Field(f.default, description=f.metadata["doc"],
                             **{b: f.metadata[b] for b in ("ge", "gt") if b in f.metadata}))
              for f in dataclasses.fields(kind.settings)}
    return create_model(kind.settings.__name__.removesuffix("Settings") + "Config", __base__=_Frozen,
                        __doc__=kind.settings.__doc__, __module__=__name__, **fields)


SECTIONS = {k.section: mixer_section(k) for k in KINDS.values() if k.section}  # section name -> its schema
