"""Planning: a validated config resolved once into the run plan (``resolve.make_plan``; the record is
``hybrid_lightning.runplan``), between the config and every code that uses it. The layer plan and each layer's
frozen options (``layers``), parameter matching (``matching``), the one count of parameters and FLOPs
(``count``), the precision (``precision``), the memory estimate (``memory``), and models built from a plan
(``build``). The model code below it (``hybrid_lightning.model``) reads only the options this resolves.
"""

from __future__ import annotations

from hybrid_lightning.plan.build import build_model, load_trained, resolve_model_config
from hybrid_lightning.plan.layers import layer_plan
from hybrid_lightning.plan.resolve import make_plan, plan_run, resolve_config

__all__ = ["build_model", "layer_plan", "load_trained", "make_plan", "plan_run", "resolve_config", "resolve_model_config"]
