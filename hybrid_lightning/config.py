"""Typed, frozen run configuration: one YAML file per run, validated once.

A run config has the sections ``model``, ``data``, ``train`` and ``eval`` plus
``seed`` and ``name``. Every field has a default, so an empty file is a valid
config (the embedded default). ``load_config`` reads YAML, applies
``--set dotted.key=value`` overrides and validates; every user error is a
``ValueError`` whose message names the bad field and, for unknown keys, the
closest valid one.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator



PROVENANCE_KEY = "provenance"  # the section train adds to config.yaml (git revision, version, time)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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


class _HeadsConfig(_Frozen):
    """Heads of a recurrent mixer; ``ModelConfig.heads`` fills what is left open from the model."""

    n_heads: int | None = Field(None, ge=1, description="None = model.n_heads")
    head_dim: int | None = Field(None, ge=1, description="(query/key) width per head; None = model's head_dim")


class GatedDeltaNetConfig(_HeadsConfig):
    """Gated DeltaNet layers (``G``; Yang, Kautz & Hatamizadeh 2025)."""

    expand_v: float = Field(2.0, gt=0, description="value width per head = expand_v * head_dim")
    conv_size: int = Field(4, ge=1, description="taps of the causal depthwise convolution")


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
        from hybrid_lightning.model.plan import check_pattern, mixer_names

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
        inner = self.mamba2.expand * self.d_model
        if "mamba2" in self.mixers_used and inner % self.mamba2.head_dim:
            raise ValueError(
                f"model.mamba2.head_dim={self.mamba2.head_dim} must divide model.mamba2.expand * model.d_model = {inner}"
            )
        expand_v, key_dim = self.gated_deltanet.expand_v, self.heads(self.gated_deltanet)[1]
        if "gated_deltanet" in self.mixers_used and key_dim * expand_v % 1:
            raise ValueError(
                f"model.gated_deltanet.expand_v={expand_v} times the head width {key_dim} must be a whole number"
            )
        if self.match_params is not None:
            check_pattern(self.match_params, self.n_layers, field="model.match_params")
            if self.efficient_mlp_hidden is not None:
                raise ValueError(
                    "model.match_params sets the non-full layers' SwiGLU width itself; "
                    "leave model.efficient_mlp_hidden unset (null) or drop model.match_params"
                )
        return self

    @property
    def mixers_used(self) -> set[str]:
        """The mixer names this model's pattern expands to."""
        from hybrid_lightning.model.plan import pattern_mixers

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
    tokenizer: str = Field("byte", description="'byte' or a tokenizers JSON file")
    max_tokens: int | None = Field(None, ge=1, description="cap on real-text tokens read")
    val_fraction: float = Field(0.02, gt=0, lt=1, description="share of documents held out for validation")
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    cache_dir: str | None = Field(None, description="None = $HYBRID_LIGHTNING_CACHE or ~/.cache/hybrid_lightning")
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
        if self.tokens_per_param is not None and self.devices == "auto":
            raise ValueError("train.tokens_per_param needs train.devices as a number: the tokens of a step depend on it")
        return self


def _check_probes(section: str, tasks: tuple[str, ...], lengths: tuple[int, ...], depths: tuple[float, ...]) -> None:
    """Checks the probe grid of ``section`` (eval or eval.heads); errors name its keys."""
    from hybrid_lightning.eval.tasks import TASKS

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"{section}.tasks: {unknown} not among the accepted tasks {sorted(TASKS)}")
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
    batch_size: int = Field(8, ge=1, description="sequences per evaluation forward")
    chunk_tokens: int = Field(2048, ge=1, description="tokens per forward call; longer inputs go in pieces with states")
    position_sequences: int = Field(2, ge=0, description="held-out sequences for per-position loss and LongPPL; 0 = off")
    position_length: int | None = Field(None, ge=2, description="their length; None = the largest of eval.lengths")
    longppl_context: int = Field(128, ge=1, description="LongPPL short context K: tokens see K to 2K-1 tokens")
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


class GridConfig(_Frozen):
    """A grid file (``ablations/*.yaml``): one base run config and the settings that vary.

    The cells are the cartesian product of the ``axes`` (each a list of values, or a mapping of
    named presets, each a set of config values) and the ``zip`` groups (keys whose value lists
    vary together), minus the cells that match an ``exclude`` entry.
    """

    name: str | None = Field(None, description="grid name; default: the grid file's stem")
    base: str | dict[str, Any] = Field(
        default_factory=dict, description="a run config file (relative to the grid file) or an inline run config"
    )
    root: str | None = Field(None, description="folder holding the cells' run directories; default runs/<name>")
    axes: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted config key -> list of values, or axis name -> {preset name: {dotted key: value}}",
    )
    zip: tuple[dict[str, list[Any]], ...] = Field((), description="groups of dotted keys whose value lists vary together")
    exclude: tuple[dict[str, Any], ...] = Field((), description="partial assignments (axis: value) whose cells are dropped")

    @model_validator(mode="after")
    def _check(self) -> GridConfig:
        for key, values in self.axes.items():
            if isinstance(values, dict):
                if not values:
                    raise ValueError(f"axes.{key}: empty preset axis (it needs at least one named preset)")
                for preset, settings in values.items():
                    if not isinstance(settings, dict) or not settings:
                        raise ValueError(
                            f"axes.{key}.{preset}: a preset is a non-empty mapping of config keys to values, got {settings!r}"
                        )
            elif not isinstance(values, list):
                raise ValueError(f"axes.{key}: an axis is a list of values or a mapping of named presets, got {values!r}")
            elif not values:
                raise ValueError(f"axes.{key}: empty axis (it needs at least one value)")
        for i, group in enumerate(self.zip):
            lengths = {key: len(values) for key, values in group.items()}
            if not group or 0 in lengths.values():
                raise ValueError(f"zip[{i}]: a zip group needs at least one key with at least one value")
            if len(set(lengths.values())) > 1:
                raise ValueError(f"zip[{i}]: the lists of a zip group vary together and need equal lengths, got {lengths}")
        keys = [*self.axes, *(key for group in self.zip for key in group)]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"axes and zip: {repeated} varied more than once")
        for i, entry in enumerate(self.exclude):
            if not entry:
                raise ValueError(f"exclude[{i}]: an empty entry would drop every cell")
        return self


