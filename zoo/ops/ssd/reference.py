"""The sequential recurrence (the reference), and the materialized semiseparable matrix.

The matrix, its stable segment sum and the group expansion are SSD's math, written once in
budgets/mixing/ssd.py (the captures of Hugging Face scans read the same); they are
re-exported here under the names the zoo's kernels and tests use.
"""

from __future__ import annotations

import torch

from budgets.mixing.ssd import expand_groups, segsum
from budgets.mixing.ssd import ssd_mixing as ssd_mixing_matrix

from ..precision import upcast_16bit

__all__ = ["expand_groups", "reference_ssd", "segsum", "ssd_mixing_matrix"]


def reference_ssd(x, dt, A, B, C, *, initial_state=None, chunk_size=None):
    out_dtype = x.dtype
    x, dt, A, B, C, initial_state = upcast_16bit(x, dt, A, B, C, initial_state)
    b, T, H, P = x.shape
    Bh, Ch = expand_groups(B, H), expand_groups(C, H)  # [B, T, H, N]
    if initial_state is None:
        state = x.new_zeros(b, H, P, B.shape[-1])  # [B, H, P, N]
    else:
        state = initial_state.to(x.dtype)
    decay = torch.exp(dt * A)  # [B, T, H]
    ys = []
    for t in range(T):
        inject = (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]  # [B, H, P, N]
        state = decay[:, t, :, None, None] * state + inject
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))  # [B, H, P]
    return torch.stack(ys, dim=1).to(out_dtype), state  # [B, T, H, P], [B, H, P, N]
