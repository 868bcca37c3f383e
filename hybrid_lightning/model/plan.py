"""The per-layer plan: a model is a tuple of ``LayerSpec`` expanded from a compact pattern.

``model.pattern`` is a string over ``F`` (full attention), ``E`` (the efficient mixer
named by ``model.mixer``) and the letter of any registered mixer (``S`` = SWA, ...),
tiled to fill ``model.n_layers``: ``EEEF`` with 8 layers is ``EEEFEEEF``; ``SSMF`` mixes
SWA and Mamba-2 layers explicitly. A parameter-matched model (``model.match_params``) gets its
non-full width from ``model.matching.matched_plan``, which solves it by counting unmatched models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid_lightning.kinds import EFFICIENT_LETTER, FULL, KINDS, by_letter

if TYPE_CHECKING:
    from hybrid_lightning.config import ModelConfig


@dataclass(frozen=True)
class LayerSpec:
    index: int
    mixer: str  # a key of kinds.KINDS (and of MIXERS)
    window: int | None  # attention window in tokens (current token included); None = unbounded
    pos: str | None  # "rope" | "nope" for attention layers; None for mixers without positions
    mlp_hidden: int  # SwiGLU width of this layer

    @property
    def is_full(self) -> bool:
        return self.mixer == FULL

    @property
    def letter(self) -> str:
        return KINDS[self.mixer].letter


def layer_plan(cfg: ModelConfig, efficient_width: int | None = None) -> tuple[LayerSpec, ...]:
    """Expands ``cfg.pattern`` into one spec per layer (``cfg`` is already validated).

    Args:
        cfg: the ``model:`` section.
        efficient_width: SwiGLU width of the non-full layers, required with ``cfg.match_params`` (the
            matched width, ``model.matching.matched_plan``); default ``cfg.efficient_mlp_width``.
            Full-attention layers get ``cfg.mlp_width``.
    """
    if efficient_width is None:
        if cfg.match_params is not None:
            raise ValueError("model.match_params: the matched width is solved by model.matching.matched_plan; "
                             "build the model with build_model")
        efficient_width = cfg.efficient_mlp_width
    letters = by_letter()
    tiled = cfg.pattern * (cfg.n_layers // len(cfg.pattern))
    specs = []
    for i, ch in enumerate(tiled):
        mixer = cfg.mixer if ch == EFFICIENT_LETTER else letters[ch]
        full = mixer == FULL
        pos = (cfg.pos.full if full else cfg.pos.efficient) if KINDS[mixer].uses_position else None
        window = cfg.window if KINDS[mixer].has_window else None
        hidden = cfg.mlp_width if full else efficient_width
        specs.append(LayerSpec(index=i, mixer=mixer, window=window, pos=pos, mlp_hidden=hidden))
    return tuple(specs)


def plan_string(plan: tuple[LayerSpec, ...]) -> str:
    return "".join(s.letter for s in plan)
