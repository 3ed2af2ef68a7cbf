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
    chunk: int | None = None  # C: a query sees only the keys of its own chunk
    sinks: bool = False  # a sink logit per head joins each row's normalizer

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
           chunk: int | None = None, sinks: torch.Tensor | None = None) -> AttnSpec:
        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, sinks) if t is not None)
        return cls(q.device.type, q.dtype, q.shape[-1], v.shape[-1], q.shape[1], k.shape[1],
                   window, needs_grad, chunk, sinks is not None)
