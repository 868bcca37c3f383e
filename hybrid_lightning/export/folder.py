"""``hybrid-lightning export``: a run's checkpoint as a ``transformers`` model folder.

    <out>/config.json              HybridLightningConfig: the model's options and the layer plan with each layer's
                                   mixer options, as dicts (hybrid_lightning/kinds/)
    <out>/model.safetensors        the weights, fp32, as the run's HybridLM holds them under ``model.``, an attention
                                   layer's under Llama's names (``model.layers.<i>.self_attn.q_proj.weight``, ...)
    <out>/configuration_hybrid_lightning.py, modeling_hybrid_lightning.py   the wrapper (trust_remote_code)
    <out>/hl_*.py                  the package's model source, copied (export/source.py)
    <out>/tokenizer.json, tokenizer_config.json   the run's tokenizer (export/tokenizer.py)
    <out>/generation_config.json   generation stops at the end-of-document token
    <out>/lm_eval/                 with --probes: the probes as lm-evaluation-harness tasks (export/lm_eval_task.py)

The folder is written under a temporary name beside ``out`` and moved into place when complete.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from hybrid_lightning.config import RunConfig
from hybrid_lightning.data.tokenizer import ByteTokenizer, JsonTokenizer, load_tokenizer
from hybrid_lightning.export.lm_eval_task import write_probe_tasks
from hybrid_lightning.export.source import CONFIG_MODULE, write_model_source
from hybrid_lightning.export.tokenizer import write_tokenizer
from hybrid_lightning.fileio import overlap, own, owned
from hybrid_lightning.kinds import LayerSpec
from hybrid_lightning.model import HybridLM
from hybrid_lightning.model.observe import attention_layers
from hybrid_lightning.plan import load_trained
from hybrid_lightning.plan.resolve import read_run
from hybrid_lightning.probes.files import read_probes
from hybrid_lightning.rundir.checkpoints import find_resume_checkpoint, given_checkpoint
from hybrid_lightning.rundir.files import read_run_config
from hybrid_lightning.runplan import RunPlan

LM_EVAL_DIR = "lm_eval"  # the probes' lm-evaluation-harness tasks (--probes)
MARKER = ".hybrid-lightning-export"  # the files an export wrote in its folder: --force replaces only those
MODEL_CLASS = "HybridLightningForCausalLM"
AUTO_MAP = {
    "AutoConfig": f"{CONFIG_MODULE}.HybridLightningConfig",
    "AutoModelForCausalLM": f"modeling_hybrid_lightning.{MODEL_CLASS}",
}


def export_run(run_dir: str | Path, out: str | Path, ckpt: str | Path | None = None, force: bool = False,
               probes: str | Path | None = None) -> Path:
    """Exports a checkpoint of ``run_dir`` (default: its newest valid one) to the folder ``out``.

    Args:
        run_dir: a run directory (config.yaml, checkpoints/).
        out: the folder to write; it must not exist or be empty, unless ``force`` (then it is replaced).
        ckpt: a checkpoint file of the run instead of its newest.
        force: replace a non-empty ``out``.
        probes: a ``hybrid-lightning probes`` file to write as lm-evaluation-harness tasks in ``out/lm_eval``.
    Returns the folder. Raises ``ValueError`` (nothing written) for a run without checkpoint, a missing
    ``ckpt``, a bad probes file, a non-empty ``out`` without ``force``, or an ``out`` that is, holds
    or lies inside the run directory or a file the export reads (even with ``force``).
    """
    run_dir, out = Path(run_dir), Path(out)
    cfg = read_run_config(run_dir)
    ckpt = checkpoint_of(run_dir, ckpt)
    tokenizer = [Path(cfg.data.tokenizer)] if cfg.data.tokenizer != "byte" else []
    check_apart(out, [run_dir, ckpt, *tokenizer, *([Path(probes)] if probes is not None else [])])
    check_out(out, force)
    rows = read_probes(probes) if probes is not None else None
    model, tok = load_native(*read_run(run_dir), ckpt)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_folder(model, tok, staging)
        share_modes(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if rows is not None:  # after the move: the tasks name their data files by absolute path
        write_probe_tasks(rows, tok, out / LM_EVAL_DIR)
    own(out, MARKER, {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()})
    return out


def check_out(out: Path, force: bool) -> None:
    """Refuses an ``out`` that is a link or a file, or holds files, unless ``force`` and every one of them is an
    earlier export's (its marker lists them): the export replaces nothing it did not write."""
    if out.is_symlink():
        raise ValueError(f"--out {out} is a symbolic link; give the folder itself")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if not (out.is_dir() and any(out.iterdir())):
        return
    mine = owned(out, MARKER) | {MARKER}
    foreign = sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                     if (p.is_file() or p.is_symlink()) and p.relative_to(out).as_posix() not in mine)
    if foreign:  # --force would not help: say what will
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ValueError(f"--out {out}: {foreign[0]}{more} was not written by hybrid-lightning export; give a new or "
                         "empty folder (--force replaces only an earlier export)")
    if not force:
        raise ValueError(f"--out {out} holds an earlier export; pass --force to replace it, or give a new folder")


