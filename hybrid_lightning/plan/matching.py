"""Parameter matching: architectures are compared at equal non-embedding parameter count.

The paper compares parameter-matched architectures. A recurrent mixer holds more parameters than
an attention layer (Mamba-2 and Gated DeltaNet about 6·d², Lightning Attention about 5·d², attention
4·d² without GQA), so ``model.match_params: F`` sets one documented width, the SwiGLU hidden size of
the non-full layers, such that the non-embedding parameter count equals that of the same model with
pattern ``F`` (all full attention). The full-attention layers keep their width, so they are the same
layers in every architecture compared.

The functions take the ``model:`` section, a validated ``ModelConfig`` read by attribute (``cfg``): the
model layer imports no config class.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds import LayerSpec
from hybrid_lightning.plan.count import count
from hybrid_lightning.plan.layers import layer_plan, model_options

MATCH_TOLERANCE = 0.02  # largest accepted relative deviation from the reference
FULL_PATTERN = "F"  # the default reference: all layers full attention


@dataclass(frozen=True)
class ParamMatch:
    reference_pattern: str
    reference: int  # non-embedding parameters of the reference model
    matched: int  # non-embedding parameters of this model
    width: int  # SwiGLU width of the non-full layers
    base_width: int  # that width before matching

    @property
    def deviation(self) -> float:
        return (self.matched - self.reference) / self.reference


@functools.cache
def non_embedding_params(cfg: Any) -> int:
    """The non-embedding parameters of the model of the ``model:`` section ``cfg`` (``count.count``; its vocabulary
    need not be resolved)."""
    cfg = cfg.model_copy(update={"vocab_size": cfg.vocab_size or 2})
    return count(model_options(cfg), matched_plan(cfg)).non_embedding


def matched_plan(cfg: Any) -> tuple[LayerSpec, ...]:
    """The layer plan of ``cfg``, its non-full layers at the matched width where ``cfg.match_params`` is set."""
    return layer_plan(cfg, match_params(cfg).width if cfg.match_params is not None else None)


def param_report(cfg: Any) -> ParamMatch:
    """This model against its reference: ``cfg.match_params`` when set (the matched model), else the
    all-full-attention model of the same size (pattern ``F``), for an unmatched comparison."""
    if cfg.match_params is not None:
        return match_params(cfg)
    reference = cfg.model_copy(update={"pattern": FULL_PATTERN, "efficient_mlp_hidden": None})
    width = cfg.efficient_mlp_width
    return ParamMatch(FULL_PATTERN, non_embedding_params(reference), _count(cfg, width), width, width)


@functools.lru_cache(maxsize=64)
def match_params(cfg: Any) -> ParamMatch:
    """Solves for the non-full layers' SwiGLU width that matches ``cfg.match_params``'s count.

    The count is affine in that width, so two counts give the slope and a third checks the result.
    Cached per config (configs are frozen): every build of a matched model needs the width.
    """
    pattern = cfg.match_params
    assert pattern is not None
    reference = non_embedding_params(
        cfg.model_copy(update={"pattern": pattern, "match_params": None, "efficient_mlp_hidden": None})
    )
    base = cfg.mlp_width
    at_base = _count(cfg, base)
    per_unit = _count(cfg, base + 1) - at_base
    if per_unit == 0:
        if at_base != reference:
            raise ValueError(
                f"model.match_params={pattern!r}: model.pattern {cfg.pattern!r} has no non-full layer whose "
                "SwiGLU width could be adjusted"
            )
        return ParamMatch(pattern, reference, at_base, base, base)
    width = round(base + (reference - at_base) / per_unit)
    if width < 1:
        raise ValueError(
            f"model.match_params={pattern!r}: the non-full layers' mixers alone hold more parameters than the "
            f"reference ({reference:,}); shrink them (e.g. model.mamba2.expand) or use another reference"
        )
    match = ParamMatch(pattern, reference, _count(cfg, width), width, base)
    if abs(match.deviation) > MATCH_TOLERANCE:
        raise ValueError(
            f"model.match_params={pattern!r}: the closest width {width} gives {match.matched:,} parameters, "
            f"{match.deviation:+.1%} from the reference's {reference:,} (tolerance {MATCH_TOLERANCE:.0%})"
        )
    return match


def _count(cfg: Any, efficient_width: int) -> int:
    return non_embedding_params(cfg.model_copy(update={"match_params": None, "efficient_mlp_hidden": efficient_width}))
