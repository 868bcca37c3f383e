"""flash-linear-attention's Triton kernels on CPU tensors, through Triton's interpreter (``TRITON_INTERPRET=1``).

fla 0.6's kernels run under Triton 3.9's interpreter after two patches to Triton, process-wide, which
``patch()`` applies: an explicit step at the start of a process, never from inside a model. The command line
takes it when ``TRITON_INTERPRET`` is set (``cli.main``); a script calls ``patch()`` itself. The model's ``fla``
backend on CPU refuses to run until it has (``patched``).

1. The autotuner benchmarks every config through a GPU driver ("0 active drivers"): it keeps only the
   first config that its own pruning leaves.
2. Kernels loop with the builtin ``range``, whose ints have no ``.to(...)`` under the interpreter
   ("'int' object has no attribute 'to'"): while a kernel runs, its globals hold a ``range`` that
   yields the interpreter's integer tensors, as a compiled kernel's loop variables are.

Both reach into Triton's internals, so they are pinned to the versions they were tested with: the pins of the
package's ``fla-cpu`` extra, read from its installed metadata (``tested``); others are refused with a message
saying so. The interpreter runs each program of the grid in numpy, slowly: it is for checking the ``fla``
backend on a CPU machine, not for training.
"""

from __future__ import annotations

import builtins
import functools
import importlib.metadata
import os

EXTRA = "fla-cpu"  # the extra of pyproject.toml that pins the tested versions
PATCHED = "_hybrid_lightning_patched"  # set on triton's Autotuner once patch() ran in this process


def tested() -> dict[str, tuple[str, ...]]:
    """Package -> the versions the patches were tested with: the ``==`` pins of the ``fla-cpu`` extra in the
    installed package's metadata (empty where the package is not installed as a distribution)."""
    from packaging.requirements import Requirement

    try:
        requires = importlib.metadata.requires("hybrid-lightning") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    pins = {}
    for req in map(Requirement, requires):
        if req.marker is not None and req.marker.evaluate({"extra": EXTRA}) and not req.marker.evaluate({"extra": ""}):
            pins[req.name] = tuple(s.version for s in req.specifier if s.operator == "==")
    return {name: versions for name, versions in pins.items() if versions}


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter in this process (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def untested_versions() -> list[str]:
    """'name version' of each installed package the patches were not tested with (empty when all match)."""
    found = []
    for name, versions in tested().items():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        if version not in versions:
            found.append(f"{name} {version} (tested: {', '.join(versions)})")
    return found


@functools.cache
def patch() -> None:
    """Applies the two patches once per process; raises RuntimeError for untested versions."""
    untested = untested_versions()
    if untested:
        raise RuntimeError(
            "the fla backend on CPU (TRITON_INTERPRET=1) patches Triton's interpreter and was tested with "
            f"other versions than these: {'; '.join(untested)}; pip install -e '.[fla-cpu]' installs them"
        )
    from triton.runtime import autotuner, interpreter

    setattr(autotuner.Autotuner, PATCHED, True)
    prune = autotuner.Autotuner.prune_configs
    autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]

    def interpreted_range(*bounds):
        for i in builtins.range(*map(_host_int, bounds)):
            yield interpreter._implicit_cvt(i)

    run = interpreter.GridExecutor.__call__

    def run_with_range(self, *args, **kwargs):
        scope = self.fn.__globals__
        before = scope.get("range", None)
        scope["range"] = interpreted_range
        try:
            return run(self, *args, **kwargs)
        finally:
            if before is None:
                scope.pop("range", None)
            else:
                scope["range"] = before

    interpreter.GridExecutor.__call__ = run_with_range


def patched() -> bool:
    """Whether ``patch()`` ran in this process (without importing triton where nothing has)."""
    import sys

    autotuner = sys.modules.get("triton.runtime.autotuner")
    return autotuner is not None and getattr(autotuner.Autotuner, PATCHED, False)


def _host_int(bound) -> int:
    """A loop bound as a Python int: an int, a ``tl.constexpr``, or one of the interpreter's
    1-element tensors (numpy-backed), as integer kernel arguments arrive."""
    if hasattr(bound, "handle"):
        return int(bound.handle.data.item())
    return int(getattr(bound, "value", bound))
