"""The ``fla`` backend on CPU through Triton's interpreter (``hybrid_lightning/interpreter.py``): fla's kernels
against the chunked path for both operators and every recurrent mixer, in a process of their own, since
``TRITON_INTERPRET`` must be set before triton and fla are imported."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from hybrid_lightning import interpreter

MISSING = [name for name in ("triton", "fla") if importlib.util.find_spec(name) is None]


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not installed: pip install -e '.[fla-cpu]'")
def test_fla_kernels_match_chunked_path_under_the_interpreter(tmp_path):
    """Operators at a ragged T (37, 70) with K != V from a random initial state: outputs, final states,
    gradients of every input; each mixer: outputs, parameter gradients, the final states it carries,
    three pieces (one of a single step) fed with carried state, and packed documents through fla's
    ``cu_seqlens`` against each document alone. All within 1e-4 in fp32."""
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hybrid_lightning.bench.gpu_recurrent", "--interpret", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    checks = [r["check"] for r in rows]
    assert sum(c.startswith("gated_linear_attention") for c in checks) == 2
    assert sum(c.startswith("gated_delta_rule") for c in checks) == 2
    assert {c.split()[1] for c in checks if c.startswith("mixer")} == {"mamba2", "gated_deltanet", "lightning", "kda",
                                                                               "gated_deltaproduct"}
    assert all(r["ok"] for r in rows) and max(max(r["output"], r["state"], r["grad"]) for r in rows) < 1e-4
    mixers = [r for r in rows if r["check"].startswith("mixer")]  # packed documents: fla's cu_seqlens vs each alone
    assert max(max(r["documents"], r["documents_grad"]) for r in mixers) < 1e-4


def test_untested_versions_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(interpreter, "tested", lambda: {"triton": ("0.0.1",), "no-such-package-here": ("1.0",)})
    found = interpreter.untested_versions()
    assert any(f.startswith("triton ") and "(tested: 0.0.1)" in f for f in found)
    assert "no-such-package-here not installed (tested: 1.0)" in found
    interpreter.patch.cache_clear()
    with pytest.raises(RuntimeError, match=r"tested with other versions.*\[fla-cpu\]"):
        interpreter.patch()
    interpreter.patch.cache_clear()


def test_the_interpreter_is_read_from_the_environment(monkeypatch):
    for value, on in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert interpreter.interpreting() is on
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not interpreter.interpreting()


def test_the_tested_versions_are_the_fla_cpu_extras_pins():
    """Read from the installed package's metadata (pyproject.toml's ``fla-cpu`` extra), not restated."""
    import tomllib

    from conftest import REPO

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fla-cpu"]
    pins = {name: (version,) for name, _, version in (r.partition("==") for r in extra) if version}
    assert interpreter.tested() == pins and pins


def test_the_fla_backend_on_cpu_refuses_to_run_unpatched(monkeypatch):
    """Triton is patched at the start of a process (the command line does it under TRITON_INTERPRET=1), never by a
    model forward: an unpatched process is told what to do."""
    import torch

    from hybrid_lightning.model.ops.common import resolve_backend

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(interpreter, "patched", lambda: False)
    monkeypatch.setattr("hybrid_lightning.model.ops.common.patched", lambda: False)
    with pytest.raises(ValueError, match=r"hybrid_lightning\.interpreter\.patch\(\)"):
        resolve_backend("fla", torch.zeros(1))
