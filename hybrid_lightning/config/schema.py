"""The run config's schema: typed, frozen sections, each checking its own constraints.

A run config has the sections ``model``, ``data``, ``train`` and ``eval`` plus ``seed`` and
``name``. Every field has a default, so an empty file is a valid config (the embedded default).
Reading YAML, overrides and turning validation errors into one ``ValueError`` live in
``config/loading.py``; the grid file's schema in ``grid/schema.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, create_model, field_validator, model_validator

from hybrid_lightning.config.fields import (
    BOOKKEEPING,
    IDENTITY,
    LABEL,
    MAX_PROBE_TOKENS,
    MAX_SEED,
    RESUMABLE,
    Number,
    Whole,
    _Frozen,
    check_probes,
    role,
)
from hybrid_lightning.config.heads import HeadsConfig, TraceConfig
from hybrid_lightning.config.sections import SECTIONS
from hybrid_lightning.config.stable import StablePhaseConfig
from hybrid_lightning.config.synthetic import SyntheticConfig
from hybrid_lightning.kinds import FULL, KINDS, HeadsSettings, check_pattern, mixer_names, pattern_mixers

PROVENANCE_KEY = "provenance"  # the section train adds to config.yaml (git revision, version, time)
MAX_STEPS = 10**12  # more optimizer steps than any budget can mean (the paper's largest: under 10^12 tokens)
MAX_TOKENS_PER_PARAM = 10**6  # the paper trains on 100N to 1000N tokens
MAX_LAYERS = 4096  # bounds checked before anything is counted or allocated (the largest published models: ~200)


class PosConfig(_Frozen):
    """Positional encoding per layer type. NoPE applies no rotation at all."""

    full: Literal["rope", "nope"] = Field("rope", description="positional encoding of the full-attention layers: "
                                          "`nope` applies no rotation at all (there is no absolute position embedding)")
    efficient: Literal["rope", "nope"] = Field("rope", description="positional encoding of the other attention layers "
                                               "(SWA)")


# The registered mixers as the docs of model.pattern and model.mixer name them.
_LETTERS = ", ".join(f"`{k.letter}` = {k.title}" for k in KINDS.values() if k.name != FULL)
_EFFICIENT = ", ".join(f"`{name}`" for name in mixer_names(efficient_only=True))


class _ModelLayout(_Frozen):
    """The ``model:`` section; ``build_model`` takes it (or the same keys as a dict)."""

    n_layers: Whole = Field(4, ge=1, le=MAX_LAYERS, description="layers; `model.pattern` is tiled to them")
    d_model: Whole = Field(128, ge=1, description="model width")
    n_heads: Whole = Field(4, ge=1, description="attention heads; must divide `d_model`")
    n_kv_heads: Whole | None = Field(None, ge=1, description="key/value heads (GQA); must divide `n_heads`; null = "
                                     "`n_heads`")
    pattern: str = Field("EEEF", description="one letter per layer, tiled to `n_layers` (its length must divide "
                         "`n_layers`): `F` full attention, `E` the mixer named by `model.mixer`, or a mixer's own "
                         f"letter ({_LETTERS}) to mix mixers explicitly, e.g. `SSFS`")
    mixer: str = Field("swa", description=f"the efficient mixer that `E` stands for: {_EFFICIENT}")
    window: Whole = Field(64, ge=1, description="SWA window W, counting the current token (flash-attn's "
                        "`window_size=(W-1, 0)`): token t sees t-W+1 ... t")
    pos: PosConfig = Field(default_factory=PosConfig)
    rope_theta: Number = Field(10000.0, gt=0, description="RoPE base")
    vocab_size: Whole | None = Field(None, ge=2, description="vocabulary size; null = the tokenizer's")
    mlp_hidden: Whole | None = Field(None, ge=1, description="SwiGLU hidden width; null = 8/3 d_model rounded up to 32")
    qk_norm: StrictBool = Field(False, description="RMSNorm on queries and keys per head")
    tie_embeddings: StrictBool = Field(False, description="share the input embedding and the output head")
    norm_eps: Number = Field(1e-5, gt=0, description="RMSNorm epsilon")
    init_std: Number = Field(0.02, gt=0, description="weights drawn from N(0, std); residual outputs scaled by "
                             "1/sqrt(2 n_layers)")
    attn_backend: Literal["auto", "reference", "sdpa", "blocked", "flash", "flex"] = Field(
        "auto", description="attention kernel (docs/training.md, Attention backends)", **role(BOOKKEEPING))
    recurrent_backend: Literal["auto", "chunked", "compiled", "recurrent", "fla"] = Field(
        "auto", description="recurrent mixers: `auto` = fla on CUDA when installed, else `chunked`; `compiled` = "
        "`chunked` under torch.compile (docs/training.md, Recurrent mixers)", **role(BOOKKEEPING))
    recurrent_chunk: Whole = Field(64, ge=1, description="steps per chunk of the chunked recurrent backend",
                                   **role(BOOKKEEPING))
    require_fast_kernels: StrictBool | None = Field(
        None, description="on CUDA, refuse to train when `auto` would fall back because fla or flash-attn failed to "
        "import (false: warn and train); null = true when the run trains on CUDA (docs/training.md, Fast paths)",
        **role(BOOKKEEPING))
    efficient_mlp_hidden: Whole | None = Field(None, ge=1, description="SwiGLU width of the non-full layers; null = "
                                               "`mlp_hidden`'s")
    match_params: str | None = Field(None, description="a reference pattern, e.g. `F`: sets the non-full layers' "
                                     "SwiGLU width so that the non-embedding parameter count matches the same model "
                                     "with that pattern (within 2%)")

    @model_validator(mode="after")
    def _check(self) -> _ModelLayout:
        if self.mixer not in mixer_names(efficient_only=True):
            accepted = sorted(mixer_names(efficient_only=True))
            raise ValueError(f"model.mixer: {self.mixer!r} is not one of the accepted mixers {accepted}")
        check_pattern(self.pattern, self.n_layers)
        if self.d_model % self.n_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model.d_model / model.n_heads = {self.d_model // self.n_heads} must be even (RoPE "
                             "rotates pairs)")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_kv_heads={self.kv_heads} must divide model.n_heads={self.n_heads}")
        for name in self.mixers_used:
            if KINDS[name].section is not None:
                self.settings(name).check(self)
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

    def settings(self, mixer: str) -> Any:
        """The settings of ``mixer``'s section (``model.<mixer>``) as its kind's settings dataclass."""
        return KINDS[mixer].settings(**getattr(self, KINDS[mixer].section).model_dump())

    def heads(self, opts: HeadsSettings) -> tuple[int, int]:
        """(heads, width per head) of a recurrent mixer's settings, open values taken from the model."""
        return opts.n_heads or self.n_heads, opts.head_dim or self.head_dim

    @property
    def mlp_width(self) -> int:
        return self.mlp_hidden or 32 * -(-(8 * self.d_model) // (3 * 32))

    @property
    def efficient_mlp_width(self) -> int:
        """SwiGLU width of the non-full layers before any parameter matching."""
        return self.efficient_mlp_hidden or self.mlp_width


ModelConfig = create_model("ModelConfig", __base__=_ModelLayout, __doc__=_ModelLayout.__doc__, __module__=__name__,
                           **{name: (section, Field(default_factory=section)) for name, section in SECTIONS.items()})


class DataConfig(_Frozen):
    """The ``data:`` section. No files and no hub name = the embedded corpus."""

    files: tuple[str, ...] = Field((), description="local text (`.txt .md .py ...`, one file = one document), "
                                   "`.json/.jsonl` or `.parquet` files or globs; relative to the config file; null or "
                                   "left out: the embedded corpus (or `hub`); a list written empty is refused")
    hub: str | None = Field(None, description="a `datasets` hub dataset, streamed (needs network)")
    hub_config: str | None = Field(None, description="the hub dataset's configuration")
    hub_split: str = Field("train", description="the hub dataset's split")
    text_field: str = Field("text", description="column holding the text in json, parquet and hub data")
    tokenizer: str = Field("byte", description="`byte` (UTF-8 bytes + end-of-document, 257 ids), a `tokenizers` JSON "
                           "file, or a Hugging Face tokenizer folder (its `tokenizer.json`; the end-of-document token "
                           "from its `tokenizer_config.json`)")
    max_tokens: Whole | None = Field(None, ge=1, description="cap on real-text training tokens read")
    min_doc_tokens: Whole | None = Field(None, ge=1, description="keep only documents of at least this many tokens "
                                       "(long-document corpora)")
    val_fraction: Number = Field(0.02, gt=0, lt=1, description="share of documents held out for validation")
    # Validation only (a loader of its own, after the others): training's samples and steps do not depend on it.
    text_val_files: tuple[str, ...] = Field((), description="held-out natural text (files or globs, never synthetic or "
                                            "probe documents; relative to the config file) for val/text_loss, the "
                                            "short-context cost; () = none",
                                            **role(BOOKKEEPING))
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    cache_dir: str | None = Field(None, description="token stores live in `<cache_dir>/store/<fingerprint>`; null = "
                                  "`$HYBRID_LIGHTNING_CACHE` or `~/.cache/hybrid_lightning`", **role(BOOKKEEPING))
    store: str | None = Field(None, description="the token store's folder instead (e.g. on a cluster filesystem), "
                              "relative to the config file; null = "
                              "`<cache_dir>/store/<fingerprint>`", **role(BOOKKEEPING))
    shard_mb: Number = Field(32.0, gt=0, description="input text per store shard, in MiB; preparing holds about one "
                            "shard per worker in memory", **role(BOOKKEEPING))
    prepare_workers: Whole | None = Field(None, ge=1, description="processes that tokenize a store; null = the cores, "
                                          "at most 8",
                                          **role(BOOKKEEPING))
    num_workers: Whole = Field(0, ge=0, description="dataloader worker processes", **role(BOOKKEEPING))
    doc_mask: StrictBool = Field(False, description="packed windows behave as their documents run one by one: "
                                 "attention, RoPE positions and recurrent state restart after each end-of-document "
                                 "token (docs/training.md)",
                                 **role(IDENTITY))

    @field_validator("files", mode="before")
    @classmethod
    def _no_files(cls, files: Any) -> Any:
        return () if files is None else files  # null: no files (an empty list a user wrote is refused on loading)

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

    max_steps: Whole = Field(200, ge=1, le=MAX_STEPS, description="optimizer steps", **role(RESUMABLE))
    tokens_per_param: Number | None = Field(None, gt=0, le=MAX_TOKENS_PER_PARAM, description="a token budget in units "
                                           "of the non-embedding parameter count N (the paper's 100N-1000N): replaces "
                                           "`max_steps` by ceil(k N / (batch_size x seq_len x accumulate_grad_batches "
                                           "x devices x num_nodes)); needs `train.devices` as a number")
    batch_size: Whole = Field(16, ge=1, description="sequences per device per forward (the micro-batch)")
    seq_len: Whole = Field(128, ge=2, description="tokens per training sequence")
    lr: Number = Field(3e-3, gt=0, description="peak learning rate")
    accumulate_grad_batches: Whole = Field(1, ge=1, description="micro-batches whose gradients are summed per "
                                           "optimizer step (Lightning's accumulation); a step is batch_size x "
                                           "accumulate_grad_batches x devices x num_nodes sequences", **role(IDENTITY))
    activation_checkpointing: StrictBool = Field(False, description="recompute each block's activations in the "
                                                 "backward (non-reentrant torch.utils.checkpoint, one per block): same "
                                                 "loss and gradients, less memory", **role(BOOKKEEPING))
    check_memory: StrictBool = Field(True, description="refuse a run whose estimated peak memory exceeds a device's; "
                                     "false = try anyway", **role(BOOKKEEPING))
    min_lr_ratio: Number = Field(0.1, ge=0, le=1, description="final lr as a share of lr")
    schedule: Literal["cosine", "wsd", "constant"] = Field("cosine", description="after `warmup_steps`: `cosine`, "
                                                           "`wsd` (warmup-stable-decay: linear decay over the last "
                                                           "`decay_fraction`) or `constant`")
    warmup_steps: Whole = Field(20, ge=0, description="linear warmup steps; must be below `max_steps`")
    decay_fraction: Number = Field(0.2, gt=0, le=1, description="WSD: share of steps spent decaying")
    stable_phase: StablePhaseConfig | None = Field(None, description="WSD: start from the stable phase's checkpoint at "
                                                   "this run's decay start where one is published (docs/grids.md)",
                                                   **role(BOOKKEEPING))
    weight_decay: Number = Field(0.1, ge=0, description="AdamW weight decay, on matrices only")
    betas: tuple[Number, Number] = Field((0.9, 0.95), description="AdamW betas")
    grad_clip: Number | None = Field(1.0, gt=0, description="gradient-norm clipping; null = off (the norm before "
                                    "clipping is logged as `train/grad_norm`)")
    precision: Literal["auto", "32", "bf16-mixed", "16-mixed"] = Field("auto", description="auto = bf16-mixed on GPU; "
                                                                       "on a CPU with bf16 instructions (AVX512-BF16, "
                                                                       "AMX) bf16-mixed where measured faster for the "
                                                                       "architecture (precision.py), else 32")
    compile: StrictBool = Field(False, description="`torch.compile` the model (inductor), in place: checkpoints are "
                          "the same either way; the first steps wait for the compilation (measured: 88 s for a 2-layer "
                          "model on a shared 2-core CPU)", **role(BOOKKEEPING))
    accelerator: Literal["auto", "cpu", "gpu"] = Field("auto", description="Lightning's accelerator")
    devices: Whole | Literal["auto"] = Field("auto", description="devices per node")
    num_nodes: Whole = Field(1, ge=1, description="nodes")
    strategy: Literal["auto", "ddp", "fsdp"] = Field("auto", description="Lightning's strategy")
    threads: Whole | Literal["auto"] = Field("auto", description="CPU threads of each training process "
                                             "(`torch.set_num_threads`); auto = `OMP_NUM_THREADS` where the "
                                             "environment sets it, else the cores the process was given "
                                             "(`SLURM_CPUS_PER_TASK`, else its CPU affinity) shared by the run's "
                                             "processes on the node (training/threads.py)", **role(BOOKKEEPING))
    checkpoint_every_n_steps: Whole = Field(100, ge=1, description="a checkpoint `checkpoints/step_<N>.ckpt` (and "
                                          "`last.ckpt`) every N steps, and at the last step", **role(BOOKKEEPING))
    keep_checkpoints: Whole = Field(5, ge=-1, description="periodic checkpoints kept besides last.ckpt; -1 = all",
                                    **role(BOOKKEEPING))
    log_every_n_steps: Whole = Field(10, ge=1, description="TensorBoard scalars (and, without a progress bar, a "
                                   "console line) every N steps and at the last step", **role(BOOKKEEPING))
    val_every_n_steps: Whole = Field(100, ge=1, description="validation every N steps and at the last step",
                                     **role(BOOKKEEPING))
    val_batches: Whole = Field(8, ge=1, description="batches per validation", **role(BOOKKEEPING))
    progress_bar: StrictBool = Field(True, description="a progress bar over optimizer steps; false prints a text line "
                               "every `log_every_n_steps` instead (the grids' setting)", **role(BOOKKEEPING))

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        budget_pending = self.tokens_per_param is not None  # max_steps follows from it; checked once resolved
        if self.warmup_steps >= self.max_steps and self.max_steps > 1 and not budget_pending:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} must be below train.max_steps={self.max_steps}: "
                             f"set train.warmup_steps to at most {self.max_steps - 1} (e.g. --set "
                             "train.warmup_steps=0)")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"train.betas must each be in [0, 1) (AdamW's decay rates), got {list(self.betas)}")
        if self.threads != "auto" and self.threads < 1:
            raise ValueError(f"train.threads must be at least 1 (or auto), got {self.threads}")
        if self.devices != "auto" and self.devices < 1:
            raise ValueError(f"train.devices must be at least 1 (or auto), got {self.devices}")
        if self.stable_phase is not None and self.schedule != "wsd":
            raise ValueError(f"train.stable_phase needs train.schedule=wsd (got {self.schedule}): only WSD's learning "
                             "rate before the decay does not depend on the budget")
        if self.tokens_per_param is not None and self.devices == "auto":
            raise ValueError("train.tokens_per_param needs train.devices as a number: the tokens of a step "
                             "depend on it")
        return self


