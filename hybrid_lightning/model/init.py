"""Initial values the recurrent mixers share (Mamba-2's parametrisation of the decay step Δ, which
Gated DeltaNet takes over, arXiv 2412.06464 §3.3)."""

from __future__ import annotations

import math

import torch

# Δ log-uniform in [1e-3, 0.1], as the Mamba-2 reference module draws it.
DT_INIT = (1e-3, 0.1)


def inverse_softplus_dt(n: int, low: float, high: float) -> torch.Tensor:
    """(n,) biases whose softplus is log-uniform in [low, high] (the Δ bias of Mamba-2 and Gated DeltaNet)."""
    dt = torch.exp(torch.rand(n) * (math.log(high) - math.log(low)) + math.log(low))
    return dt + torch.log(-torch.expm1(-dt))  # softplus⁻¹(dt)
