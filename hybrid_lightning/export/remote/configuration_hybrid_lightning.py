"""The configuration of an exported hybrid-lightning model (``transformers``, ``trust_remote_code=True``).

``hybrid_model`` holds the numbers the whole model shares (the package's ``ModelOptions``), ``layers``
the per-layer plan with each layer's mixer options, all as dicts (``dataclasses.asdict``) of the frozen
options the package resolved from the run's ``model:`` section. The model code in this folder is the
package's own, copied at export; ``hl_kinds.py`` rebuilds the options from these dicts.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class HybridLightningConfig(PretrainedConfig):
    model_type = "hybrid_lightning"

    def __init__(self, hybrid_model: dict | None = None, layers: list[dict] | None = None, use_cache: bool = True,
                 **kwargs):
        self.use_cache = use_cache
        self.hybrid_model = hybrid_model or {}
        self.layers = layers or []
        self.vocab_size = self.hybrid_model.get("vocab_size")
        self.hidden_size = self.hybrid_model.get("d_model")
        self.num_hidden_layers = self.hybrid_model.get("n_layers")
        self.num_attention_heads = self.hybrid_model.get("n_heads")
        kwargs.setdefault("tie_word_embeddings", bool(self.hybrid_model.get("tie_embeddings", False)))
        super().__init__(**kwargs)
