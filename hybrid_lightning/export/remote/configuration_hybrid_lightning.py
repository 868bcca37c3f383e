"""The configuration of an exported hybrid-lightning model (``transformers``, ``trust_remote_code=True``).

``hybrid_model`` holds the numbers the whole model shares (the package's ``ModelOptions``), ``layers``
the per-layer plan with each layer's mixer options, all as dicts (``dataclasses.asdict``) of the frozen
options the package resolved from the run's ``model:`` section. The model code in this folder is the
package's own, copied at export; ``hl_kinds.py`` rebuilds the options from these dicts.
"""

from __future__ import annotations

from transformers import PretrainedConfig

# An attention layer's parameters in model.safetensors are named as Llama's (``model.layers.<i>.self_attn.q_proj``),
# which scripts written for transformers models read; the model holds them as ``model.layers.<i>.mixer.wq``: native
# name -> Llama name. Export writes the Llama names (export/folder.py), loading maps them back (``key_mapping``).
ATTENTION_MODULE = ("mixer", "self_attn")
ATTENTION_NAMES = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "q_norm": "q_norm",
                   "k_norm": "k_norm"}


def key_mapping() -> dict[str, str]:
    """``from_pretrained``'s ``key_mapping``: each Llama name of model.safetensors (a regex) -> the model's name."""
    native, llama = ATTENTION_MODULE
    return {rf"\.{llama}\.{theirs}\.": f".{native}.{ours}." for ours, theirs in ATTENTION_NAMES.items()}


class HybridLightningConfig(PretrainedConfig):
    model_type = "hybrid_lightning"

    def __init__(self, hybrid_model: dict | None = None, layers: list[dict] | None = None, use_cache: bool = True,
                 num_key_value_heads: int | None = None, head_dim: int | None = None, **kwargs):
        self.use_cache = use_cache
        self.hybrid_model = hybrid_model or {}
        self.layers = layers or []
        self.vocab_size = self.hybrid_model.get("vocab_size")
        self.hidden_size = self.hybrid_model.get("d_model")
        self.num_hidden_layers = self.hybrid_model.get("n_layers")
        self.num_attention_heads = self.hybrid_model.get("n_heads")
        self.num_key_value_heads = num_key_value_heads  # of the attention layers; None: the model has none
        self.head_dim = head_dim
        kwargs.setdefault("tie_word_embeddings", bool(self.hybrid_model.get("tie_embeddings", False)))
        super().__init__(**kwargs)
