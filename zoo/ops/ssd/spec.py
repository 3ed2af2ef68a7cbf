from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SSDSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    n_heads: int  # H
    head_dim: int  # P
    n_groups: int  # G
    d_state: int  # N
    needs_grad: bool

    @classmethod
    def of(cls, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> SSDSpec:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, dt, B, C))
        return cls(x.device.type, x.dtype, x.shape[2], x.shape[3], B.shape[2], B.shape[3],
                   needs_grad)
