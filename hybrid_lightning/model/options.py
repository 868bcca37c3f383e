"""What the model is built from: frozen, typed options, plain Python (neither torch nor pydantic).

``design/plan.py`` resolves them from the ``model:`` section once: ``ModelOptions`` for the numbers
the whole model shares, and per layer a ``LayerSpec`` carrying its mixer's options (one dataclass
per mixer family, ``OPTIONS``). Mixers and blocks read these objects only, so an exported folder
rebuilds the same model from their dicts (``spec_from_dict``) without the package's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_lightning.kinds import FULL, KINDS


@dataclass(frozen=True)
class ModelOptions:
    """The numbers the whole model shares."""

    d_model: int
    n_layers: int
    n_heads: int  # attention heads per attention layer (the head analyses count them)
    vocab_size: int
    norm_eps: float
    init_std: float  # N(0, init_std) weights; residual outputs scaled by 1/sqrt(2 n_layers)
    tie_embeddings: bool


@dataclass(frozen=True)
class MixerOptions:
    """What every mixer gets; a mixer kind without an options class of its own gets just this."""

    d_model: int
    norm_eps: float


@dataclass(frozen=True)
class AttentionOptions(MixerOptions):
    """Softmax attention (``F``, ``S``): heads, GQA, QK-norm, RoPE base and the kernel."""

    n_heads: int
    kv_heads: int
    head_dim: int
    qk_norm: bool
    rope_theta: float
    backend: str  # model.attn_backend


@dataclass(frozen=True)
class RecurrentOptions(MixerOptions):
    """What the recurrent mixers share: the backend (``model.recurrent_backend``) and its chunk length."""

    backend: str
    chunk: int


@dataclass(frozen=True)
class Mamba2Options(RecurrentOptions):
    """``model.mamba2``: inner width ``expand * d_model`` in heads of ``head_dim`` channels."""

    expand: int
    head_dim: int
    d_state: int
    conv_size: int


@dataclass(frozen=True)
class GatedDeltaNetOptions(RecurrentOptions):
    """``model.gated_deltanet``, its heads resolved from the model's where left open."""

    n_heads: int
    head_dim: int
    expand_v: float
    conv_size: int


@dataclass(frozen=True)
class LightningOptions(RecurrentOptions):
    """``model.lightning``, its heads resolved; the decays follow from the layer's index among ``n_layers``."""

    n_heads: int
    head_dim: int
    n_layers: int


# mixer kind -> the class of its options (kinds not listed take MixerOptions)
OPTIONS: dict[str, type[MixerOptions]] = {
    FULL: AttentionOptions,
    "swa": AttentionOptions,
    "mamba2": Mamba2Options,
    "gated_deltanet": GatedDeltaNetOptions,
    "lightning": LightningOptions,
}


def options_class(mixer: str) -> type[MixerOptions]:
    return OPTIONS.get(mixer, MixerOptions)


@dataclass(frozen=True)
class LayerSpec:
    index: int
    mixer: str  # a key of kinds.KINDS (and of MIXERS)
    window: int | None  # attention window in tokens (current token included); None = unbounded
    pos: str | None  # "rope" | "nope" for attention layers; None for mixers without positions
    mlp_hidden: int  # SwiGLU width of this layer
    options: MixerOptions  # the mixer's options, of class options_class(mixer)

    @property
    def is_full(self) -> bool:
        return self.mixer == FULL

    @property
    def letter(self) -> str:
        return KINDS[self.mixer].letter


def spec_from_dict(layer: dict) -> LayerSpec:
    """The ``LayerSpec`` of ``dataclasses.asdict(spec)`` (an exported folder's config.json stores these)."""
    return LayerSpec(**{**layer, "options": options_class(layer["mixer"])(**layer["options"])})
