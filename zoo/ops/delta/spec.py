from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeltaSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    key_dim: int  # K
    value_dim: int  # V
    gate: str  # none | scalar | channel
    needs_grad: bool

    @classmethod
    def of(cls, q: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
           log_gate: torch.Tensor | None) -> DeltaSpec:
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, v, beta, log_gate))
        return cls(q.device.type, q.dtype, q.shape[-1], v.shape[-1], gate_kind(log_gate),
                   needs_grad)


def gate_kind(log_gate: torch.Tensor | None) -> str:
    """none (DeltaNet), scalar ([B, H, T]: Gated DeltaNet) or channel ([B, H, T, K]: KDA)."""
    if log_gate is None:
        return "none"
    return "scalar" if log_gate.dim() == 3 else "channel"
