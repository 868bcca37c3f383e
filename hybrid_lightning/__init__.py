"""hybrid-lightning: experiments on hybrid language-model architectures with PyTorch Lightning."""

from __future__ import annotations

__version__ = "0.1.0"

from hybrid_lightning.config import ModelConfig, RunConfig, load_config  # noqa: E402
from hybrid_lightning.model import build_model, count_params  # noqa: E402

__all__ = ["ModelConfig", "RunConfig", "__version__", "build_model", "count_params", "load_config"]
