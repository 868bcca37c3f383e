"""What a forward of a ``HybridLM`` shows besides its logits: each block's output (the residual stream) and each
attention layer's softmax probabilities, as ``transformers`` models return them with ``output_hidden_states`` and
``output_attentions``. The export's wrapper and the head measurements (heads/mass.py, heads/tracing.py) read them
here; an exported folder carries this file.

The probabilities are the mixer's own: its projections (``Attention.project``: QK-norm, RoPE) and
``attention_probs`` with its window, the scores and softmax in at least fp32. Asking for the last ``rows`` queries
only costs B x H x rows x T per layer instead of T x T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid_lightning.model.attention import attention_probs
from hybrid_lightning.model.mixers.attention import Attention


def attention_layers(model) -> list[tuple[int, Attention]]:
    """(layer index, mixer) of every attention layer (full, sliding-window or head-wise) of a ``HybridLM``."""
    return [(i, block.mixer) for i, block in enumerate(model.layers) if isinstance(block.mixer, Attention)]


@dataclass
class Observed:
    logits: torch.Tensor  # (B, T, vocab)
    hidden_states: tuple[torch.Tensor, ...] | None  # the embeddings, then each block's output (n_layers + 1)
    attentions: tuple[torch.Tensor | None, ...] | None  # per layer (B, H, rows, T) probabilities; None: not attention


def observe(model, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
            rows: int | None = None, hidden_states: bool = False) -> Observed:
    """One forward of ``model`` (a ``HybridLM``) from position 0, without state, from ``input_ids`` (B, T) or
    ``inputs_embeds`` (B, T, D) (exactly one of them). ``rows``: also the attention probabilities of the last
    ``rows`` queries (``rows`` = T: the whole causal map) of every attention layer, None for the other layers;
    None: no attentions. ``hidden_states``: also the embeddings and every block's output."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids and inputs_embeds")
    x = model.embed(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
    hidden, maps = [x], []
    for block in model.layers:
        if rows is not None:
            maps.append(query_probs(block.mixer, block.mixer_norm(x), rows)
                        if isinstance(block.mixer, Attention) else None)
        x = block(x)
        hidden.append(x)
    logits = model.lm_head(model.norm(x))
    return Observed(logits, tuple(hidden) if hidden_states else None, tuple(maps) if rows is not None else None)


def query_probs(mixer: Attention, h: torch.Tensor, rows: int) -> torch.Tensor:
    """The attention probabilities (B, H, rows, T) of ``mixer``'s last ``rows`` queries over every key, from its
    input ``h`` (B, T, D) (after the block's norm), the keys masked outside the causal window as the mixer masks
    them (each head within its own window in a head-wise layer)."""
    q, k, _ = mixer.project(h, 0)  # (B, H, T, Dh), (B, Hkv, T, Dh)
    if mixer.uniform_heads is not None:  # a head ablation in force (heads/ablation.py): as the mixer's forward
        q = q.masked_fill(mixer.uniform_heads.to(q.device).view(1, -1, 1, 1), 0.0)
    q = q[:, :, q.shape[2] - rows:]
    windows = mixer.reaches()
    if len(set(windows)) == 1:
        return attention_probs(q, k, windows[0])
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, T, Dh): each query head's key head
    return torch.cat([attention_probs(q[:, h : h + 1], k[:, h : h + 1], w) for h, w in enumerate(windows)], dim=1)
