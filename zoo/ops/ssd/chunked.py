"""Chunked SSD in pure torch (Dao & Gu 2024, "ssd_minimal"): linear in T.

With chunks of C tokens and a = dt * A (the log-decay per step):
  1. inside each chunk, the C x C block of the semiseparable matrix, applied directly;
  2. each chunk's own final state (from its inputs alone);
  3. the states entering each chunk, by a recurrence over the T/C chunk states (a segsum of
     the chunk's total decays: [T/C + 1, T/C + 1], tiny);
  4. each entering state read out through C, decayed to each position of the chunk.

Every exponent is a segment sum of non-positive log-decays, so every exp is <= 1: no
overflow and no cancellation. The largest tensors are [B, H, T/C, C, C] and the chunk
states [B, T/C, H, P, N]; no T x T tensor is formed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import expand_groups, segsum


def chunked_ssd(x, dt, A, B, C, *, initial_state=None, chunk_size: int = 64):
    out_dtype = x.dtype
    if out_dtype in (torch.float16, torch.bfloat16):  # decays and states in fp32
        x, dt, A, B, C = x.float(), dt.float(), A.float(), B.float(), C.float()
        if initial_state is not None:
            initial_state = initial_state.float()
    b, T, H, P = x.shape
    N = B.shape[-1]
    L = min(chunk_size, T)
    n = -(-T // L)  # chunks
    pad = n * L - T
    Bh, Ch = expand_groups(B, H), expand_groups(C, H)  # [B, T, H, N]
    if pad:  # dt = 0 there: no decay and no input, so the final state is unchanged
        x, dt, Bh, Ch = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, Bh, Ch))
    xd = (x * dt[..., None]).reshape(b, n, L, H, P)  # dt_s x_s
    Bc, Cc = Bh.reshape(b, n, L, H, N), Ch.reshape(b, n, L, H, N)
    a = (dt * A).reshape(b, n, L, H).permute(0, 3, 1, 2)  # [B, H, n, L]
    a_cum = torch.cumsum(a, dim=-1)  # [B, H, n, L]

    # 1. diagonal blocks: (C_t . B_s) exp(segsum) applied to dt_s x_s
    scores = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * torch.exp(segsum(a))  # [B,H,n,L,L]
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xd)  # [B, n, L, H, P]

    # 2. each chunk's state from its own inputs, decayed to the chunk's end
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [B, H, n, L]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, to_end, xd)  # [B, n, H, P, N]

    # 3. states entering each chunk: a recurrence over chunks, as one small segsum
    if initial_state is None:
        initial_state = states.new_zeros(b, H, P, N)
    states = torch.cat([initial_state.to(states.dtype)[:, None], states], dim=1)  # n + 1
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # [B, H, n+1, n+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)  # [B, n+1, H, P, N]
    entering, final = states[:, :-1], states[:, -1]

    # 4. entering state -> outputs, decayed from the chunk's start to each position
    from_start = torch.exp(a_cum)  # [B, H, n, L]
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, entering, from_start)
    return y.reshape(b, n * L, H, P)[:, :T].to(out_dtype), final  # [B,T,H,P], [B,H,P,N]
