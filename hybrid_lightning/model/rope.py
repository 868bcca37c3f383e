"""Rotary position embedding (Su et al. 2021, arXiv 2104.09864), rotate-half convention."""

from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (Dh/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, H, T, Dh) at absolute positions start ... start+T-1, or at ``positions`` (B, T) when given
        (each token's position in its document)."""
        if positions is None:
            pos = torch.arange(start, start + x.shape[2], device=x.device, dtype=torch.float32)
            freqs = torch.outer(pos, self.inv_freq)  # (T, Dh/2)
        else:
            freqs = (positions.to(torch.float32)[..., None] * self.inv_freq)[:, None]  # (B, 1, T, Dh/2)
        cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1).to(x.dtype)  # (T, Dh)
        sin = torch.cat([freqs.sin(), freqs.sin()], dim=-1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin
