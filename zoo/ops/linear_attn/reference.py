"""The quadratic reference: materializes the masked kernel matrix. O(T^2) memory, exact."""

from __future__ import annotations

import torch


def linear_attn_matrix(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The causal kernel matrix tril(q k^T) [B, H, T, T]: entry (t, s) = q_t . k_s, s <= t."""
    return torch.tril(q @ k.transpose(-1, -2))  # [B, H, T, T]


def reference_linear_attn(q, k, v, *, initial_state=None, chunk_size=None):
    o = linear_attn_matrix(q, k) @ v  # [B, H, T, V]
    state = k.transpose(-1, -2) @ v  # [B, H, F, V]
    if initial_state is not None:
        o = o + q @ initial_state.to(q.dtype)
        state = state + initial_state.to(q.dtype)
    return o, state
