"""The run config's schema: typed, frozen sections, each checking its own constraints.

A run config has the sections ``model``, ``data``, ``train`` and ``eval`` plus ``seed`` and
``name``. Every field has a default, so an empty file is a valid config (the embedded default).
Reading YAML, overrides and turning validation errors into one ``ValueError`` live in
``config/loading.py``; the grid file's schema in ``grid/schema.py``.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybrid_lightning.kinds import KINDS, check_pattern, mixer_names, pattern_mixers

PROVENANCE_KEY = "provenance"  # the section train adds to config.yaml (git revision, version, time)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bools_as_numbers(cls, data: Any) -> Any:
        """YAML's true/false are not numbers (``window: true`` would otherwise pass as 1), a
        switch takes true or false only (not 1 or "yes"), and a quoted number is a string, not a
        number (``window: "32"`` is refused, as a grid would otherwise name it apart from 32)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if field is None:
                    continue
                if field.annotation is bool and not isinstance(value, bool):
                    raise ValueError(f"{name} must be true or false, not {json.dumps(value)}")
                if _holds_bool(value) and not _admits_bool(field.annotation):
                    raise ValueError(f"{name} must be {_expected(field.annotation)}, not {json.dumps(value)}")
                strings = [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] \
                    if isinstance(value, (list, tuple)) else []
                if _admits_number(field.annotation) and not all(
                        _admits_string(field.annotation, v, nested=not isinstance(value, str)) for v in strings):
                    raise ValueError(f"{name} takes numbers, not the string {json.dumps(value)}; write it without quotes")
        return data


def _holds_bool(value: Any) -> bool:
    return isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value))


def _admits_bool(annotation: Any) -> bool:
    return annotation is bool or annotation is Any or any(_admits_bool(a) for a in typing.get_args(annotation))


def _admits_number(annotation: Any) -> bool:
    return annotation in (int, float) or any(_admits_number(a) for a in typing.get_args(annotation))


def _admits_string(annotation: Any, value: str, nested: bool) -> bool:
    """Whether the string ``value`` (an element of a list when ``nested``) is a value of ``annotation``
    as written: a str field, or one of a Literal's strings; never a number spelled as a string."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return any(_admits_string(a, value, nested) for a in args)
    if nested:
        return origin in (tuple, list) and any(_admits_string(a, value, False) for a in args if a is not Ellipsis)
    if origin is Literal:
        return value in args
    return annotation in (str, Any) or origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel))


def _expected(annotation: Any) -> str:
    names = {int: "a whole number", float: "a number"}
    return names.get(annotation) or f"a value of type {str(annotation).replace('typing.', '')}"


class PosConfig(_Frozen):
    """Positional encoding per layer type. NoPE applies no rotation at all."""

    full: Literal["rope", "nope"] = "rope"
    efficient: Literal["rope", "nope"] = "rope"


class Mamba2Config(_Frozen):
    """Mamba-2 layers (``M``); defaults of the paper's reference module (Dao & Gu 2024)."""

    expand: int = Field(2, ge=1, description="inner width = expand * d_model")
    head_dim: int = Field(64, ge=1, description="channels per SSM head; must divide expand * d_model")
    d_state: int = Field(128, ge=1, description="SSM state size N")
    conv_size: int = Field(4, ge=1, description="taps of the causal depthwise convolution")

    def check(self, model: ModelConfig) -> None:
        inner = self.expand * model.d_model
        if inner % self.head_dim:
            raise ValueError(f"model.mamba2.head_dim={self.head_dim} must divide model.mamba2.expand * model.d_model = {inner}")


class _HeadsConfig(_Frozen):
    """Heads of a recurrent mixer; ``ModelConfig.heads`` fills what is left open from the model."""

    n_heads: int | None = Field(None, ge=1, description="None = model.n_heads")
    head_dim: int | None = Field(None, ge=1, description="(query/key) width per head; None = model's head_dim")

    def check(self, model: ModelConfig) -> None:
        """Constraints that involve the model's other settings (called for mixers the pattern uses)."""


class GatedDeltaNetConfig(_HeadsConfig):
    """Gated DeltaNet layers (``G``; Yang, Kautz & Hatamizadeh 2025)."""

    expand_v: float = Field(2.0, gt=0, description="value width per head = expand_v * head_dim")
    conv_size: int = Field(4, ge=1, description="taps of the causal depthwise convolution")

    def check(self, model: ModelConfig) -> None:
        key_dim = model.heads(self)[1]
        if key_dim * self.expand_v % 1:
            raise ValueError(
                f"model.gated_deltanet.expand_v={self.expand_v} times the head width {key_dim} must be a whole number"
            )


