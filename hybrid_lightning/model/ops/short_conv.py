"""The short causal depthwise convolution in front of Mamba-2's and Gated DeltaNet's recurrences."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ShortConv(nn.Module):
    """Causal depthwise 1-d convolution over time, then SiLU; carries its last inputs as state.

    Args:
        channels: feature channels, each convolved on its own.
        size: taps; output t sees inputs t-size+1 ... t.
        bias: add a learned bias per channel.
    """

    def __init__(self, channels: int, size: int, bias: bool):
        super().__init__()
        self.size = size
        self.conv = nn.Conv1d(channels, channels, size, groups=channels, bias=bias)  # holds weight (C, 1, size) and bias

    def forward(self, x: torch.Tensor, state: dict | None = None) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C). ``state["conv"]`` holds the last size-1 inputs (B, size-1, C)."""
        B, T, C = x.shape
        past = state.get("conv") if state is not None else None
        if past is None:
            past = x.new_zeros(B, self.size - 1, C)
        x = torch.cat([past.to(x.dtype), x], dim=1)  # (B, size-1+T, C)
        if state is not None:
            state["conv"] = x[:, x.shape[1] - (self.size - 1) :]
        # Taps by unfolding time rather than F.conv1d: depthwise conv1d falls back to a per-channel
        # loop on CPU in fp64, hundreds of times slower than this (and only ~1.5x faster in fp32).
        y = (x.unfold(1, self.size, 1) * self.conv.weight[:, 0]).sum(-1)  # (B, T, C); windows (B, T, C, size)
        if self.conv.bias is not None:
            y = y + self.conv.bias
        return F.silu(y)
