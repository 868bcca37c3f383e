"""A run resolved once, before it trains: the config completed (vocabulary size, name, the step budget of
``train.tokens_per_param``) and every fact that follows from it, recorded as the run plan (``make_plan``,
``hybrid_lightning.runplan``): the layer plan with each layer's options and parameters, the totals, FLOPs
per token, tokens per step, the precision, the memory estimate and the checked probe settings. Also the run
directory a config defaults to and the provenance written beside it."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import subprocess
from collections.abc import Mapping
from pathlib import Path

from hybrid_lightning import __version__, runplan
from hybrid_lightning.config import EvalConfig, RunConfig, TrainConfig, config_to_dict, validate_config
from hybrid_lightning.data.corpus import check_sources
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.runplan import Budget, LayerPlan, RunPlan, plan_differences
from hybrid_lightning.units import format_table

# Counting parameters, estimating memory and checking probes build blocks and probes with torch and numpy: their
# modules are imported where a plan is made (and, for train.tokens_per_param, where the steps are counted), so
# that resolving a config that states its steps (--print-config) loads neither.


def resolve_config(cfg: RunConfig, sources: bool = True) -> RunConfig:
    """Fills what follows from other settings: the vocabulary size from the tokenizer, the name, and
    ``train.max_steps`` from ``train.tokens_per_param``. ``sources``: check that the data exists first (False
    plans a config whose data is not written yet, as ``grid plan --verdicts`` does)."""
    if sources:
        check_sources(cfg.data)
    model, tokens = cfg.model, load_tokenizer(cfg.data.tokenizer).vocab_size
    if model.vocab_size is None:
        model = model.model_copy(update={"vocab_size": tokens})
    elif model.vocab_size < tokens:
        raise ValueError(f"model.vocab_size={model.vocab_size} is below the {tokens} tokens of data.tokenizer "
                         f"({cfg.data.tokenizer}); raise it to at least {tokens}, or leave it null (the tokenizer's)")
    cfg = cfg.model_copy(update={"model": model, "name": cfg.name or "run"})
    if cfg.train.tokens_per_param is None:
        return cfg
    steps = budget_steps(cfg)
    if cfg.train.warmup_steps >= steps > 1:
        raise ValueError(f"train.warmup_steps={cfg.train.warmup_steps} must be below train.max_steps={steps} (from "
                         f"train.tokens_per_param={cfg.train.tokens_per_param}): set train.warmup_steps to at most "
                         f"{steps - 1}")
    raw = config_to_dict(cfg)
    raw["train"]["max_steps"] = steps
    return validate_config(raw)


def world_size(train: TrainConfig) -> int:
    """Training processes: ``train.devices`` per node (``auto`` as Lightning resolves it here: every visible GPU
    where the run takes GPUs, else one process) times ``train.num_nodes``."""
    if train.devices != "auto":
        return train.devices * train.num_nodes
    import torch

    gpu = train.accelerator != "cpu" and torch.cuda.is_available()
    return (torch.cuda.device_count() if gpu else 1) * train.num_nodes


def budget(train: TrainConfig) -> Budget:
    return Budget(train.seq_len, train.batch_size, train.accumulate_grad_batches, world_size(train), train.max_steps)


def budget_steps(cfg: RunConfig) -> int:
    """Optimizer steps for ``train.tokens_per_param`` x the non-embedding parameters (``runplan.budget_steps``)."""
    from hybrid_lightning.plan.matching import non_embedding_params

    return runplan.budget_steps(cfg.train.tokens_per_param, non_embedding_params(cfg.model),
                                budget(cfg.train).tokens_per_step)


def make_plan(cfg: RunConfig) -> RunPlan:
    """The run plan of the resolved config ``cfg`` (``resolve_config``); a ``ValueError`` naming the key for
    probes that cannot be built."""
    from hybrid_lightning.plan.count import count
    from hybrid_lightning.plan.layers import model_options
    from hybrid_lightning.plan.matching import matched_plan, param_report
    from hybrid_lightning.plan.memory import estimate_memory
    from hybrid_lightning.plan.precision import resolve_precision

    m, t = cfg.model, cfg.train
    specs, opts, tokens = matched_plan(m), model_options(m), budget(t)
    counts = count(opts, specs, (t.seq_len,))
    layers = tuple(LayerPlan(s.index, s.mixer, s.window, s.pos, s.mlp_hidden, dataclasses.asdict(s.options), c)
                   for s, c in zip(specs, counts.layers))
    match = param_report(m)
    precision = resolve_precision(t, m)
    plan = RunPlan(layers, tokens, model=dataclasses.asdict(opts), params=counts.totals(),
                   flops_per_token=counts.flops[t.seq_len], precision=precision, kernels=kernels_here(cfg, precision),
                   match={**dataclasses.asdict(match), "deviation": match.deviation,
                          "applied": m.match_params is not None},
                   probes=_probes(cfg.eval, cfg.data.tokenizer, t.seq_len))
    estimate = estimate_memory(plan, t.activation_checkpointing)  # from the plan's layers, parameters and precision
    return dataclasses.replace(plan, memory=dataclasses.asdict(estimate))


def kernels_here(cfg: RunConfig, precision: str) -> dict | None:
    """The run's fast paths (``plan.kernels.resolve_kernels``), or None for a GPU run planned on a machine without
    CUDA (it resolves them where it trains: ``train`` refuses a GPU run on a machine without one)."""
    import torch

    from hybrid_lightning.plan.kernels import resolve_kernels
    from hybrid_lightning.plan.precision import on_gpu

    gpu = on_gpu(cfg.train)
    if gpu and not torch.cuda.is_available():
        return None
    return dataclasses.asdict(resolve_kernels(cfg, precision, "cuda" if gpu else "cpu"))


@functools.cache
def _probes(cfg: EvalConfig, tokenizer: str, seq_len: int) -> dict:
    """The checked probes (``probes.check.check_probes``); a grid's cells mostly share them, so each once."""
    from hybrid_lightning.probes.check import check_probes

    return check_probes(cfg, load_tokenizer(tokenizer), seq_len)


