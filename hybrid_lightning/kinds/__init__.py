"""The mixers as data: the one registry (``KINDS``) that config, layer plan, model, export, analysis and bench
read, filled by the definitions, one file per mixer (``attention``, ``mamba2``, ``gated_deltanet``,
``lightning``, ``headwise``), each registering itself when imported (``base.register``): the imports below are the
package's registration lines, one per definition. A definition says what a mixer *is* (``base.MixerKind``: its name in
configs, its letter in ``model.pattern``, whether it takes a window and a positional encoding, its ``nn.Module``
class and operator modules by dotted name, its measured CPU bf16 speed-up), the options its module reads (a
frozen dataclass), and its ``model.<name>`` config section (a settings dataclass, from which config/schema.py
derives the section). Also the per-layer plan's unit, ``LayerSpec``, and the pattern's expansion into layers.

Plain Python (neither torch nor pydantic), so that any layer may read it and an exported folder carries it; the
classes it names are imported only where a model is built (``MixerKind.mixer_class``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_lightning.kinds.base import (
    EFFICIENT_LETTER,
    KINDS,
    HeadsSettings,
    MixerKind,
    MixerOptions,
    ModelOptions,
    RecurrentOptions,
    register,
    setting,
)

# The package's mixers, one registration line per definition file (importing it registers its mixers).
# Unsorted on purpose: their order is the order of KINDS (attention, mamba2, gated_deltanet, lightning, headwise, kda,
# gated_deltaproduct).
# isort: off
from hybrid_lightning.kinds.attention import FULL, AttentionOptions  # full, swa
from hybrid_lightning.kinds.mamba2 import KIND as MAMBA2  # noqa: F401
from hybrid_lightning.kinds.gated_deltanet import KIND as GATED_DELTANET  # noqa: F401
from hybrid_lightning.kinds.lightning import KIND as LIGHTNING  # noqa: F401
from hybrid_lightning.kinds.headwise import KIND as HEADWISE  # noqa: F401
from hybrid_lightning.kinds.kda import KIND as KDA  # noqa: F401
from hybrid_lightning.kinds.gated_deltaproduct import KIND as GATED_DELTAPRODUCT  # noqa: F401
# isort: on

__all__ = ["EFFICIENT_LETTER", "FULL", "KINDS", "AttentionOptions", "HeadsSettings", "LayerSpec", "MixerKind",
           "MixerOptions", "ModelOptions", "RecurrentOptions", "by_letter", "canonical_pattern", "check_pattern",
           "expand", "kind", "layer_traits", "mixer_names", "pattern_mixers", "register", "setting", "spec_from_dict"]


def kind(name: str) -> MixerKind:
    """The row of mixer ``name``; a ``ValueError`` listing the known names otherwise."""
    if name not in KINDS:
        raise ValueError(f"unknown mixer {name!r}; accepted mixers: {sorted(KINDS)}")
    return KINDS[name]


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a model: its mixer (a key of ``KINDS``) and what the mixer and its SwiGLU are built with."""

    index: int
    mixer: str
    window: int | None  # attention window in tokens (current token included); None = unbounded
    pos: str | None  # "rope" | "nope" for attention layers; None for mixers without positions
    mlp_hidden: int  # SwiGLU width of this layer
    options: MixerOptions  # the mixer's options, of class KINDS[mixer].options

    @property
    def is_full(self) -> bool:
        return self.mixer == FULL

    @property
    def letter(self) -> str:
        return KINDS[self.mixer].letter


def spec_from_dict(layer: dict) -> LayerSpec:
    """The ``LayerSpec`` of ``dataclasses.asdict(spec)`` (a run plan's layers and an exported folder's config.json)."""
    fields = {k: layer[k] for k in ("index", "mixer", "window", "pos", "mlp_hidden")}
    return LayerSpec(**fields, options=kind(layer["mixer"]).options(**layer["options"]))


def mixer_names(efficient_only: bool = False) -> list[str]:
    return [n for n in KINDS if not (efficient_only and n == FULL)]


def by_letter() -> dict[str, str]:
    """Pattern letter -> mixer name (``E`` excluded: it stands for ``model.mixer``)."""
    return {k.letter: k.name for k in KINDS.values()}


def check_pattern(pattern: str, n_layers: int, field: str = "model.pattern") -> None:
    """A ``ValueError`` naming ``field`` unless ``pattern`` uses known letters and tiles ``n_layers``."""
    letters = by_letter()
    if not pattern:
        raise ValueError(f"{field} is empty; use letters from {sorted([EFFICIENT_LETTER, *letters])}")
    for i, ch in enumerate(pattern):
        if ch != EFFICIENT_LETTER and ch not in letters:
            names = ", ".join(f"{letter}={name}" for letter, name in sorted(letters.items()))
            raise ValueError(
                f"{field} {pattern!r}: unknown letter {ch!r} at position {i}; accepted letters: "
                f"E (= model.mixer), {names}"
            )
    if n_layers % len(pattern):
        raise ValueError(
            f"{field} {pattern!r} (length {len(pattern)}) must tile model.n_layers={n_layers}: "
            f"use a pattern whose length divides {n_layers}, or one of length {n_layers}"
        )


def pattern_mixers(pattern: str, mixer: str | None) -> list[str]:
    """The mixer names a pattern stands for, ``E`` resolved to ``mixer``, in order of first use;
    unknown letters (and ``E`` without a mixer) are left out."""
    letters = by_letter()
    names = (mixer if ch == EFFICIENT_LETTER else letters.get(ch) for ch in pattern)
    return list(dict.fromkeys(n for n in names if n))


def expand(pattern: str, n_layers: int, mixer: str) -> list[str]:
    """The mixer of each of ``n_layers`` layers: ``pattern`` (checked, ``check_pattern``) tiled, ``E`` = ``mixer``."""
    letters = by_letter()
    return [mixer if ch == EFFICIENT_LETTER else letters[ch] for ch in pattern * (n_layers // len(pattern))]


def layer_traits(mixer: str, window: int, pos_full: str, pos_efficient: str) -> tuple[int | None, str | None]:
    """(window, positional encoding) of a ``mixer`` layer in a model of ``window`` and ``pos_*``: None where
    the kind takes no window or no position."""
    row = kind(mixer)
    pos = (pos_full if mixer == FULL else pos_efficient) if row.uses_position else None
    return (window if row.has_window else None), pos


def canonical_pattern(mixers: list[str]) -> str:
    """The pattern that names a plan of layers (their mixer names) whatever the config spelled: the letters'
    shortest period, with ``E`` for the efficient mixer where the plan has one kind of them (``SSSFSSSF``,
    ``EEEF`` with ``model.mixer: swa`` and ``EEEFEEEF`` are all ``EEEF``; ``SSMF`` stays)."""
    efficient = {m for m in mixers if m != FULL}
    letters = "".join(EFFICIENT_LETTER if len(efficient) == 1 and m in efficient else kind(m).letter for m in mixers)
    n = len(letters)
    period = next(p for p in range(1, n + 1) if n % p == 0 and letters[:p] * (n // p) == letters) if n else 0
    return letters[:period]
