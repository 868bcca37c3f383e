"""An exported hybrid-lightning model as a ``transformers`` causal LM (``trust_remote_code=True``).

The network is the package's own ``HybridLM`` (``hl_transformer.py`` and the files it imports were
copied from ``hybrid_lightning/model`` at export), so its logits are the native model's. Generation
carries the native incremental state, one dict per layer: the KV cache of full-attention layers,
the last W-1 keys and values of sliding-window layers, the convolution and recurrent states of
Mamba-2, Gated DeltaNet and Lightning layers. Each step after the prompt feeds one token, so greedy
generation costs time linear in the generated length (times the full-attention layers' cache).

Padded batches are refused: the native state starts every sequence at position 0.

``output_attentions=True`` returns each layer's softmax probabilities (B, H, T, T), the attention mixer's own
(``hl_observe.py``), None for layers without attention; ``output_hidden_states=True`` the embeddings and then
each block's output (n_layers + 1 tensors, the last before the final norm); ``inputs_embeds`` (B, T, D) stands for
``input_ids``. These run one forward from position 0 without a state (as ``use_cache=False``). An attention
layer's weights are stored under Llama's names (``model.layers.<i>.self_attn.q_proj.weight``) and loaded back
into the model's (``configuration_hybrid_lightning.key_mapping``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hybrid_lightning import HybridLightningConfig, key_mapping
from .hl_kinds import ModelOptions, spec_from_dict
from .hl_observe import observe
from .hl_registry import REGISTERED  # noqa: F401 (every mixer of the exporting process registered, its class at hand)
from .hl_transformer import HybridLM


class HybridState:
    """The native per-layer states of one batch and the number of tokens they have consumed."""

    def __init__(self, layers: list[dict]):
        self.layers = layers
        self.seen = 0


@dataclass
class HybridLightningOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    state: HybridState | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor | None, ...] | None = None


class HybridLightningForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = HybridLightningConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: HybridLightningConfig):
        super().__init__(config)
        self.model = HybridLM(ModelOptions(**config.hybrid_model),
                              tuple(spec_from_dict(layer) for layer in config.layers))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Weights come from model.safetensors; HybridLM initialised itself when built."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        kwargs.setdefault("key_mapping", key_mapping())  # the Llama names of the attention layers' weights
        model = super().from_pretrained(*args, **kwargs)
        model.restore_buffers()
        return model

    @torch.no_grad()
    def restore_buffers(self) -> None:
        """Recomputes the mixers' non-persistent buffers (RoPE frequencies, Lightning decays), which are not
        in model.safetensors and which ``from_pretrained`` leaves uninitialised (it builds the model on the
        meta device): each layer's mixer is built once more on the CPU and its buffers copied over."""
        for block in self.model.layers:
            with torch.device("cpu"):
                fresh = type(block.mixer)(block.spec.options, block.spec)
            stored = set(fresh.state_dict())
            for name, buffer in fresh.named_buffers():
                if name in stored:
                    continue
                owner, _, leaf = name.rpartition(".")
                old = block.mixer.get_buffer(name)
                block.mixer.get_submodule(owner).register_buffer(leaf, buffer.to(old.device, old.dtype),
                                                                 persistent=False)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own state (HybridState), not a transformers Cache

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                state: HybridState | None = None, use_cache: bool | None = None,
                labels: torch.LongTensor | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, **kwargs) -> HybridLightningOutput:
        """input_ids: (B, T) (or ``inputs_embeds`` (B, T, D)) -> logits (B, T, vocab). With ``use_cache`` (or a
        ``state``), ``input_ids`` continue the tokens ``state`` has seen and the returned ``state`` holds them all.
        ``output_attentions``, ``output_hidden_states`` and ``inputs_embeds`` take one forward without a state."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("hybrid-lightning models take unpadded batches only (attention_mask all ones); "
                             "run batches of equal-length inputs or batch size 1")
        observing = bool(output_attentions or output_hidden_states) or inputs_embeds is not None
        if observing and (state is not None or use_cache):
            raise ValueError("output_attentions, output_hidden_states and inputs_embeds run without a cache: pass "
                             "use_cache=False and no state")
        if use_cache is None:
            use_cache = self.config.use_cache and not observing
        if state is None and use_cache:
            state = HybridState(self.model.new_states())
        seen = None
        if observing:
            seen = observe(self.model, input_ids, inputs_embeds, hidden_states=bool(output_hidden_states),
                           rows=(input_ids if inputs_embeds is None else inputs_embeds).shape[1]
                           if output_attentions else None)
            logits = seen.logits
        else:
            logits = self.model(input_ids, None if state is None else state.layers)  # (B, T, vocab)
        if state is not None:
            state.seen += input_ids.shape[1]
        loss = None
        if labels is not None:  # position t predicts labels[:, t + 1]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return HybridLightningOutput(loss=loss, logits=logits, state=state,
                                     hidden_states=seen and seen.hidden_states, attentions=seen and seen.attentions)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, state: HybridState | None = None,
                                      attention_mask: torch.Tensor | None = None, use_cache: bool | None = None,
                                      **kwargs) -> dict:
        """With a state, only the tokens it has not seen go in (one per step after the prompt)."""
        if state is not None:
            input_ids = input_ids[:, state.seen :]
        return {"input_ids": input_ids, "state": state, "attention_mask": attention_mask, "use_cache": use_cache}

    def _update_model_kwargs_for_generation(self, outputs: HybridLightningOutput, model_kwargs: dict, *args,
                                            **kwargs) -> dict:
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        model_kwargs["state"] = outputs.state
        return model_kwargs
