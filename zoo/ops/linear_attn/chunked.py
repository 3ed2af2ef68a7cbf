"""The chunked parallel form in pure torch: linear in T.

The sequence is cut into chunks of C tokens. Inside a chunk the causal kernel matrix is a
C x C block; between chunks the state S (F x V per head) carries the past:

    o[chunk c] = q_c S_{c-1} + tril(q_c k_c^T) v_c,    S_c = S_{c-1} + k_c^T v_c

The states of all chunks come from one cumulative sum over chunks (no Python loop), so the
largest tensors are [B, H, T/C, C, C] and [B, H, T/C, F, V]; no T x T tensor is formed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..precision import upcast_16bit


def chunked_linear_attn(q, k, v, *, initial_state=None, chunk_size: int = 64):
    out_dtype = q.dtype
    q, k, v, initial_state = upcast_16bit(q, k, v, initial_state)
    B, H, T, Fd = q.shape
    V = v.shape[-1]
    C = min(chunk_size, T)
    n = -(-T // C)  # chunks
    pad = n * C - T
    if pad:  # zero keys and values add nothing to the state; padded outputs are dropped
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    q = q.reshape(B, H, n, C, Fd)
    k = k.reshape(B, H, n, C, Fd)
    v = v.reshape(B, H, n, C, V)
    kv = k.transpose(-1, -2) @ v  # [B, H, n, F, V]: each chunk's contribution
    after = torch.cumsum(kv, dim=2)  # [B, H, n, F, V]: the state leaving each chunk
    if initial_state is not None:
        after = after + initial_state.to(q.dtype)[:, :, None]
        first = initial_state.to(q.dtype)[:, :, None]  # [B, H, 1, F, V]
    else:
        first = kv.new_zeros(B, H, 1, Fd, V)
    before = torch.cat([first, after[:, :, :-1]], dim=2)  # [B, H, n, F, V]: entering
    final = after[:, :, -1]  # [B, H, F, V]
    intra = torch.tril(q @ k.transpose(-1, -2)) @ v  # [B, H, n, C, V]
    o = q @ before + intra  # [B, H, n, C, V]
    return o.reshape(B, H, n * C, V)[:, :, :T].to(out_dtype), final
