"""The mixer registry. Every mixer maps (B, T, D) -> (B, T, D) behind one contract:

    cls(cfg: ModelConfig, spec: LayerSpec); forward(x, state: dict | None = None) -> y

``state`` is None for a plain causal forward from position 0, or a dict (empty at first)
that the mixer reads and updates in place so that a sequence fed in pieces gives the
same outputs as one full forward. A class attribute ``uses_position = True`` marks
mixers that take a positional encoding (``model.pos``).

Adding a mixer: one file beside this one and one line below (name -> (pattern letter, class)).
"""

from __future__ import annotations

from torch import nn

from hybrid_lightning.model.mixers.attention import Attention
from hybrid_lightning.model.mixers.gated_deltanet import GatedDeltaNet
from hybrid_lightning.model.mixers.lightning import LightningAttention
from hybrid_lightning.model.mixers.mamba2 import Mamba2

MIXERS: dict[str, tuple[str, type[nn.Module]]] = {
    "full": ("F", Attention),
    "swa": ("S", Attention),
    "mamba2": ("M", Mamba2),
    "gated_deltanet": ("G", GatedDeltaNet),
    "lightning": ("L", LightningAttention),
}
