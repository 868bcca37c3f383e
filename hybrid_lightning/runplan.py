"""The run plan: every fact that follows from a run's validated config, resolved once (``hybrid_lightning.plan``)
and recorded as ``plan.json`` beside ``config.yaml``. Training, ``grid plan``, ``--dry-run``, export and
analysis read it; none of them works a fact out again.

    plan.layers        one LayerPlan per layer: mixer, window, positional encoding, SwiGLU width, the
                       mixer's options and the block's parameters
    plan.params        embedding, non-embedding and total parameters
    plan.budget        sequence length, micro-batch, accumulation, processes, steps; tokens per step
    plan.flops_per_token, plan.precision, plan.memory, plan.match, plan.probes
    plan.kernels       the fast paths it takes (attention kernel per attention mixer, recurrent backend, compile)
                       and what fell back, resolved on the machine that trains it (plan/kernels.py)

Plain data (neither torch nor pydantic), so that analysis reads it without the model. A run written before
plans were recorded gets its plan rebuilt from its config.yaml on read (``rundir.legacy``, ``rebuilt``
true): layers, parameters and budget only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hybrid_lightning.kinds import FULL, KINDS, LayerSpec, canonical_pattern, spec_from_dict
from hybrid_lightning.kinds.headwise import FULL_HEAD

PLAN_VERSION = 2  # plan.json's layout; a newer file is refused with a message, an older one read as it was written
# How a run numbers its steps (TensorBoard, eval/step_<k>.json, heads_step_<k>.json, the console, checkpoints): from
# plan version 2 a step is the optimizer steps completed when it is recorded; runs written before (plan version 1, or no
# plan.json: a rebuilt plan) recorded evaluations and TensorBoard scalars at the 0-based index of the step's last
# batch, one less (their checkpoints and console already counted steps completed).
STEPS_COMPLETED, STEPS_INDEXED = "completed", "index"
# The config keys whose meaning the plan holds (``RunPlan.layout``), each set only where it applies.
LAYOUT_KEYS = ("model.pattern", "model.mixer", "model.window", "model.pos.full", "model.pos.efficient")
GIB = 2**30


def gib(n: int) -> str:
    """Bytes as MiB below 1 GiB, else GiB."""
    if n < GIB:
        return f"{n / 2**20:.3g} MiB"
    return f"{n / GIB:.3g} GiB" if n < 1000 * GIB else f"{n / GIB:,.0f} GiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device at the peak of a training step (``plan.memory.estimate_memory`` makes it)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for the backward, every block's kept
    checkpointed: int  # the same with activation checkpointing
    transient: int  # the logits' gradient
    checkpointing: bool  # the run's train.activation_checkpointing

    def peak(self, checkpointing: bool | None = None) -> int:
        """The peak with the run's checkpointing setting, or with the one given."""
        on = self.checkpointing if checkpointing is None else checkpointing
        return (self.weights + self.gradients + self.optimizer + self.transient
                + (self.checkpointed if on else self.activations))

    def describe(self) -> str:
        other = "with" if not self.checkpointing else "without"
        return (f"{gib(self.peak())} per device (weights {gib(self.weights)}, gradients {gib(self.gradients)}, "
                f"optimizer {gib(self.optimizer)}, activations "
                f"{gib(self.peak() - self.weights - self.gradients - self.optimizer)}; "
                f"{gib(self.peak(not self.checkpointing))} {other} train.activation_checkpointing)")


