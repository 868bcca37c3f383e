"""The mixer classes. Every mixer maps (B, T, D) -> (B, T, D) behind one contract:

    cls(opts, spec: LayerSpec); forward(x, state: dict | None = None) -> y
    optionally flops_per_token(T) -> training FLOPs per token beyond its weights (model.block_flops_per_token)

``state`` is None for a plain causal forward from position 0, or a dict (empty at first)
that the mixer reads and updates in place so that a sequence fed in pieces gives the
same outputs as one full forward. ``opts`` is ``spec.options``, the mixer's frozen options
(its kind's options class, ``hybrid_lightning/kinds/``, resolved from the config by the layer plan): a
mixer reads nothing else. What a mixer is (letter, window, positions, options, config section) is its
definition in ``hybrid_lightning/kinds/``; this dict only names the class of each kind.

Adding a mixer: its definition in ``kinds/`` (one file, listed in ``kinds.KINDS``), its module beside this
one and one line below (docs/extending.md).
"""

from __future__ import annotations

from torch import nn

from hybrid_lightning.kinds import KINDS
from hybrid_lightning.model.mixers.attention import Attention
from hybrid_lightning.model.mixers.gated_deltanet import GatedDeltaNet
from hybrid_lightning.model.mixers.lightning import LightningAttention
from hybrid_lightning.model.mixers.mamba2 import Mamba2

MIXERS: dict[str, type[nn.Module]] = {
    "full": Attention,
    "swa": Attention,
    "mamba2": Mamba2,
    "gated_deltanet": GatedDeltaNet,
    "lightning": LightningAttention,
}


def check_registry() -> None:
    """Every kind in the table has a class and every class a kind (run at import and by tests)."""
    if set(MIXERS) != set(KINDS):
        raise RuntimeError(
            f"mixer classes {sorted(MIXERS)} and mixer kinds {sorted(KINDS)} disagree: "
            "add the class to MIXERS and the definition to hybrid_lightning/kinds/ together"
        )


check_registry()
