"""The configuration of an exported hybrid-lightning model (``transformers``, ``trust_remote_code=True``).

``hybrid_model`` holds the run's ``model:`` section as the exporter resolved it (head counts and widths
filled in), ``layers`` the per-layer plan it expanded to. The model code in this folder is the
package's own, copied at export; it reads its settings through ``ModelConfig`` below, a read-only
view of ``hybrid_model`` that needs neither ``hybrid_lightning`` nor pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig


@dataclass(frozen=True)
class LayerSpec:
    """One layer of the plan, as the package's ``model/plan.py`` defines it."""

    index: int
    mixer: str
    window: int | None
    pos: str | None
    mlp_hidden: int


class Settings:
    """Attribute access to a dict of settings, nested dicts as nested ``Settings``."""

    def __init__(self, values: dict):
        for key, value in values.items():
            setattr(self, key, Settings(value) if isinstance(value, dict) else value)


class ModelConfig(Settings):
    """The ``model:`` settings the model code reads; every derived value was resolved at export."""

    def heads(self, opts: Settings) -> tuple[int, int]:
        """(heads, width per head) of a recurrent mixer's options (filled in by the exporter)."""
        return opts.n_heads, opts.head_dim


def layer_plan(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """The exported plan: the package's layer plan of the run, stored in config.json."""
    return tuple(LayerSpec(**layer) for layer in cfg.layers)


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

    def model_settings(self) -> ModelConfig:
        return ModelConfig({**self.hybrid_model, "layers": self.layers})
