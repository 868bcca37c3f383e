"""The mixer classes. Every mixer maps (B, T, D) -> (B, T, D) behind one contract:

    cls(opts, spec: LayerSpec); forward(x, state: dict | None = None) -> y
    optionally flops_per_token(T) -> training FLOPs per token beyond its weights (model.block_flops_per_token)

``state`` is None for a plain causal forward from position 0, or a dict (empty at first)
that the mixer reads and updates in place so that a sequence fed in pieces gives the
same outputs as one full forward. ``opts`` is ``spec.options``, the mixer's frozen options
(its definition's options class, ``hybrid_lightning/kinds/``, resolved from the config by the layer plan): a
mixer reads nothing else. What a mixer is (letter, window, positions, options, config section, and this class,
by dotted name) is its definition in ``hybrid_lightning/kinds/``; the model imports the class from there
(``MixerKind.mixer_class``), so nothing here lists the mixers (docs/extending.md).
"""