class LightningConfig(_HeadsConfig):
    """Lightning Attention layers (``L``; Qin et al. 2024, as in MiniMax-01)."""


class ModelConfig(_Frozen):
    """The ``model:`` section; ``build_model`` takes it (or the same keys as a dict)."""

    n_layers: int = Field(4, ge=1)
    d_model: int = Field(128, ge=1)
    n_heads: int = Field(4, ge=1)
    n_kv_heads: int | None = Field(None, ge=1, description="GQA key/value heads; None = n_heads")
    pattern: str = Field("EEEF", description="F = full attention, E = model.mixer, or a mixer letter")
    mixer: str = Field("swa", description="the efficient mixer that E stands for")
    window: int = Field(64, ge=1, description="SWA window, counting the current token")
    pos: PosConfig = Field(default_factory=PosConfig)
    rope_theta: float = Field(10000.0, gt=0)
    vocab_size: int | None = Field(None, ge=2, description="None = the tokenizer's")
    mlp_hidden: int | None = Field(None, ge=1, description="SwiGLU width; None = 8/3 d_model rounded up to 32")
    qk_norm: bool = False
    tie_embeddings: bool = False
    norm_eps: float = Field(1e-5, gt=0)
    init_std: float = Field(0.02, gt=0)
    attn_backend: Literal["auto", "reference", "sdpa", "blocked", "flash", "flex"] = "auto"
    recurrent_backend: Literal["auto", "chunked", "recurrent", "fla"] = Field(
        "auto", description="recurrent mixers: auto = fla on CUDA when installed, else chunked"
    )
    recurrent_chunk: int = Field(64, ge=1, description="steps per chunk of the chunked recurrent backend")
    mamba2: Mamba2Config = Field(default_factory=Mamba2Config)
    gated_deltanet: GatedDeltaNetConfig = Field(default_factory=GatedDeltaNetConfig)
    lightning: LightningConfig = Field(default_factory=LightningConfig)
    efficient_mlp_hidden: int | None = Field(None, ge=1, description="SwiGLU width of the non-full layers; None = mlp_hidden's")
    match_params: str | None = Field(
        None, description="a reference pattern (e.g. F): set the non-full layers' SwiGLU width to match its parameter count"
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.mixer not in mixer_names(efficient_only=True):
            accepted = sorted(mixer_names(efficient_only=True))
            raise ValueError(f"model.mixer: {self.mixer!r} is not one of the accepted mixers {accepted}")
        check_pattern(self.pattern, self.n_layers)
        if self.d_model % self.n_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model.d_model / model.n_heads = {self.d_model // self.n_heads} must be even (RoPE rotates pairs)")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_kv_heads={self.kv_heads} must divide model.n_heads={self.n_heads}")
        for name in self.mixers_used:
            if KINDS[name].options is not None:
                getattr(self, KINDS[name].options).check(self)
        if self.match_params is not None:
            check_pattern(self.match_params, self.n_layers, field="model.match_params")
            if self.efficient_mlp_hidden is not None:
                raise ValueError(
                    "model.match_params sets the non-full layers' SwiGLU width itself; "
                    "leave model.efficient_mlp_hidden unset (null) or drop model.match_params"
                )
        return self

    @property
    def mixers_used(self) -> list[str]:
        """The mixer names this model's pattern expands to, in order of first use."""
        return pattern_mixers(self.pattern, self.mixer)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def heads(self, opts: _HeadsConfig) -> tuple[int, int]:
        """(heads, width per head) of a recurrent mixer's options, open values taken from the model."""
        return opts.n_heads or self.n_heads, opts.head_dim or self.head_dim

    @property
    def mlp_width(self) -> int:
        return self.mlp_hidden or 32 * -(-(8 * self.d_model) // (3 * 32))

    @property
    def efficient_mlp_width(self) -> int:
        """SwiGLU width of the non-full layers before any parameter matching."""
        return self.efficient_mlp_hidden or self.mlp_width


class SyntheticConfig(_Frozen):
    """Retrieval-dense synthetic sequences mixed into training (see data/synthetic.py)."""

    fraction: float = Field(0.5, ge=0, le=1, description="share of training sequences that are synthetic")
    value_chars: tuple[int, int] = Field((6, 24), description="min and max characters of a value")
    queries_per_fact: float = Field(3.0, ge=0, description="mean number of times a fact is queried")
    repeat_template: float = Field(0.5, ge=0, le=1, description="share of queries in their fact's own template")
    repeat_spans: float = Field(1.0, ge=0, description="weight of verbatim repeats of earlier spans (filler and facts weigh 1)")


class DataConfig(_Frozen):
    """The ``data:`` section. No files and no hub name = the embedded corpus."""

    files: tuple[str, ...] = Field((), description="local .txt/.md/.py/.json/.jsonl/.parquet files or globs")
    hub: str | None = Field(None, description="a datasets hub name (needs network)")
    hub_config: str | None = None
    hub_split: str = "train"
    text_field: str = "text"
    tokenizer: str = Field("byte", description="'byte', a tokenizers JSON file or a folder holding tokenizer.json")
    max_tokens: int | None = Field(None, ge=1, description="cap on real-text tokens read")
    min_doc_tokens: int | None = Field(None, ge=1, description="keep only documents of at least this many tokens")
    val_fraction: float = Field(0.02, gt=0, lt=1, description="share of documents held out for validation")
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    cache_dir: str | None = Field(None, description="None = $HYBRID_LIGHTNING_CACHE or ~/.cache/hybrid_lightning")
    store: str | None = Field(None, description="token store folder; None = <cache_dir>/store/<fingerprint>")
    shard_mb: float = Field(32.0, gt=0, description="input text per store shard, in MiB")
    prepare_workers: int | None = Field(None, ge=1, description="processes that tokenize a store; None = the cores, at most 8")
    num_workers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.files and self.hub:
            raise ValueError("data.files and data.hub are exclusive: give one source")
        lo, hi = self.synthetic.value_chars
        if not 1 <= lo <= hi:
            raise ValueError(f"data.synthetic.value_chars must be [min, max] with 1 <= min <= max, got {[lo, hi]}")
        return self


class TrainConfig(_Frozen):
    """The ``train:`` section."""

    max_steps: int = Field(200, ge=1)
    tokens_per_param: float | None = Field(
        None, gt=0, description="token budget as a multiple of the non-embedding parameters (the paper's 100N-1000N); replaces max_steps"
    )
    batch_size: int = Field(16, ge=1, description="sequences per device per step")
    seq_len: int = Field(128, ge=2)
    lr: float = Field(3e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a share of lr")
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_steps: int = Field(20, ge=0)
    decay_fraction: float = Field(0.2, gt=0, le=1, description="WSD: share of steps spent decaying")
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = Field(1.0, gt=0)
    precision: Literal["auto", "32", "bf16-mixed", "16-mixed"] = Field("auto", description="auto = bf16-mixed on GPU, 32 on CPU")
    compile: bool = Field(False, description="torch.compile the model (inductor); minutes of warm-up on a CPU")
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    devices: int | Literal["auto"] = "auto"
    num_nodes: int = Field(1, ge=1)
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    checkpoint_every_n_steps: int = Field(100, ge=1)
    keep_checkpoints: int = Field(5, ge=-1, description="periodic checkpoints kept besides last.ckpt; -1 = all")
    log_every_n_steps: int = Field(10, ge=1)
    val_every_n_steps: int = Field(100, ge=1)
    val_batches: int = Field(8, ge=1)
    progress_bar: bool = True

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        budget_pending = self.tokens_per_param is not None  # max_steps follows from it; checked once resolved
        if self.warmup_steps >= self.max_steps and self.max_steps > 1 and not budget_pending:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} must be below train.max_steps={self.max_steps}")
        if self.devices != "auto" and self.devices < 1:
            raise ValueError(f"train.devices must be at least 1 (or auto), got {self.devices}")
        if self.tokens_per_param is not None and self.devices == "auto":
            raise ValueError("train.tokens_per_param needs train.devices as a number: the tokens of a step depend on it")
        return self


def _check_probes(section: str, tasks: tuple[str, ...], lengths: tuple[int, ...], depths: tuple[float, ...]) -> None:
    """Checks the probe grid of ``section`` (eval or eval.heads); errors name its keys. Task names are
    checked by the evaluation code that owns them (eval/tasks.py ``check_tasks``)."""
    if len(set(tasks)) != len(tasks) or len(set(lengths)) != len(lengths):
        raise ValueError(f"{section}.tasks and {section}.lengths must not repeat an entry")
    if any(n < 2 for n in lengths):
        raise ValueError(f"{section}.lengths must be at least 2 tokens each, got {list(lengths)}")
    if any(not 0 <= d <= 1 for d in depths) or not depths:
        raise ValueError(f"{section}.depths must be between 0 and 1 (and not empty), got {list(depths)}")


class HeadsConfig(_Frozen):
    """The ``eval.heads:`` section: retrieval-head scores (Wu et al. 2024) during training and by
    ``hybrid-lightning heads`` (hybrid_lightning/eval/heads.py). Probes share ``eval.seed``,
    ``eval.batch_size`` and ``eval.chunk_tokens`` with the long-context evaluation."""

    every_n_steps: int = Field(100, ge=0, description="score heads every N optimizer steps; 0 = not at intervals")
    at_end: bool = Field(True, description="score heads when training ends")
    tasks: tuple[str, ...] = Field(("passkey", "niah_single_1"), description="probe tasks")
    lengths: tuple[int, ...] = Field((512, 1024), description="probe lengths in tokens, prompt + answer")
    depths: tuple[float, ...] = Field((0.0, 0.25, 0.5, 0.75, 1.0), description="needle depths")
    samples: int = Field(1, ge=1, description="samples per (task, length, depth)")
    value_tokens: int | None = Field(16, ge=1, description="answers of at least this many tokens; null = the tasks' own values")
    threshold: float = Field(0.1, ge=0, description="a retrieval head scores above this (Wu et al.: 0.1)")
    min_copy_precision: float = Field(0.5, ge=0, le=1, description="copy head: retrieval head with at least this share of its in-span argmaxes on the source token")
    min_in_span: float = Field(0.5, ge=0, le=1, description="locator head: argmax in the answer span on at least this share of answer steps, not a copy head")
    min_answer_accuracy: float | None = Field(None, ge=0, le=1, description="score only samples whose answer tokens are right (teacher-forced) in more than this share; null = all")
    echo: bool = Field(True, description="add echo probes (eval/near.py), one per task, length and sample at the middle depth: a copy source inside small windows")
    selection_seed: int | None = Field(None, description="probe seed of the scores that choose heads to ablate; null = eval.seed + 1 (held out)")

    @model_validator(mode="after")
    def _check(self) -> HeadsConfig:
        _check_probes("eval.heads", self.tasks, self.lengths, self.depths)
        return self


class EvalConfig(_Frozen):
    """The ``eval:`` section: long-context evaluation during training and by ``hybrid-lightning eval``."""

    every_n_steps: int = Field(100, ge=0, description="evaluate every N optimizer steps; 0 = not at intervals")
    at_end: bool = Field(True, description="evaluate when training ends (unless the last step was just evaluated)")
    tasks: tuple[str, ...] = Field(("passkey", "niah_single_1"), description="probe tasks (hybrid_lightning/eval/tasks.py)")
    lengths: tuple[int, ...] = Field((512, 1024), description="probe lengths in tokens, prompt + answer")
    depths: tuple[float, ...] = Field((0.0, 0.5, 1.0), description="needle depths, 0 = start of the haystack, 1 = its end")
    samples: int = Field(1, ge=1, description="samples per (task, length, depth)")
    seed: int = Field(0, description="seed of the probes (the same for every run, whatever its own seed)")
    value_tokens: int | None = Field(None, ge=1, description="lengthen needle values to at least this many tokens")
    vt_example: bool = Field(True, description="vt: RULER's in-context example (a small solved vt probe) before each probe")
    generate_every_n_steps: int = Field(500, ge=0, description="also decode greedily and score by RULER's string match at "
                                        "evaluations at multiples of N steps and when training ends; 0 = only at the end")
    batch_size: int = Field(8, ge=1, description="sequences per evaluation forward")
    chunk_tokens: int = Field(2048, ge=1, description="tokens per forward call; longer inputs go in pieces with states")
    position_sequences: int = Field(2, ge=0, description="held-out sequences for per-position loss and LongPPL; 0 = off")
    position_length: int | None = Field(None, ge=2, description="their length; None = the largest of eval.lengths")
    longppl_context: int = Field(128, ge=1, description="LongPPL short context K: tokens see K to 2K-1 tokens (Fang et al.: 4096)")
    longppl_evaluator: str | None = Field(
        None, description="LongPPL: run directory or checkpoint of the model that chooses the key tokens for every model; null = LongPPL not reported"
    )
    longppl_alpha: float = Field(2.0, description="LongPPL: key if NLL(short) - NLL(long) > alpha (nats)")
    longppl_beta: float = Field(-2.0, description="LongPPL: key if log p(long) > beta")
    heads: HeadsConfig = Field(default_factory=HeadsConfig)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        _check_probes("eval", self.tasks, self.lengths, self.depths)
        return self

    @property
    def position_len(self) -> int:
        return self.position_length or max(self.lengths, default=1024)


class RunConfig(_Frozen):
    """A whole run: what ``train`` reads and writes next to every checkpoint."""

    name: str | None = Field(None, description="run name; default: the config file's stem")
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)


