"""Mixer kinds as data: the one table that config, layer plan, model, analysis and bench read.

A row says what a mixer *is* (its name in configs, its letter in ``model.pattern``, whether it
takes a window and a positional encoding, which ``model:`` section holds its options); the
classes that implement the names live in ``model/mixers/__init__.py``, which checks at import
that both list the same names. Adding a mixer: its file, its class in ``MIXERS`` and one row here
(and its options class in the config schema, if it has options).

This module imports nothing from the package, so any layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL = "full"  # the full-attention kind: pattern letter F
EFFICIENT_LETTER = "E"  # the pattern letter that stands for model.mixer


@dataclass(frozen=True)
class MixerKind:
    name: str  # the name in configs (model.mixer) and in layer plans
    letter: str  # its letter in model.pattern
    attention: bool = False  # softmax attention: its cost grows with the keys it sees
    has_window: bool = False  # attends to the last model.window tokens only
    uses_position: bool = False  # takes a positional encoding (model.pos.full / model.pos.efficient)
    options: str | None = None  # the model: section holding its options (model.<options>.*), if any
    title: str = ""  # how reports name it


KINDS: dict[str, MixerKind] = {
    k.name: k
    for k in (
        MixerKind(FULL, "F", attention=True, uses_position=True, title="full attention"),
        MixerKind("swa", "S", attention=True, has_window=True, uses_position=True, title="sliding-window attention"),
        MixerKind("mamba2", "M", options="mamba2", title="Mamba-2"),
        MixerKind("gated_deltanet", "G", options="gated_deltanet", title="Gated DeltaNet"),
        MixerKind("lightning", "L", options="lightning", title="Lightning Attention"),
    )
}


def kind(name: str) -> MixerKind:
    """The row of mixer ``name``; a ``ValueError`` listing the known names otherwise."""
    if name not in KINDS:
        raise ValueError(f"unknown mixer {name!r}; accepted mixers: {sorted(KINDS)}")
    return KINDS[name]


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
