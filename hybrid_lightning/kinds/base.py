"""What every mixer definition is made of (plain Python, neither torch nor pydantic): the row that says what
a kind *is* (``MixerKind``), the options every mixer reads (``MixerOptions`` and its families), the numbers the
whole model shares (``ModelOptions``), and ``setting``, one user-facing key of a kind's ``model:`` section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def setting(default: Any, doc: str, **bounds: float) -> Any:
    """A field of a kind's settings dataclass (its ``model.<name>`` config section): its default, its line in
    docs/configuration.md and its bounds (``ge``, ``gt``), which the config schema enforces."""
    return dataclasses.field(default=default, metadata={"doc": doc, **bounds})


@dataclass(frozen=True)
class ModelOptions:
    """The numbers the whole model shares."""

    d_model: int
    n_layers: int
    n_heads: int  # attention heads per attention layer (the head analyses count them)
    vocab_size: int
    norm_eps: float
    init_std: float  # N(0, init_std) weights; residual outputs scaled by 1/sqrt(2 n_layers)
    tie_embeddings: bool


@dataclass(frozen=True)
class MixerOptions:
    """What every mixer gets; a kind without an options class of its own gets just this."""

    d_model: int
    norm_eps: float


@dataclass(frozen=True)
class RecurrentOptions(MixerOptions):
    """What the recurrent mixers share: the backend (``model.recurrent_backend``) and its chunk length."""

    backend: str
    chunk: int


@dataclass(frozen=True)
class HeadsSettings:
    """Heads of a recurrent mixer; left open (null), they are the model's (``ModelConfig.heads``)."""

    n_heads: int | None = setting(None, "null = model.n_heads", ge=1)
    head_dim: int | None = setting(None, "(query/key) width per head; null = model's head_dim", ge=1)

    def check(self, model: Any) -> None:
        """Constraints that involve the model's other settings (``model``: the validated ``model:`` section);
        a ``ValueError`` naming the key."""


@dataclass(frozen=True)
class MixerKind:
    """What a mixer *is*.

    Args:
        name: its name in configs (``model.mixer``) and in layer plans.
        letter: its letter in ``model.pattern``.
        attention: softmax attention (its cost grows with the keys it sees).
        has_window: attends to the last ``model.window`` tokens only.
        uses_position: takes a positional encoding (``model.pos.full`` / ``model.pos.efficient``).
        options: the class of the options its module reads (``MixerOptions`` or a subclass).
        settings: the dataclass of its ``model.<name>`` config section (its user-facing keys, ``setting``
            fields, and a ``check(model)``), or None for a kind without one.
        title: how reports name it.
    """

    name: str
    letter: str
    attention: bool = False
    has_window: bool = False
    uses_position: bool = False
    options: type[MixerOptions] = MixerOptions
    settings: type | None = None
    title: str = ""

    @property
    def section(self) -> str | None:
        """The ``model:`` section holding its settings (``model.<name>``), if it has one."""
        return self.name if self.settings is not None else None