# ---- loading, overriding, validating -------------------------------------------------------------


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (["train", "lr"], 3e-4); the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects dotted.key=value, got {item!r}")
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Returns a copy of ``raw`` with each ``dotted.key=value`` set (unknown keys are caught later)."""
    assignments = {}
    for item in overrides:
        path, value = parse_override(item)
        assignments[".".join(path)] = value
    return apply_assignments(raw, assignments)


def apply_assignments(raw: dict, assignments: Mapping[str, Any]) -> dict:
    """Returns a copy of ``raw`` with each dotted key set to its value, e.g. ``{"model.window": 128}``."""
    out = _deep_copy(raw)
    for key, value in assignments.items():
        path = key.split(".")
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"{key}: {'.'.join(path[: i + 1])} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def validate_config(raw: dict | None) -> RunConfig:
    """Builds a ``RunConfig`` from plain data; every problem becomes one ``ValueError``."""
    return _validate(RunConfig, raw, "a run config", "config")


def validate_grid_config(raw: dict | None) -> GridConfig:
    """Builds a ``GridConfig`` from a grid file's plain data; every problem becomes one ``ValueError``."""
    return _validate(GridConfig, raw, "a grid file", "grid")


def _validate(model: type[_Frozen], raw: dict | None, what: str, noun: str):
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a mapping, got {type(raw).__name__}")
    _check_keys(raw, model, "", noun)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ValueError(f"invalid {noun}: {_describe(e)}") from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Reads a YAML run config (None = the embedded default), applies overrides, validates.

    Relative paths in ``data.files`` and ``data.tokenizer`` are resolved against the
    config file's folder; those given with ``--set`` against the working directory.
    """
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file not found: {path}")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a run config must be a YAML mapping")
        raw.pop(PROVENANCE_KEY, None)  # written by train next to the config; not an input
        raw = resolve_paths(raw, path.parent)
        raw.setdefault("name", path.stem)
    raw = resolve_paths(apply_overrides(raw, overrides), Path.cwd())
    return validate_config(raw)


def resolve_paths(raw: dict, base: Path) -> dict:
    """Makes relative ``data.files`` and ``data.tokenizer`` paths absolute against ``base``."""
    data = raw.get("data")
    if not isinstance(data, dict):
        return raw
    data = dict(data)
    files = data.get("files")
    if isinstance(files, str):
        files = [files]
    if isinstance(files, list):
        data["files"] = [str((base / f).resolve()) if isinstance(f, str) else f for f in files]
    tok = data.get("tokenizer")
    if isinstance(tok, str) and tok != "byte":
        data["tokenizer"] = str((base / tok).resolve())
    return {**raw, "data": data}


def _check_keys(raw: dict, model: type[BaseModel], prefix: str, noun: str) -> None:
    """Rejects unknown keys with the closest valid key, recursing into sections."""
    fields = model.model_fields
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise ValueError(f"unknown {noun} key '{where}'{hint} Valid keys here: {sorted(fields)}")
        sub = _section_type(fields[key].annotation)
        if sub is not None and isinstance(value, dict):
            _check_keys(value, sub, where + ".", noun)


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _describe(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg = f"{err['input']!r} is not accepted; {msg.lower()}"
        elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def config_to_dict(cfg: RunConfig) -> dict:
    """Plain YAML-ready data (tuples become lists)."""
    return cfg.model_dump(mode="json")


def dump_config(cfg: RunConfig, extra: dict | None = None) -> str:
    data = config_to_dict(cfg)
    if extra:
        data = {**data, **extra}
    return yaml.safe_dump(data, sort_keys=False)


__all__ = [
    "DataConfig",
    "EvalConfig",
    "GatedDeltaNetConfig",
    "GridConfig",
    "HeadsConfig",
    "LightningConfig",
    "Mamba2Config",
    "ModelConfig",
    "PosConfig",
    "RunConfig",
    "SyntheticConfig",
    "TrainConfig",
    "apply_assignments",
    "apply_overrides",
    "config_to_dict",
    "dump_config",
    "load_config",
    "resolve_paths",
    "validate_config",
    "validate_grid_config",
]
