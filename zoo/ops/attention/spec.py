from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttnSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    head_dim: int  # K
    value_dim: int  # V
    n_heads: int  # H
    n_kv_heads: int  # G
    window: int | None
    needs_grad: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> AttnSpec:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return cls(q.device.type, q.dtype, q.shape[-1], v.shape[-1], q.shape[1], k.shape[1],
                   window, needs_grad)