def plan_run(cfg: RunConfig, sources: bool = True) -> tuple[RunConfig, RunPlan]:
    """The config resolved (``resolve_config``) and its plan."""
    cfg = resolve_config(cfg, sources)
    return cfg, make_plan(cfg)


def check_planned(cfg: RunConfig, plan: RunPlan, planned: Mapping) -> None:
    """A ``ValueError`` naming the keys where ``plan``, made here from ``cfg``, differs from ``planned``, the plan
    made from the same config where the run was submitted (a grid's cell): another package version or a changed
    tokenizer would train another run than the one planned. What the config leaves to the machine it runs on is
    not compared: the fast paths (``kernels``: what imports on the machine), the precision and the memory estimate
    under ``train.precision: auto``, the processes under ``train.devices: auto``."""
    machine = ("kernels",) + (("precision", "memory.") if cfg.train.precision == "auto" else ()) + (
        ("budget.world_size",) if cfg.train.devices == "auto" else ())
    differing = {k: v for k, v in plan_differences(plan.as_dict(), planned).items() if not k.startswith(machine)}
    if differing:
        shown = "; ".join(f"{k}: {then!r} when submitted, {here!r} here"
                          for k, (here, then) in list(differing.items())[:6])
        more = f" and {len(differing) - 6} more" if len(differing) > 6 else ""
        raise ValueError(f"the run plan made here differs from the one made when the run was submitted "
                         f"({shown}{more}); is another hybrid-lightning version ({__version__} here) or tokenizer "
                         "installed where it runs?")


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / (cfg.name or "run")


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                               text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict:
    """The ``provenance`` section of config.yaml: git revision, package version and time (training adds the
    data's fingerprint)."""
    return {"git_revision": git_revision(), "package_version": __version__,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def param_table(plan: RunPlan) -> str:
    """``hybrid-lightning params``: the plan's parameters per layer, the totals, its memory estimate and, last (what
    scripts read), the comparison with its reference (``matching.param_report``)."""
    rows = [["layer", "mixer", "window", "pos", "mixer params", "mlp params", "mlp width", "norm params", "total"]]
    rows += [[str(layer.index), layer.mixer, str(layer.window or "-"), layer.pos or "-", f"{layer.params['mixer']:,}",
              f"{layer.params['mlp']:,}", str(layer.mlp_hidden), f"{layer.params['norm']:,}",
              f"{layer.params['total']:,}"]
             for layer in plan.layers]
    p, match = plan.params, plan.match
    how = (f"non-full SwiGLU width {match['width']}, matched from {match['base_width']}" if match["applied"]
           else "not matched (set model.match_params to match)")
    return "\n".join([format_table(rows, left=()),
                      f"non-embedding {p['non_embedding']:,}  embedding {p['embedding']:,}  total {p['total']:,}",
                      f"estimated peak memory at batch {plan.budget.batch_size} x {plan.budget.seq_len}: "
                      f"{plan.memory_estimate.describe()}",
                      f"reference (pattern {match['reference_pattern']}) non-embedding {match['reference']:,}  this "
                      f"model {match['matched']:,}  deviation {match['deviation']:+.2%}  {how}"])


def read_run(run_dir: Path) -> tuple[RunConfig, RunPlan]:
    """A run directory's config and plan, to build its model from: for a run written before plans were recorded
    (``rundir.legacy.rebuilt_plan`` rebuilds only its layout), the plan made from its config here, numbering steps
    as the run did."""
    from hybrid_lightning.rundir.files import read_plan, read_run_config

    cfg, plan = read_run_config(run_dir), read_plan(run_dir)
    if not plan.rebuilt:
        return cfg, plan
    if cfg.model.vocab_size is None:  # a config written by hand, not by training
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"vocab_size": load_tokenizer(cfg.data.tokenizer).vocab_size})})
    return cfg, dataclasses.replace(make_plan(cfg), step_numbering=plan.step_numbering)
