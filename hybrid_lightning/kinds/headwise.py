"""Head-wise hybrid attention (``H``): inside one attention layer some heads attend fully, the others within
``model.window`` (the head-wise variant of "Rethinking the Role of Efficient Attention in Hybrid Architectures",
arXiv 2606.15378, beside its layer-wise hybrids). Its ``model.headwise`` settings say which heads are full; the
layer plan records the split as one letter per head (``HeadwiseOptions.heads``: ``F`` full, ``S`` windowed), the
letters of the pattern language."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds.attention import MODULE, AttentionOptions
from hybrid_lightning.kinds.base import MixerKind, register, setting

FULL_HEAD, WINDOWED_HEAD = "F", "S"  # a head's letter in HeadwiseOptions.heads


@dataclass(frozen=True)
class HeadwiseSettings:
    """Head-wise hybrid layers (``H``): in each, some heads attend fully and the rest within `model.window`."""

    full_heads: int | None = setting(None, "heads of each head-wise layer that attend fully, the first ones (the rest "
                                     "attend within `model.window`); null = half of `model.n_heads`, rounded down, "
                                     "unless `heads` says which", ge=0)
    heads: str | None = setting(None, "which heads attend fully, one letter per head: `F` full, `S` windowed (e.g. "
                                "`FSFS`); null = the first `full_heads`")

    def check(self, model: Any) -> None:
        if self.heads is not None and self.full_heads is not None:
            raise ValueError("model.headwise: set full_heads (how many, the first ones) or heads (which), not both")
        if self.full_heads is not None and self.full_heads > model.n_heads:
            raise ValueError(f"model.headwise.full_heads={self.full_heads} is more than model.n_heads={model.n_heads}")
        letters = {FULL_HEAD, WINDOWED_HEAD}
        if self.heads is not None and (len(self.heads) != model.n_heads or not set(self.heads) <= letters):
            raise ValueError(f"model.headwise.heads={self.heads!r} must hold one letter per head of model.n_heads="
                             f"{model.n_heads}, each {FULL_HEAD!r} (full) or {WINDOWED_HEAD!r} (windowed)")

    def options(self, model: Any) -> dict:
        """The option values these settings resolve to in ``model`` (the ``model:`` section): ``heads``, the
        letter of every head."""
        if self.heads is not None:
            return {"heads": self.heads}
        full = model.n_heads // 2 if self.full_heads is None else self.full_heads
        return {"heads": FULL_HEAD * full + WINDOWED_HEAD * (model.n_heads - full)}


@dataclass(frozen=True)
class HeadwiseOptions(AttentionOptions):
    """The attention options and the split: ``heads``, one letter per head (``F`` full, ``S`` within the layer's
    window)."""

    heads: str

    def head_windows(self, window: int | None) -> tuple[int | None, ...]:
        """Each head's window in a layer of ``window``: None (full) or ``window``."""
        return tuple(None if letter == FULL_HEAD else window for letter in self.heads)


KIND = register(MixerKind(
    "headwise", "H", "hybrid_lightning.model.mixers.headwise.HeadwiseAttention", attention=True, has_window=True,
    uses_position=True, options=HeadwiseOptions, settings=HeadwiseSettings, title="head-wise full/SWA attention",
    definition=__name__, operators=(MODULE.rpartition(".")[0],),
))
