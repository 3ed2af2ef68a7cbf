from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LinearAttnSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    feature_dim: int  # F
    value_dim: int  # V (with the normalizer column, when the block normalizes)
    needs_grad: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> LinearAttnSpec:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return cls(q.device.type, q.dtype, q.shape[-1], v.shape[-1], needs_grad)