@dataclass(frozen=True)
class Kernels:
    """The fast paths of a run, resolved before it trains (``plan.kernels.resolve_kernels``): ``attention`` maps
    each attention mixer of the model to the kernel its layers take, ``recurrent`` is the recurrent layers'
    backend (None without such layers), ``compile`` is ``train.compile``, ``notes`` say what fell back or stays
    slow and why."""

    device: str  # "cuda" | "cpu"
    attention: dict[str, str] = field(default_factory=dict)
    recurrent: str | None = None
    compile: bool = False
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``kernels on cpu: attention sdpa (full), blocked (swa); recurrent chunked; compile off``, a line per note."""
        parts = [f"attention {', '.join(f'{b} ({m})' for m, b in self.attention.items())}"] if self.attention else []
        parts += [f"recurrent {self.recurrent}"] if self.recurrent else []
        parts.append(f"compile {'on' if self.compile else 'off'}")
        return f"kernels on {self.device}: " + "; ".join(parts) + "".join(f"\n  note: {n}" for n in self.notes)


@dataclass(frozen=True)
class LayerPlan:
    """One layer: ``options`` are its mixer's options (``kinds`` options class of ``mixer``) and ``params``
    the block's parameters (mixer, SwiGLU, norms); both None in a rebuilt plan."""

    index: int
    mixer: str
    window: int | None  # attention window in tokens, current token included; None = unbounded or not attention
    pos: str | None  # rope | nope for attention layers; None for mixers without positions
    mlp_hidden: int | None = None
    options: Mapping | None = None
    params: Mapping | None = None  # mixer, mlp, norm, total

    @property
    def letter(self) -> str:
        return KINDS[self.mixer].letter if self.mixer in KINDS else "?"

    def spec(self) -> LayerSpec:
        """The layer as the model builds it (a ``ValueError`` for a rebuilt plan, which holds no options)."""
        if self.options is None:
            raise ValueError("a plan rebuilt from an older run's config.yaml holds no layer options; plan the run "
                             "from its config (plan.resolve.make_plan)")
        return spec_from_dict({**dataclasses.asdict(self), "options": dict(self.options)})


