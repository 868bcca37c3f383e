"""The hybrid language model: a plain ``nn.Module`` built from the per-layer plan."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hybrid_lightning.kinds import KINDS, LayerSpec, ModelOptions
from hybrid_lightning.model.documents import by_document


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w2.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, opts: ModelOptions, spec: LayerSpec):
        super().__init__()
        self.spec = spec
        self.mixer_norm = nn.RMSNorm(opts.d_model, eps=opts.norm_eps)
        self.mixer = KINDS[spec.mixer].mixer_class()(spec.options, spec)
        self.mlp_norm = nn.RMSNorm(opts.d_model, eps=opts.norm_eps)
        self.mlp = SwiGLU(opts.d_model, spec.mlp_hidden)

    def forward(self, x: torch.Tensor, state: dict | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D); ``doc_ids`` (B, T) or None (one document per row). A mixer that masks documents
        itself (``masks_documents``) takes them; any other runs on each document alone (``by_document``)."""
        h = self.mixer_norm(x)
        if doc_ids is None:
            h = self.mixer(h, state)
        elif getattr(self.mixer, "masks_documents", False):
            h = self.mixer(h, state, doc_ids)
        else:
            h = by_document(self.mixer, h, doc_ids)
        x = x + h
        return x + self.mlp(self.mlp_norm(x))


class HybridLM(nn.Module):
    """``forward(input_ids (B, T)) -> logits (B, T, vocab)``.

    For incremental inference pass ``states=model.new_states()`` and keep passing the same
    list: each layer carries its KV cache or recurrent state from one call to the next.

    ``doc_ids`` (B, T) integers (equal values = one contiguous document; None = one document per row)
    make a packed row behave exactly as its documents run one by one. ``activation_checkpointing``
    (set by training) recomputes each block's activations in the backward instead of keeping them.

    Args:
        opts: the numbers the whole model shares (``plan.layers.model_options`` of the ``model:`` section).
        plan: the layers, each with its mixer's options (``plan.layers.layer_plan``; ``build_model`` passes the run
            plan's layers, the non-full widths of a parameter-matched model solved).
    """

    def __init__(self, opts: ModelOptions, plan: tuple[LayerSpec, ...]):
        super().__init__()
        self.opts = opts
        self.plan = plan
        self.embed = nn.Embedding(opts.vocab_size, opts.d_model)
        self.layers = nn.ModuleList(Block(opts, spec) for spec in self.plan)
        self.norm = nn.RMSNorm(opts.d_model, eps=opts.norm_eps)
        self.lm_head = nn.Linear(opts.d_model, opts.vocab_size, bias=False)
        self._init_weights()
        if opts.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.activation_checkpointing = False

    def _init_weights(self) -> None:
        # N(0, init_std) for every linear and embedding matrix; residual output projections
        # scaled by 1/sqrt(2 n_layers) (GPT-2). Mixers initialise their own special parameters.
        resid_std = self.opts.init_std / math.sqrt(2 * self.opts.n_layers)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)) and not getattr(m, "custom_init", False):
                nn.init.normal_(m.weight, std=resid_std if getattr(m, "residual_out", False) else self.opts.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def new_states(self) -> list[dict]:
        return [{} for _ in self.layers]

    def forward(
        self, input_ids: torch.Tensor, states: list[dict] | None = None, doc_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids: (B, T), doc_ids: (B, T) or None -> logits (B, T, vocab)."""
        if doc_ids is not None and states is not None:
            raise ValueError("doc_ids apply to a forward from position 0 without states")
        x = self.embed(input_ids)  # (B, T, D)
        recompute = self.activation_checkpointing and states is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if recompute:  # non-reentrant: the saved tensors of each block are recomputed in its backward
                x = checkpoint(layer, x, None, doc_ids, use_reentrant=False)
            else:
                x = layer(x, None if states is None else states[i], doc_ids)
        return self.lm_head(self.norm(x))
