"""Planning: a validated config resolved once into the run plan (``resolve.make_plan``; the record is
``hybrid_lightning.runplan``), between the config and every code that uses it. The layer plan and each layer's
frozen options (``layers``), parameter matching (``matching``), the one count of parameters and FLOPs
(``count``), the precision (``precision``), the memory estimate (``memory``), and models built from a plan
(``build``). The model code below it (``hybrid_lightning.model``) reads only the options this resolves.

The names below are imported from their modules on first use: resolving a config (``--print-config``) or
reading a grid's cells (``grid status``) then loads neither torch nor the model, which counting parameters,
estimating memory and building models need.
"""

from __future__ import annotations

__all__ = [
    "build_model", "layer_plan", "load_trained", "make_plan", "plan_run", "resolve_config", "resolve_model_config",
]


def __getattr__(name: str):
    if name in ("build_model", "load_trained", "resolve_model_config"):
        from hybrid_lightning.plan import build

        return getattr(build, name)
    if name == "layer_plan":
        from hybrid_lightning.plan.layers import layer_plan

        return layer_plan
    if name in ("make_plan", "plan_run", "resolve_config"):
        from hybrid_lightning.plan import resolve

        return getattr(resolve, name)
    raise AttributeError(f"module 'hybrid_lightning.plan' has no attribute {name!r}")
