"""Peak memory per device of a training run, estimated before anything is allocated.

    peak = weights + gradients + optimizer state + activations + the logits' gradient

Weights, gradients and AdamW's two moments are fp32, 4 bytes per parameter each (mixed precision keeps
fp32 master weights). Activations are what autograd saves for the backward at the run's micro-batch
(``train.batch_size`` x ``train.seq_len``; accumulation does not add to them): counted, not modelled, by
running one block of each kind of layer the plan holds, and the embedding and loss, on fake tensors
(``torch._subclasses.FakeTensorMode``: shapes and dtypes, no storage) under the run's autocast, and
summing the bytes of every tensor saved, each storage once and parameters left out. With activation
checkpointing a block keeps only its input, and one block's activations exist again while it is
recomputed. The logits' gradient (B, T, vocab) in fp32 is the largest transient of the backward.
Saved bytes are affine in T (every path keeps O(T) tensors), so beyond ``MEASURED_LENGTH`` tokens
they are counted at two lengths and extended along that line: the time stays flat in T.

What it is: the CPU paths' memory (``blocked`` and SDPA attention keep q, k, v, the output and the
log-sum-exp, as flash-attn and FlexAttention do; recurrent mixers count their ``chunked`` form, an upper
bound for fla's kernels); one device, no sharding (``fsdp`` divides weights, gradients and optimizer
state by the devices); no allocator fragmentation or CUDA context (about 0.5-1 GiB on a GPU).
Checked against measured peaks on CPU in ``tests/test_memory.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from hybrid_lightning.kinds import LayerSpec, ModelOptions
from hybrid_lightning.model import Block
from hybrid_lightning.plan.precision import autocast_dtype
from hybrid_lightning.runplan import MemoryEstimate, RunPlan, gib

FP32 = 4
MEASURED_LENGTH = 4096  # tokens up to which activations are counted at the run's own length


def estimate_memory(plan: RunPlan, checkpointing: bool) -> MemoryEstimate:
    """The estimate for the run planned as ``plan`` (its layers, model options, parameters, precision and budget,
    as ``resolve.make_plan`` made them; the memory estimate it may hold is not read) with activation checkpointing
    on or off (``checkpointing``: the run's ``train.activation_checkpointing``), in time independent of the
    number of layers."""
    kinds, opts, b = _distinct_layers(plan), ModelOptions(**plan.model), plan.budget
    params, dtype = plan.params["total"], autocast_dtype(plan.precision)
    window = plan.window or 0
    blocks = {spec: _along_t(functools.partial(_block_activations, opts, spec), window, b.batch_size, b.seq_len, dtype)
              for spec in kinds}
    ends = _along_t(functools.partial(_ends_activations, opts), window, b.batch_size, b.seq_len, dtype)
    tokens = b.micro_batch_tokens  # one device's micro-batch: the tokens a forward holds
    inputs = sum(kinds.values()) * tokens * opts.d_model * FP32  # the residual stream, fp32
    return MemoryEstimate(
        weights=FP32 * params, gradients=FP32 * params, optimizer=2 * FP32 * params,
        activations=ends + sum(n * blocks[spec] for spec, n in kinds.items()),
        checkpointed=ends + inputs + max(blocks.values()),
        transient=tokens * opts.vocab_size * FP32, checkpointing=checkpointing,
    )


def _distinct_layers(plan: RunPlan) -> Counter[LayerSpec]:
    """The plan's layers, their index aside, with how many layers each stands for (as ``count.distinct``), each
    distinct layer's spec built once: in time independent of the number of layers."""
    found: Counter[LayerSpec] = Counter()
    built: dict[tuple, LayerSpec] = {}
    for layer in plan.layers:
        key = (layer.mixer, layer.window, layer.pos, layer.mlp_hidden, repr(sorted(layer.options.items())))
        if key not in built:
            built[key] = dataclasses.replace(layer.spec(), index=0)
        found[built[key]] += 1
    return found


def fitting_setting(plan: RunPlan, capacity: int) -> dict[str, Any] | None:
    """The ``train`` settings under which the run planned as ``plan`` (its budget and memory estimate) peaks within
    ``capacity`` bytes per device, its tokens per step kept: ``{}`` where it fits as it is; else activation
    checkpointing; else the largest micro-batch that fits (``train.batch_size`` a divisor of the run's,
    ``train.accumulate_grad_batches`` raised in proportion), without checkpointing and then with it; None where
    none of these fits."""
    estimate = plan.memory_estimate
    if estimate.peak() <= capacity:
        return {}
    on = {"train.activation_checkpointing": True}
    if estimate.peak(True) <= capacity:
        return on
    b = plan.budget
    for batch in (n for n in range(b.batch_size - 1, 0, -1) if b.batch_size % n == 0):
        accumulate = b.accumulate * b.batch_size // batch
        smaller = dataclasses.replace(plan, budget=dataclasses.replace(b, batch_size=batch, accumulate=accumulate))
        at = estimate_memory(smaller, estimate.checkpointing)
        setting = {"train.batch_size": batch, "train.accumulate_grad_batches": accumulate}
        for checkpointing in dict.fromkeys((estimate.checkpointing, True)):
            if at.peak(checkpointing) <= capacity:
                return setting | (on if checkpointing and not estimate.checkpointing else {})
    return None


def _saved_bytes(run: Callable[[], object], dtype: torch.dtype | None) -> int:
    """Bytes of the tensors autograd saves while ``run`` builds and runs a module on fake tensors, parameters
    left out, each storage once, under autocast to ``dtype`` (None = none)."""
    saved: dict[int, tuple[torch.UntypedStorage, int]] = {}  # the storage kept alive so its id stays unique
    params: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            saved[storage._cdata] = (storage, storage.nbytes())
        return t

    with (FakeTensorMode(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None),
          warnings.catch_warnings()):
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")  # CPU autocast's RMSNorm
        module, inputs = run()
        params.update(p.untyped_storage()._cdata for p in module.parameters())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(*inputs)
    return sum(n for _, n in saved.values())


def _along_t(count: Callable[[int, int, torch.dtype | None], int], window: int, B: int, T: int,
             dtype: torch.dtype | None) -> int:
    """``count(B, T, dtype)``, for a long T from the line through two lengths that hold ``window`` twice over (a
    multiple of every chunk and block size)."""
    short = max(MEASURED_LENGTH // 2, 1024 * -(-2 * (window + 1) // 1024))
    if T <= 2 * short:
        return count(B, T, dtype)
    a, b = count(B, short, dtype), count(B, 2 * short, dtype)
    return b + (b - a) * (T - 2 * short) // short


# Cached by what the count depends on (a block's options, not the whole config): a grid's cells share blocks.
@functools.lru_cache(maxsize=256)
def _block_activations(opts: ModelOptions, spec: LayerSpec, B: int, T: int, dtype: torch.dtype | None) -> int:
    """Saved bytes of one block of ``spec`` on a (B, T, d_model) fp32 input."""
    return _saved_bytes(lambda: (Block(opts, spec), (torch.empty(B, T, opts.d_model, requires_grad=True),)), dtype)


class _Ends(torch.nn.Module):
    """The model's parts outside the blocks, with the training loss: embedding, final norm, head, cross-entropy."""

    def __init__(self, m):
        super().__init__()
        self.embed = torch.nn.Embedding(m.vocab_size, m.d_model)
        self.norm = torch.nn.RMSNorm(m.d_model, eps=m.norm_eps)
        self.head = torch.nn.Linear(m.d_model, m.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(x)).float()  # (B, T, V), as the training system takes them
        return F.cross_entropy(logits.transpose(1, 2), tokens) + self.embed(tokens).sum()


@functools.lru_cache(maxsize=64)
def _ends_activations(m: ModelOptions, B: int, T: int, dtype: torch.dtype | None) -> int:
    def build():
        tokens = torch.zeros(B, T, dtype=torch.long)
        return _Ends(m), (tokens, torch.empty(B, T, m.d_model, requires_grad=True))

    return _saved_bytes(build, dtype)


def machine_memory(cfg: Any) -> tuple[int, str]:
    """(bytes, what they are) that one device of this run has here: the GPU's memory, or on CPU the
    machine's RAM shared by the run's processes (``train.devices``)."""
    t = cfg.train
    if t.accelerator != "cpu" and torch.cuda.is_available():  # Lightning's auto takes the GPU when there is one
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return props.total_memory, f"the {gib(props.total_memory)} of a {props.name}"
    import psutil

    total, processes = psutil.virtual_memory().total, t.devices if isinstance(t.devices, int) else 1
    return total // processes, (f"this machine's {gib(total)} of RAM"
                                + (f" shared by {processes} processes" if processes > 1 else ""))


def check_fits(cfg: Any, estimate: MemoryEstimate) -> None:
    """A ``ValueError`` naming the run's estimated peak memory (its plan's) when it exceeds what a device of this
    machine holds, unless ``train.check_memory`` is off."""
    available, what = machine_memory(cfg)
    if estimate.peak() > available and cfg.train.check_memory:
        hint = "" if cfg.train.activation_checkpointing else ", set train.activation_checkpointing: true"
        raise ValueError(f"the estimated peak memory, {estimate.describe()}, exceeds {what}; lower train.batch_size "
                         f"(raising train.accumulate_grad_batches keeps the step), train.seq_len or the model{hint}, "
                         "or set train.check_memory: false to try anyway")