def check_apart(out: Path, sources: list[Path]) -> None:
    """A ``ValueError`` when ``out`` is, contains or lies inside one of ``sources`` (replacing it
    would delete what the export reads, or the run itself)."""
    for source in sources:
        if overlap(out, source):
            raise ValueError(f"--out {out} is, contains or lies inside {source}, which the export reads; "
                             "choose a folder apart from the run and its files")


def share_modes(folder: Path) -> None:
    """Gives ``folder`` and everything in it the modes a plain ``mkdir`` and ``open`` give (0777 and 0666
    less the umask; 0755 and 0644 under the usual 022): ``mkdtemp`` makes the folder 0700 and
    safetensors writes 0600, which colleagues on a shared filesystem could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def load_native(cfg: RunConfig, plan: RunPlan, ckpt: Path) -> tuple[HybridLM, ByteTokenizer | JsonTokenizer]:
    """The run's model (on the CPU, in eval mode) of its plan with the weights of checkpoint ``ckpt``, and its
    tokenizer."""
    model, _ = load_trained(plan, ckpt)
    return model.eval(), load_tokenizer(cfg.data.tokenizer)


def checkpoint_of(run_dir: Path, ckpt: str | Path | None = None) -> Path:
    """``ckpt`` if given (it must exist), else the run's newest valid checkpoint; ``ValueError`` otherwise."""
    if ckpt is not None:
        return given_checkpoint(ckpt)
    found = find_resume_checkpoint(run_dir)
    if found is None:
        raise ValueError(f"{run_dir}: no checkpoint to export (checkpoints/ holds no valid .ckpt)")
    return found[0]


def write_folder(model: HybridLM, tok: ByteTokenizer | JsonTokenizer, out: Path) -> None:
    """Writes the ``transformers`` folder of a native ``model`` (and its tokenizer) into ``out``."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    from hybrid_lightning.export.remote.configuration_hybrid_lightning import HybridLightningConfig

    attention = dict(attention_layers(model))
    first = next(iter(attention.values()), None)  # the attention layers share their heads (the model's options)
    config = HybridLightningConfig(
        hybrid_model=dataclasses.asdict(model.opts), layers=[exported_layer(s) for s in model.plan],
        num_key_value_heads=first and first.n_kv, head_dim=first and first.head_dim,
        architectures=[MODEL_CLASS], auto_map=AUTO_MAP, eos_token_id=tok.eos_id, dtype="float32",
    )
    config.save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_id, pad_token_id=tok.eos_id).save_pretrained(out)
    # clone: safetensors stores no shared tensors (a tied head is the embedding; both keys load into it)
    weights = {"model." + llama_key(k, set(attention)): v.detach().float().clone()
               for k, v in model.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_model_source(out)
    write_tokenizer(tok, out)


def exported_layer(spec: LayerSpec) -> dict:
    """One layer of the plan as config.json stores it (``kinds.spec_from_dict`` rebuilds it), its mixer's
    kernel (where its options name one) ``auto``: the fast path where the loading machine has one, the torch path
    elsewhere."""
    layer = dataclasses.asdict(spec)
    if "backend" in layer["options"]:
        layer["options"]["backend"] = "auto"
    return layer


def llama_key(key: str, attention: set[int]) -> str:
    """The name in model.safetensors of ``HybridLM`` parameter ``key``: the parameters of the ``attention`` layers
    (their indices) under Llama's names (``layers.3.mixer.wq.weight`` -> ``layers.3.self_attn.q_proj.weight``,
    ``ATTENTION_NAMES``), the others as they are."""
    from hybrid_lightning.export.remote.configuration_hybrid_lightning import ATTENTION_MODULE, ATTENTION_NAMES

    parts = key.split(".")
    if parts[0] != "layers" or int(parts[1]) not in attention or parts[2] != ATTENTION_MODULE[0]:
        return key
    if parts[3] not in ATTENTION_NAMES:
        raise RuntimeError(f"{key}: an attention parameter without a Llama name; add it to ATTENTION_NAMES")
    return ".".join(["layers", parts[1], ATTENTION_MODULE[1], ATTENTION_NAMES[parts[3]], *parts[4:]])
