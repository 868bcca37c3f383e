"""The ``eval.heads:`` and ``eval.trace:`` sections: the retrieval heads scored (Wu et al.'s copy score) and traced
(the paper's attention mass, entropy and Q/K distance) during training."""

from __future__ import annotations

from pydantic import Field, StrictBool, model_validator

from hybrid_lightning.config.fields import MAX_SEED, Number, Whole, _Frozen, check_probes


class HeadsConfig(_Frozen):
    """The ``eval.heads:`` section: retrieval-head scores (Wu et al. 2024) during training and by
    ``hybrid-lightning heads`` (hybrid_lightning/heads/retrieval.py). Probes share ``eval.seed``,
    ``eval.batch_size`` and ``eval.chunk_tokens`` with the long-context evaluation."""

    every_n_steps: Whole = Field(100, ge=0, description="score heads every N optimizer steps; 0 = not at intervals")
    at_end: StrictBool = Field(True, description="score heads when training ends")
    tasks: tuple[str, ...] = Field(("passkey", "niah_single_1"), description="probe tasks")
    lengths: tuple[Whole, ...] = Field((512, 1024), description="probe lengths in tokens, prompt + answer")
    depths: tuple[Number, ...] = Field((0.0, 0.25, 0.5, 0.75, 1.0), description="needle depths")
    samples: Whole = Field(1, ge=1, description="samples per (task, length, depth)")
    value_tokens: Whole | None = Field(16, ge=1, description="answers of at least this many tokens (null = the tasks' "
                                     "own values), so that a head that only locates the answer stays under the "
                                     "threshold")
    threshold: Number = Field(0.1, ge=0, description="a retrieval head scores above this (Wu et al.: 0.1)")
    min_copy_precision: Number = Field(0.5, ge=0, le=1, description="copy head: retrieval head with at least this "
                                       "share of its in-span argmaxes on the source token")
    min_in_span: Number = Field(0.5, ge=0, le=1, description="locator head: argmax in the answer span on at least this "
                                "share of answer steps, not a copy head")
    min_answer_accuracy: Number | None = Field(None, ge=0, le=1, description="score only samples whose answer tokens "
                                              "are right (teacher-forced) in more than this share (Wu et al.'s answer "
                                              "filter, ROUGE-1 recall > 0.5); null = all")
    echo: StrictBool = Field(True, description="add echo probes (probes/near.py), one per task, length and sample at "
                             "the middle depth: a copy source inside small windows")
    selection_seed: Whole | None = Field(None, ge=0, le=MAX_SEED, description="probe seed of the scores that choose "
                                         "the heads `hybrid-lightning heads --mask-top/--mask-random` masks; null = "
                                         "eval.seed + 1 (held out from the probes scored)")

    @model_validator(mode="after")
    def _check(self) -> HeadsConfig:
        check_probes("eval.heads", self.tasks, self.lengths, self.depths)
        return self


class TraceConfig(_Frozen):
    """The ``eval.trace:`` section: the paper's tracing of retrieval heads during training (heads/tracing.py,
    ``live_trace``): at each interval the attention mass of every attention head on needle-in-a-haystack probes,
    and for that step's top heads the entropy of their last queries and the distance of their Q/K rows to the
    initialisation. Off unless scheduled; ``hybrid-lightning trace`` does the same after the run on the final
    checkpoint's top heads. The probes share ``eval.seed``."""

    every_n_steps: Whole = Field(0, ge=0, description="trace every N optimizer steps; 0 = not at intervals")
    at_end: StrictBool = Field(False, description="trace when training ends")
    task: str = Field("niah_single_1", description="the probe task: its answer stands in the prompt (the needle)")
    length: Whole = Field(512, description="probe length in tokens, prompt + answer")
    samples: Whole = Field(24, ge=1, description="probes, their needle depths spread evenly over [0, 1] (the "
                           "authors average over up to 200)")
    top: Whole = Field(4, ge=1, description="target heads: the step's top heads by attention mass (the paper: 4)")

    @model_validator(mode="after")
    def _check(self) -> TraceConfig:
        check_probes("eval.trace", (self.task,), (self.length,), (0.5,))
        return self
