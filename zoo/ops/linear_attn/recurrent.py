"""The recurrence, one token at a time: the decoding path (state F x V per head)."""

from __future__ import annotations

import torch

from ..precision import upcast_16bit


def recurrent_linear_attn(q, k, v, *, initial_state=None, chunk_size=None):
    out_dtype = q.dtype
    q, k, v, initial_state = upcast_16bit(q, k, v, initial_state)
    B, H, T, F = q.shape
    if initial_state is None:
        state = q.new_zeros(B, H, F, v.shape[-1])  # [B, H, F, V]
    else:
        state = initial_state.to(q.dtype)
    outputs = []
    for t in range(T):
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]  # [B, H, F, V]
        outputs.append((q[:, :, t, None, :] @ state)[:, :, 0])  # [B, H, V]
    return torch.stack(outputs, dim=2).to(out_dtype), state  # [B,H,T,V], [B,H,F,V]
