"""hybrid-lightning: experiments on hybrid language-model architectures with PyTorch Lightning."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# The public API, each name imported from its module on first use: importing a light module of the
# package (kinds, config, rundir, as analysis does) then does not build the model package and torch.
_API = {"ModelConfig": "hybrid_lightning.config", "RunConfig": "hybrid_lightning.config",
        "load_config": "hybrid_lightning.config", "build_model": "hybrid_lightning.plan",
        "count_params": "hybrid_lightning.plan.count"}


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'hybrid_lightning' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


__all__ = ["ModelConfig", "RunConfig", "__version__", "build_model", "count_params", "load_config"]
