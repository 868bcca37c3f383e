"""What every mixer definition is made of (plain Python, neither torch nor pydantic): the row that says what
a mixer *is* (``MixerKind``), the options every mixer reads (``MixerOptions`` and its families), the numbers the
whole model shares (``ModelOptions``), ``setting``, one user-facing key of a mixer's ``model:`` section, and the
registry (``KINDS``, ``register``) with the lazy loading of the classes a definition names by dotted string."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

PACKAGE = "hybrid_lightning"


def flat_name(module: str) -> str:
    """``hybrid_lightning.model.mixers.attention`` -> ``hl_mixers_attention``: the name of a module's copy in an
    exported folder (transformers loads remote code from one flat folder: relative imports of sibling files only)."""
    return "hl_" + module.removeprefix(PACKAGE + ".").removeprefix("model.").replace(".", "_")


def load(ref: str) -> Any:
    """The object a dotted reference names (``package.module.Name``), its module imported on first use: the
    module itself in the package, its flat copy beside this file in an exported folder (export/source.py)."""
    module, _, name = ref.rpartition(".")
    if __name__.startswith(PACKAGE + "."):
        return getattr(importlib.import_module(module), name)
    return getattr(importlib.import_module("." + flat_name(module), __package__), name)


def setting(default: Any, doc: str, **bounds: float) -> Any:
    """A field of a kind's settings dataclass (its ``model.<name>`` config section): its default, its line in
    docs/configuration.md and its bounds (``ge``, ``gt``), which the config schema enforces."""
    return dataclasses.field(default=default, metadata={"doc": doc, **bounds})


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
    """What every mixer gets; a kind without an options class of its own gets just this."""

    d_model: int
    norm_eps: float


@dataclass(frozen=True)
class RecurrentOptions(MixerOptions):
    """What the recurrent mixers share: the backend (``model.recurrent_backend``) and its chunk length."""

    backend: str
    chunk: int


@dataclass(frozen=True)
class HeadsSettings:
    """Heads of a recurrent mixer; left open (null), they are the model's (``ModelConfig.heads``)."""

    n_heads: int | None = setting(None, "null = model.n_heads", ge=1)
    head_dim: int | None = setting(None, "(query/key) width per head; null = model's head_dim", ge=1)

    def check(self, model: Any) -> None:
        """Constraints that involve the model's other settings (``model``: the validated ``model:`` section);
        a ``ValueError`` naming the key."""


@dataclass(frozen=True)
class MixerKind:
    """What a mixer *is*: everything the package knows of it, in one definition (``register`` it).

    Args:
        name: its name in configs (``model.mixer``) and in layer plans.
        letter: its letter in ``model.pattern``.
        module: its ``nn.Module`` class by dotted name (``package.module.Class``), imported where a model is built
            (``load``): the class takes ``(options, spec)`` (the contract in ``model/mixers/__init__.py``).
        attention: softmax attention (its cost grows with the keys it sees).
        has_window: attends to the last ``model.window`` tokens only.
        uses_position: takes a positional encoding (``model.pos.full`` / ``model.pos.efficient``).
        options: the class of the options its module reads (``MixerOptions`` or a subclass).
        settings: the dataclass of its ``model.<name>`` config section (its user-facing keys, ``setting``
            fields, and a ``check(model)``), or None for a kind without one.
        title: how reports name it.
        definition: the module holding this definition, when it is not the class's (an export copies both).
        operators: the modules of its sequence operators (``model/ops/``) that its class imports; an export copies
            them.
        cpu_bf16_speedup: ``(d_model, fp32 step time / bf16-autocast step time)`` pairs of a CPU training step of
            its 3 : 1 hybrid (full attention's: the all-full model), one thread, measured by bench section (c)
            (analysis/results/bench/training.json; tests/test_perf.py checks the two agree). ``train.precision:
            auto`` on CPU reads them (plan/precision.py); a mixer without them trains in fp32 there, saying so.
    """

    name: str
    letter: str
    module: str
    attention: bool = False
    has_window: bool = False
    uses_position: bool = False
    options: type[MixerOptions] = MixerOptions
    settings: type | None = None
    title: str = ""
    definition: str | None = None
    operators: tuple[str, ...] = ()
    cpu_bf16_speedup: tuple[tuple[int, float], ...] = ()

    @property
    def section(self) -> str | None:
        """The ``model:`` section holding its settings (``model.<name>``), if it has one."""
        return self.name if self.settings is not None else None

    def mixer_class(self) -> type:
        """Its ``nn.Module`` class (``module``, imported now: it needs torch)."""
        return load(self.module)

    @property
    def recurrent(self) -> bool:
        """Whether it runs on ``model.recurrent_backend`` (its options are ``RecurrentOptions``)."""
        return issubclass(self.options, RecurrentOptions)

    @property
    def sources(self) -> tuple[str, ...]:
        """The modules an export copies for it: its definition, its class's module and its operators."""
        module = self.module.rpartition(".")[0]
        return tuple(dict.fromkeys((self.definition or module, module, *self.operators)))


EFFICIENT_LETTER = "E"  # the pattern letter that stands for model.mixer
KINDS: dict[str, MixerKind] = {}  # the registry: name -> definition, in order of registration


def register(kind: MixerKind) -> MixerKind:
    """Adds a mixer to the registry (once per name; the same definition again is a no-op) and returns it: a
    definition file registers its mixers when imported, ``kinds/__init__.py`` imports the package's own, and a
    mixer defined elsewhere (a test, a user's module) is registered by importing its definition. A ``ValueError``
    for a name or letter that another mixer holds."""
    if KINDS.get(kind.name) == kind:
        return kind
    taken = {k.letter: k.name for k in KINDS.values()} | {EFFICIENT_LETTER: "model.mixer"}
    if kind.name in KINDS or kind.letter in taken:
        clash = f"name {kind.name!r}" if kind.name in KINDS else f"letter {kind.letter!r} (of {taken[kind.letter]})"
        raise ValueError(f"mixer {kind.name!r}: its {clash} is already registered; choose another")
    if len(kind.letter) != 1 or not kind.letter.isupper():
        raise ValueError(f"mixer {kind.name!r}: its letter must be one capital letter, not {kind.letter!r}")
    KINDS[kind.name] = kind
    return kind
