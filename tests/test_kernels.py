"""No silent fallback: the fast paths a run takes are resolved once into its plan (plan/kernels.py); on CUDA,
``auto`` falling back because fla failed to import warns (naming the exception and the cost) or, under
``model.require_fast_kernels`` (null = true on CUDA), refuses. Checked for a CUDA device without one: the
resolution takes the device as an argument, and fla is made unimportable."""

import sys
import warnings

import pytest

from hybrid_lightning.config import validate_config
from hybrid_lightning.model.ops import common
from hybrid_lightning.plan.kernels import SlowKernelWarning, resolve_kernels
from hybrid_lightning.runplan import Kernels


@pytest.fixture
def no_fla(monkeypatch):
    """fla unimportable (a ``None`` entry in ``sys.modules`` makes ``import fla`` raise), the cached answer cleared."""
    monkeypatch.setitem(sys.modules, "fla", None)
    common.fla_error.cache_clear()
    yield
    common.fla_error.cache_clear()


def hybrid(**model) -> object:
    return validate_config({"model": {"pattern": "EEEF", "mixer": "gated_deltanet", **model}})


def test_auto_on_cuda_without_fla_refuses_by_default_naming_the_key_and_the_error(no_fla):
    with pytest.raises(ValueError, match=r"model\.recurrent_backend auto on CUDA: fla failed to import \(ModuleNot"
                                         r"FoundError.*several times slower.*model\.require_fast_kernels is null "
                                         r"\(true on CUDA\)"):
        resolve_kernels(hybrid(), "bf16-mixed", "cuda")


def test_auto_on_cuda_without_fla_warns_when_allowed_and_the_plan_says_so(no_fla):
    with pytest.warns(SlowKernelWarning, match=r"fla failed to import \(ModuleNotFoundError.*several times slower"):
        kernels = resolve_kernels(hybrid(require_fast_kernels=False), "bf16-mixed", "cuda")
    assert kernels.recurrent == "chunked" and kernels.device == "cuda"
    assert len(kernels.notes) == 1 and "fla failed to import" in kernels.notes[0]
    assert "note: model.recurrent_backend auto on CUDA" in kernels.describe()


def test_an_explicit_fla_backend_on_cuda_without_fla_is_refused_before_training(no_fla):
    with pytest.raises(ValueError, match=r"model\.recurrent_backend='fla' on CUDA, but fla failed to import"):
        resolve_kernels(hybrid(recurrent_backend="fla", require_fast_kernels=False), "bf16-mixed", "cuda")


def test_no_fallback_no_warning(no_fla):
    """On CPU, or on CUDA without recurrent layers, a missing fla is no fallback: nothing is said."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cpu = resolve_kernels(hybrid(), "32-true", "cpu")
        swa_cfg = validate_config({"model": {"pattern": "EEEF", "mixer": "swa", "window": 64}})
        swa = resolve_kernels(swa_cfg, "bf16-mixed", "cuda")
    assert (cpu.recurrent, cpu.notes, cpu.attention) == ("chunked", (), {"full": "sdpa"})
    assert swa.recurrent is None and swa.notes == ()


def test_the_backends_are_named_on_cpu():
    """What the start line (``Console``; tests/test_toy_mixer.py reads it) and ``--dry-run`` print."""
    cfg = validate_config({"model": {"pattern": "SSMF", "window": 32}, "train": {"seq_len": 128, "compile": True}})
    kernels = resolve_kernels(cfg, "32-true", "cpu")
    assert kernels == Kernels("cpu", {"swa": "blocked", "full": "sdpa"}, "chunked", True, ())
    assert kernels.describe() == "kernels on cpu: attention blocked (swa), sdpa (full); recurrent chunked; compile on"


def test_a_gpu_run_planned_without_cuda_leaves_its_kernels_to_the_machine_that_trains_it(no_fla):
    """``grid plan`` on a login node: no fla there is no refusal; the plan holds no kernels and says where they are
    resolved (``train`` refuses a GPU run on a machine without CUDA, so training always resolves them itself)."""
    from hybrid_lightning.plan.resolve import kernels_here
    from hybrid_lightning.runplan import Budget, RunPlan

    cfg = validate_config({"model": {"pattern": "EEEF", "mixer": "gated_deltanet"}, "train": {"accelerator": "gpu"}})
    assert kernels_here(cfg, "bf16-mixed") is None
    plan = RunPlan((), Budget(8, 1, 1, 1, 1))
    assert plan.describe_kernels() == "kernels: resolved on the machine that trains the run"
