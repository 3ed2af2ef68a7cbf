"""Rotary position embedding (rotate-half convention), applied at absolute positions."""

from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, dim: int, base: float):
    """cos, sin [T, dim/2] for integer positions [T]; computed in fp32 for accuracy."""
    exponents = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim
    inv_freq = base ** (-exponents)  # [dim/2]
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, dim/2]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, offset: int, base: float) -> torch.Tensor:
    """Rotate x [B, H, T, K] as if its tokens sat at positions offset .. offset + T - 1."""
    positions = torch.arange(offset, offset + x.shape[-2], device=x.device)
    cos, sin = rope_angles(positions, x.shape[-1], base)  # [T, K/2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # [B, H, T, K/2] each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
