"""The one count of a model's parameters and training FLOPs per token: over the distinct layers of its plan
(each layer's spec, its index aside), one block of each built on the meta device (no weights allocated),
times the layers it stands for, plus the model's ends (embedding, final norm, head). The time does not
grow with ``model.n_layers``. The run plan records these counts; parameter matching, the memory estimate,
``params`` and the throughput logged in training read them from here."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass

import torch

from hybrid_lightning.kinds import LayerSpec, ModelOptions
from hybrid_lightning.model import Block, HybridLM, block_flops_per_token, matmul_weights


@dataclass(frozen=True)
class Counts:
    """Parameters per layer (``mixer``, ``mlp``, ``norm``, ``total``, in plan order) and of the whole model."""

    layers: tuple[dict, ...]
    embedding: int  # the input embedding and an untied output head
    ends: int  # the final norm
    flops: dict[int, float]  # sequence length -> training FLOPs per token

    @property
    def non_embedding(self) -> int:
        return sum(layer["total"] for layer in self.layers) + self.ends

    @property
    def total(self) -> int:
        return self.embedding + self.non_embedding

    def totals(self) -> dict[str, int]:
        return {"embedding": self.embedding, "non_embedding": self.non_embedding, "total": self.total}


def distinct(specs: tuple[LayerSpec, ...]) -> Counter[LayerSpec]:
    """The layers of a plan, their index aside, with how many layers each stands for: what a count summed over
    layers (parameters, FLOPs, activations) needs, whatever ``model.n_layers``."""
    return Counter(dataclasses.replace(spec, index=0) for spec in specs)


@functools.lru_cache(maxsize=256)
def meta_block(opts: ModelOptions, spec: LayerSpec) -> Block:
    """One block of ``spec`` on the meta device (shapes only)."""
    with torch.device("meta"):
        return Block(opts, spec)


@functools.lru_cache(maxsize=64)
def _ends(opts: ModelOptions) -> tuple[int, int, int]:
    """(embedding parameters, final-norm parameters, head matmul weights) of a model of ``opts``."""
    with torch.device("meta"):
        bare = HybridLM(opts, ())
    tied = bare.lm_head.weight is bare.embed.weight
    embedding = bare.embed.weight.numel() + (0 if tied else bare.lm_head.weight.numel())
    return embedding, sum(p.numel() for p in bare.norm.parameters()), matmul_weights(bare)


def block_params(block: Block) -> dict[str, int]:
    """A block's parameters: mixer, mlp (SwiGLU), norm (its two RMSNorms), total."""
    mixer = sum(p.numel() for p in block.mixer.parameters())
    mlp = sum(p.numel() for p in block.mlp.parameters())
    norm = sum(p.numel() for p in (*block.mixer_norm.parameters(), *block.mlp_norm.parameters()))
    return {"mixer": mixer, "mlp": mlp, "norm": norm, "total": mixer + mlp + norm}


def count(opts: ModelOptions, specs: tuple[LayerSpec, ...], lengths: tuple[int, ...] = ()) -> Counts:
    """The parameters of the model ``opts``, ``specs`` and its training FLOPs per token at each of ``lengths``."""
    kinds = distinct(specs)
    per_kind = {spec: block_params(meta_block(opts, spec)) for spec in kinds}
    embedding, ends, head = _ends(opts)
    flops = {T: 6.0 * head + sum(n * block_flops_per_token(meta_block(opts, spec), T) for spec, n in kinds.items())
             for T in lengths}
    return Counts(tuple(per_kind[dataclasses.replace(s, index=0)] for s in specs), embedding, ends, flops)


def count_params(model: HybridLM) -> dict:
    """The counts of a built model (``count`` of its options and layers): ``embedding``, ``non_embedding``,
    ``total`` and per layer its index, mixer, window, positional encoding and ``params`` (its mixer, MLP, norms and
    total, as ``plan.json``'s layers hold them)."""
    counts = count(model.opts, model.plan)
    layers = [{"layer": s.index, "mixer": s.mixer, "letter": s.letter, "window": s.window, "pos": s.pos, "params": p}
              for s, p in zip(model.plan, counts.layers)]
    return {**counts.totals(), "layers": layers}
