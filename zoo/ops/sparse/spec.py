from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SparseSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    branches: tuple[str, ...]  # of budgets.mixing.sparse.BRANCHES, the ones present
    needs_grad: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           branches: tuple[str, ...]) -> SparseSpec:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return cls(q.device.type, q.dtype, branches, needs_grad)