class EvalConfig(_Frozen):
    """The ``eval:`` section: long-context evaluation during training and by ``hybrid-lightning eval``."""

    every_n_steps: Whole = Field(100, ge=0, description="evaluate every N optimizer steps; 0 = not at intervals")
    at_end: StrictBool = Field(True, description="evaluate when training ends (unless the last step was just "
                               "evaluated)")
    tasks: tuple[str, ...] = Field(("passkey", "niah_single_1"), description="probe tasks: `passkey`, "
                                   "`niah_single_1/2/3`, `niah_multikey_1/2/3`, `niah_multivalue`, `niah_multiquery`, "
                                   "`vt` (hybrid_lightning/probes/tasks.py)")
    lengths: tuple[Whole, ...] = Field((512, 1024), description="probe lengths in tokens, prompt + answer (any length: "
                                     "beyond `train.seq_len` too)")
    depths: tuple[Number, ...] = Field((0.0, 0.5, 1.0), description="needle depths, 0 = start of the haystack, 1 = its "
                                       "end")
    samples: Whole = Field(1, ge=1, description="samples per (task, length, depth)")
    seed: Whole = Field(0, ge=0, le=MAX_SEED, description="seed of the probes: every run of a study sees the same "
                        "probes, whatever its "
                        "own seed")
    value_tokens: Whole | None = Field(None, ge=1, description="lengthen needle values (more digits, words, UUIDs) to "
                                     "at least this many tokens: long answers for retrieval-head probing")
    vt_example: StrictBool = Field(True, description="`vt` probes open with RULER's in-context example (a small solved "
                             "`vt` probe, 859 tokens with the byte tokenizer, so `vt` then needs lengths of about "
                             "1300); false leaves it out (for short lengths)")
    generate_every_n_steps: Whole = Field(500, ge=0, description="the generation score (greedy decoding, RULER's "
                                        "string match) at the evaluations at multiples of N steps and when training "
                                        "ends (0 = only at the end); `hybrid-lightning eval` always decodes")
    batch_size: Whole = Field(8, ge=1, description="sequences per evaluation forward")
    chunk_tokens: Whole = Field(2048, ge=1, description="tokens per forward call: longer inputs go through the model "
                              "in pieces with its incremental state")
    position_sequences: Whole = Field(2, ge=0, description="held-out sequences for per-position loss and LongPPL; 0 = "
                                      "off")
    position_length: Whole | None = Field(None, ge=2, le=MAX_PROBE_TOKENS, description="their length; null = the "
                                          "largest of eval.lengths")
    longppl_context: Whole = Field(128, ge=1, description="LongPPL short context K: a token sees K to 2K-1 tokens "
                                 "(Fang et al.: 4096 with their long context; 128 is the CPU scale)")
    longppl_evaluator: str | None = Field(None, description="LongPPL's evaluator: a finished run's directory (its "
                                          "newest checkpoint) or a checkpoint file (relative paths: to the config or "
                                          "grid file); its key tokens score every model; null = LongPPL not reported")
    longppl_alpha: Number = Field(2.0, description="LongPPL: key if NLL(short) - NLL(long) > alpha (nats)")
    longppl_beta: Number = Field(-2.0, description="LongPPL: key if log p(long) > beta")
    heads: HeadsConfig = Field(default_factory=HeadsConfig)
    trace: TraceConfig = Field(default_factory=TraceConfig)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        check_probes("eval", self.tasks, self.lengths, self.depths)
        return self

    @property
    def position_len(self) -> int:
        return self.position_length or max(self.lengths, default=1024)


class RunConfig(_Frozen):
    """A whole run: what ``train`` reads and writes next to every checkpoint."""

    name: str | None = Field(None, description="run name; the default run directory is `runs/<name>` (default: the "
                             "config file's stem)", **role(LABEL))
    seed: Whole = Field(0, ge=0, le=MAX_SEED, description="seeds initialisation and the data order", **role(LABEL))
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig, **role(BOOKKEEPING))  # evaluation does not change training

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> RunConfig:
        if info.context and info.context.get("model_only"):  # a model built alone sees no sequences of a run
            return self
        longest = max(self.train.seq_len, self.eval.position_len, *self.eval.lengths, *self.eval.heads.lengths,
                      self.eval.trace.length)
        windowed = any(KINDS[m].has_window for m in self.model.mixers_used)
        if windowed and self.model.window > longest:
            raise ValueError(f"model.window={self.model.window} is longer than any sequence the model sees (at most "
                             f"{longest} tokens: train.seq_len and the eval lengths); a window that long is full "
                             "attention: use pattern letter F, or a window of at most that")
        return self
