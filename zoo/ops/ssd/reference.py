"""The sequential recurrence (the reference) and the materialized semiseparable matrix."""

from __future__ import annotations

import torch

from ..precision import upcast_16bit


def expand_groups(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, G, N] -> [B, T, H, N]: group g serves heads g*H/G ... (g+1)*H/G - 1."""
    return t.repeat_interleave(n_heads // t.shape[2], dim=2)


def segsum(a: torch.Tensor) -> torch.Tensor:
    """Stable segment sum [..., T] -> [..., T, T]: out[i, j] = a_{j+1} + ... + a_i for j <= i
    (0 on the diagonal), -inf above it.

    A masked cumulative sum down each column, not cumsum_i - cumsum_j, which cancels
    catastrophically once the cumulative log-decay is large.
    """
    T = a.shape[-1]
    below = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)  # j < i
    a = a[..., :, None].expand(*a.shape, T).masked_fill(~below, 0)  # [..., i, j] = a_i, i > j
    out = torch.cumsum(a, dim=-2)  # sum of a_k over j < k <= i
    return out.masked_fill(~below.logical_or(torch.eye(T, dtype=torch.bool, device=a.device)),
                           float("-inf"))


def ssd_mixing_matrix(dt, A, B, C) -> torch.Tensor:
    """The per-head semiseparable matrix M [B, H, T, T] with y = M x (see the package doc):
    the "hidden attention" of Mamba (Ali, Zimerman & Wolf 2024)."""
    H = dt.shape[-1]
    Bh, Ch = expand_groups(B, H), expand_groups(C, H)  # [B, T, H, N]
    decay = torch.exp(segsum((dt * A).transpose(1, 2)))  # [B, H, T, T]
    cb = torch.einsum("bthn,bshn->bhts", Ch, Bh)  # [B, H, T, T]
    return cb * decay * dt.transpose(1, 2)[:, :, None, :]  # dt_s scales column s


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
