"""The per-layer plan: a model is a tuple of ``LayerSpec`` expanded from a compact pattern.

``model.pattern`` is a string over ``F`` (full attention), ``E`` (the efficient mixer
named by ``model.mixer``) and the letter of any registered mixer (``S`` = SWA, ...),
tiled to fill ``model.n_layers``: ``EEEF`` with 8 layers is ``EEEFEEEF``; ``SSMF`` mixes
SWA and Mamba-2 layers explicitly. A parameter-matched model (``model.match_params``) gets its
non-full width from ``plan.matching.matched_plan``, which solves it by counting unmatched models.

This is where the ``model:`` section (a validated ``ModelConfig``) becomes the options the model is
built from (``hybrid_lightning/kinds/``): ``model_options`` and, per layer, ``mixer_options``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybrid_lightning.kinds import FULL, KINDS, LayerSpec, MixerOptions, ModelOptions, expand, layer_traits


def model_options(cfg: Any) -> ModelOptions:
    """The model-wide numbers of the ``model:`` section ``cfg``, its vocabulary size set."""
    if cfg.vocab_size is None:
        raise ValueError("model.vocab_size must be set (build_model fills it from the tokenizer)")
    return ModelOptions(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, vocab_size=cfg.vocab_size,
                        norm_eps=cfg.norm_eps, init_std=cfg.init_std, tie_embeddings=cfg.tie_embeddings)


def mixer_options(cfg: Any, mixer: str) -> MixerOptions:
    """The options of a ``mixer`` layer in the model of ``cfg``: each field of its options class takes the
    value of that name among the model's settings, the attention or recurrent ones and the kind's own
    ``model:`` section (``KINDS[mixer].section``), heads left open there resolved by ``cfg.heads``, and those
    the section's settings resolve against the model (their optional ``options(cfg)``)."""
    kind = KINDS[mixer]
    values = {"d_model": cfg.d_model, "norm_eps": cfg.norm_eps, "n_layers": cfg.n_layers}
    if kind.attention:
        values |= {"n_heads": cfg.n_heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "qk_norm": cfg.qk_norm,
                   "rope_theta": cfg.rope_theta, "backend": cfg.attn_backend}
    else:
        values |= {"backend": cfg.recurrent_backend, "chunk": cfg.recurrent_chunk}
    if kind.section is not None:
        settings = cfg.settings(mixer)
        own = dataclasses.asdict(settings)
        values |= own
        if "n_heads" in own:
            values["n_heads"], values["head_dim"] = cfg.heads(settings)
        if hasattr(settings, "options"):  # values the settings resolve against the model (kinds/headwise.py)
            values |= settings.options(cfg)
    return kind.options(**{f.name: values[f.name] for f in dataclasses.fields(kind.options)})


def layer_plan(cfg: Any, efficient_width: int | None = None) -> tuple[LayerSpec, ...]:
    """Expands ``cfg.pattern`` into one spec per layer (``cfg`` is already validated).

    Args:
        cfg: the ``model:`` section (a ``ModelConfig``).
        efficient_width: SwiGLU width of the non-full layers, required with ``cfg.match_params`` (the
            matched width, ``plan.matching.matched_plan``); default ``cfg.efficient_mlp_width``.
            Full-attention layers get ``cfg.mlp_width``.
    """
    if efficient_width is None:
        if cfg.match_params is not None:
            raise ValueError("model.match_params: the matched width is solved by plan.matching.matched_plan; "
                             "build the model with build_model")
        efficient_width = cfg.efficient_mlp_width
    mixers = expand(cfg.pattern, cfg.n_layers, cfg.mixer)
    options = {m: mixer_options(cfg, m) for m in dict.fromkeys(mixers)}
    specs = []
    for i, mixer in enumerate(mixers):
        window, pos = layer_traits(mixer, cfg.window, cfg.pos.full, cfg.pos.efficient)
        hidden = cfg.mlp_width if mixer == FULL else efficient_width
        specs.append(LayerSpec(index=i, mixer=mixer, window=window, pos=pos, mlp_hidden=hidden, options=options[mixer]))
    return tuple(specs)
