"""The per-layer plan: a model is a tuple of ``LayerSpec`` expanded from a compact pattern.

``model.pattern`` is a string over ``F`` (full attention), ``E`` (the efficient mixer
named by ``model.mixer``) and the letter of any registered mixer (``S`` = SWA, ...),
tiled to fill ``model.n_layers``: ``EEEF`` with 8 layers is ``EEEFEEEF``; ``SSMF`` mixes
SWA and Mamba-2 layers explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybrid_lightning.config import ModelConfig

EFFICIENT_LETTER = "E"
FULL = "full"


@dataclass(frozen=True)
class LayerSpec:
    index: int
    mixer: str  # a key of MIXERS
    window: int | None  # attention window in tokens (current token included); None = unbounded
    pos: str | None  # "rope" | "nope" for attention layers; None for mixers without positions
    mlp_hidden: int  # SwiGLU width of this layer

    @property
    def is_full(self) -> bool:
        return self.mixer == FULL

    @property
    def letter(self) -> str:
        return _letters()[self.mixer]


def _registry() -> dict:
    from hybrid_lightning.model.mixers import MIXERS

    return MIXERS


def _letters() -> dict[str, str]:
    return {name: letter for name, (letter, _) in _registry().items()}


def mixer_names(efficient_only: bool = False) -> list[str]:
    return [n for n in _registry() if not (efficient_only and n == FULL)]


def uses_position(mixer: str) -> bool:
    return bool(getattr(_registry()[mixer][1], "uses_position", False))


def check_pattern(pattern: str, n_layers: int, field: str = "model.pattern") -> None:
    by_letter = {letter: name for name, letter in _letters().items()}
    valid = sorted([EFFICIENT_LETTER, *by_letter])
    if not pattern:
        raise ValueError(f"{field} is empty; use letters from {valid}")
    for i, ch in enumerate(pattern):
        if ch != EFFICIENT_LETTER and ch not in by_letter:
            names = ", ".join(f"{letter}={name}" for letter, name in sorted(by_letter.items()))
            raise ValueError(
                f"{field} {pattern!r}: unknown letter {ch!r} at position {i}; accepted letters: "
                f"E (= model.mixer), {names}"
            )
    if n_layers % len(pattern):
        raise ValueError(
            f"{field} {pattern!r} (length {len(pattern)}) must tile model.n_layers={n_layers}: "
            f"use a pattern whose length divides {n_layers}, or one of length {n_layers}"
        )


def pattern_mixers(pattern: str, mixer: str) -> set[str]:
    """The mixer names a (valid) pattern stands for, ``E`` resolved to ``mixer``."""
    by_letter = {letter: name for name, letter in _letters().items()}
    return {mixer if ch == EFFICIENT_LETTER else by_letter[ch] for ch in pattern}


def layer_plan(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Expands ``cfg.pattern`` into one spec per layer (``cfg`` is already validated).

    Full-attention layers get ``cfg.mlp_width``; the others ``cfg.efficient_mlp_width``, or with
    ``cfg.match_params`` the width that matches the reference's parameter count (model/matching.py).
    """
    by_letter = {letter: name for name, letter in _letters().items()}
    tiled = cfg.pattern * (cfg.n_layers // len(cfg.pattern))
    efficient_width = cfg.efficient_mlp_width
    if cfg.match_params is not None:
        from hybrid_lightning.model.matching import match_params

        efficient_width = match_params(cfg).width
    specs = []
    for i, ch in enumerate(tiled):
        mixer = cfg.mixer if ch == EFFICIENT_LETTER else by_letter[ch]
        full = mixer == FULL
        pos = (cfg.pos.full if full else cfg.pos.efficient) if uses_position(mixer) else None
        window = cfg.window if mixer == "swa" else None
        hidden = cfg.mlp_width if full else efficient_width
        specs.append(LayerSpec(index=i, mixer=mixer, window=window, pos=pos, mlp_hidden=hidden))
    return tuple(specs)


def plan_string(plan: tuple[LayerSpec, ...]) -> str:
    return "".join(s.letter for s in plan)