@dataclass(frozen=True)
class Budget:
    """What a run trains on: ``batch_size`` sequences of ``seq_len`` tokens per process and forward,
    ``accumulate`` forwards per optimizer step, ``world_size`` processes, ``max_steps`` optimizer steps."""

    seq_len: int
    batch_size: int
    accumulate: int
    world_size: int
    max_steps: int

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens of one forward of one process (the micro-batch)."""
        return self.batch_size * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        """Training tokens of one optimizer step over all processes."""
        return self.micro_batch_tokens * self.world_size * self.accumulate

    def tokens_at(self, step: int) -> int:
        """Training tokens consumed after ``step`` optimizer steps."""
        return step * self.tokens_per_step

    @property
    def tokens(self) -> int:
        return self.tokens_at(self.max_steps)


def budget_steps(tokens_per_param: float, non_embedding: int, tokens_per_step: int) -> int:
    """Optimizer steps for ``train.tokens_per_param`` x the non-embedding parameters, rounded up."""
    return max(1, math.ceil(tokens_per_param * non_embedding / tokens_per_step))


@dataclass(frozen=True)
class RunPlan:
    """Args:
        layers: the layer plan.
        budget: tokens and steps.
        model: the numbers the whole model shares (``kinds`` ``ModelOptions`` fields); None in a rebuilt plan.
        params: ``embedding``, ``non_embedding``, ``total``.
        flops_per_token: training FLOPs per token at ``budget.seq_len``, forward and backward.
        precision: the Lightning precision string ``train.precision`` resolved to.
        memory: the estimated peak memory per device (``MemoryEstimate`` fields, bytes).
        match: the parameter match (reference pattern, its count, this model's, the deviation).
        probes: the checked probe settings of ``eval`` and ``eval.heads``.
        kernels: the fast paths (``plan.kernels.Kernels`` fields); None in a rebuilt plan, in a plan made for a GPU on a
            machine without one (``grid plan`` on a login node: training resolves them), or one written before.
        rebuilt: True for a plan rebuilt on read from a run written before plans were recorded.
        version: the layout of plan.json it was read from (``PLAN_VERSION`` when made here).
        step_numbering: how the run numbers its recorded steps (``STEPS_COMPLETED``, ``STEPS_INDEXED``).
    """

    layers: tuple[LayerPlan, ...]
    budget: Budget
    model: Mapping | None = None
    params: Mapping | None = None
    flops_per_token: float | None = None
    precision: str | None = None
    memory: Mapping | None = None
    match: Mapping | None = None
    probes: Mapping | None = None
    kernels: Mapping | None = None
    rebuilt: bool = False
    version: int = PLAN_VERSION
    step_numbering: str = STEPS_COMPLETED  # STEPS_INDEXED for a run written before version 2 (rundir.legacy)

    @property
    def step_offset(self) -> int:
        """What turns a step this run recorded into the optimizer steps completed by then: 0, or 1 for a run that
        numbered its records by index (``STEPS_INDEXED``)."""
        return 0 if self.step_numbering == STEPS_COMPLETED else 1

    def tokens_at_recorded(self, step: int) -> int:
        """Training tokens consumed by the step this run recorded as ``step``."""
        return self.budget.tokens_at(step + self.step_offset)

    @property
    def memory_estimate(self) -> MemoryEstimate:
        return MemoryEstimate(**self.memory)

    def describe_kernels(self) -> str:
        """``Kernels.describe`` of the plan's fast paths, or why it holds none."""
        if self.kernels is None:
            return "kernels: resolved on the machine that trains the run"
        return Kernels(**{**self.kernels, "notes": tuple(self.kernels["notes"])}).describe()

    @property
    def mixers(self) -> list[str]:
        """The efficient (non-full) mixers, in order of first use."""
        return list(dict.fromkeys(layer.mixer for layer in self.layers if layer.mixer != FULL))

    @property
    def pattern(self) -> str:
        """The plan's pattern however the config spelled it (``kinds.canonical_pattern``): one architecture, one
        pattern."""
        return canonical_pattern([layer.mixer for layer in self.layers])

    @property
    def windows(self) -> list[int]:
        """The windows of the windowed layers, sorted."""
        return sorted({layer.window for layer in self.layers if layer.window is not None})

    @property
    def window(self) -> int | None:
        """The largest window (None without windowed layers)."""
        return max(self.windows, default=None)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(layer.index for layer in self.layers if layer.mixer == FULL)

    @property
    def full_head_layers(self) -> tuple[int, ...]:
        """The layers with a head that attends fully: the full layers and the head-wise layers with a full head."""
        return tuple(layer.index for layer in self.layers
                     if layer.mixer == FULL or FULL_HEAD in (layer.options or {}).get("heads", ""))

    @property
    def windowed_hybrid(self) -> bool:
        """Full-attention layers beside efficient ones that all attend within a window (an SWA hybrid)."""
        efficient = [layer for layer in self.layers if layer.mixer != FULL]
        return bool(self.full_layers) and bool(efficient) and all(layer.window is not None for layer in efficient)

    def position(self, full: bool) -> str | None:
        """The positional encoding of the full layers (``full``) or of the efficient layers that take one;
        None where the plan has no such layer (several encodings: joined by ``+``)."""
        found = dict.fromkeys(layer.pos for layer in self.layers
                              if (layer.mixer == FULL) == full and layer.pos is not None)
        return "+".join(found) or None

    def layout(self) -> dict:
        """``LAYOUT_KEYS`` as the plan has them, each only where it applies: the pattern (``pattern``), the efficient
        mixers (``+``-joined), the window of windowed layers, the positional encoding of full layers and of
        efficient layers that take one. Analysis tells architectures apart by them, HParams shows them."""
        values = dict(zip(LAYOUT_KEYS, (self.pattern, "+".join(self.mixers) or None, self.window, self.position(True),
                                        self.position(False))))
        return {k: v for k, v in values.items() if v is not None}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_from_dict(data: Mapping, source: str = "plan.json") -> RunPlan:
    """The ``RunPlan`` of ``RunPlan.as_dict`` (plan.json); a ``ValueError`` naming ``source`` for a file of a
    newer layout or one that does not read as a plan."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: not a run plan (a JSON object); the file is damaged")
    version = data.get("version")
    if not isinstance(version, int) or version > PLAN_VERSION:
        raise ValueError(f"{source}: plan version {version!r}; this package reads versions up to {PLAN_VERSION} "
                         "(a newer hybrid-lightning wrote it)")
    try:
        layers = tuple(LayerPlan(**layer) for layer in data["layers"])
        return RunPlan(**{**data, "layers": layers, "budget": Budget(**data["budget"])})
    except (KeyError, TypeError) as e:
        raise ValueError(f"{source}: not a run plan of version {version} ({e}); the file is damaged") from None


def plan_differences(made: Mapping, recorded: Mapping) -> dict[str, tuple]:
    """Dotted key (``budget.max_steps``, ``layers.3.params.total``) -> (value in ``made``, value in ``recorded``),
    sorted, for every leaf where two plans as plain data (``RunPlan.as_dict``) differ; a missing leaf is None."""
    a, b = dict(_leaves(made)), dict(_leaves(recorded))
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k, _MISSING) != b.get(k, _MISSING)}


_MISSING = object()


def _leaves(data, prefix: str = ""):
    """(dotted key, value) of every leaf of nested mappings and lists; tuples read as lists (JSON has no tuples)."""
    if isinstance(data, Mapping):
        items = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        yield prefix, data
        return
    for key, value in items:
        yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
