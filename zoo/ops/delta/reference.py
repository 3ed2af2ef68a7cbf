"""The per-token recurrence (the reference, and the one-token decoding path)."""

from __future__ import annotations

import torch

from budgets.mixing.delta import gate_columns

from ..precision import upcast_16bit


def recurrent_delta(q, k, v, beta, log_gate=None, *, initial_state=None, chunk_size=None):
    out_dtype = q.dtype
    q, k, v, beta, log_gate, initial_state = upcast_16bit(q, k, v, beta, log_gate,
                                                          initial_state)
    B, H, T, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    if log_gate is not None:  # a_t as a column over the state's rows: [B, H, T, 1 | K, 1]
        decay = torch.exp(gate_columns(log_gate))[..., None]
    outputs = []
    for t in range(T):
        if log_gate is not None:
            S = decay[:, :, t] * S  # D_t S_{t-1}
        kt = k[:, :, t, :, None]  # [B, H, K, 1]
        error = v[:, :, t, None, :] - kt.mT @ S  # [B, H, 1, V]: v_t - S^T k_t
        S = S + beta[:, :, t, None, None] * kt @ error  # the delta update
        outputs.append((q[:, :, t, None, :] @ S)[:, :, 0])  # [B, H, V]
    return torch.stack(outputs, dim=2).to(out_dtype), S  # [B, H, T, V], [B, H, K, V]
