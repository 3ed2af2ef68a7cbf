"""Chunked SSD in pure torch (Dao & Gu 2024, the four steps of "ssd_minimal"): linear in T.

With chunks of C tokens and a = dt * A (the log-decay per step):
  1. inside each chunk, the C x C block of the semiseparable matrix, applied directly;
  2. each chunk's own final state (from its inputs alone);
  3. the states entering each chunk, by the recurrence over the T/C chunk states;
  4. each entering state read out through C, decayed to each position of the chunk.

Every exponent is a segment sum of non-positive log-decays, so every exp is <= 1: no
overflow and no cancellation. The largest tensors are [B, H, T/C, C, C] and the chunk
states [B, T/C, H, P, N]; no T x T tensor is formed.

Faster than the paper's listing on CPU (`python -m benches.zoo.bench_kernels ssd`), with the
same results:
  - B and C stay in their G groups: C_t . B_s is computed once per group, not per head,
    and the state einsums contract each group's B or C with its H/G heads at once;
  - the decay of step 1 is built with the sum along the contiguous dim ([s, t] layout,
    see `decay_within`), and the causal mask goes on C . B (per group), not on each head;
  - step 3 is a loop over chunks, O(T/C), where the listing's segsum over chunk totals
    costs a (T/C + 1)^2 matrix product per state element.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..precision import upcast_16bit


def chunked_ssd(x, dt, A, B, C, *, initial_state=None, chunk_size: int = 64):
    out_dtype, T = x.dtype, x.shape[1]
    x, dt, A, B, C, initial_state = upcast_16bit(x, dt, A, B, C, initial_state)
    chunk = min(chunk_size, T)
    pad = -T % chunk
    if pad:  # dt = 0 there: no decay and no input, so the final state is unchanged
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    b, n = x.shape[0], x.shape[1] // chunk
    xd = (x * dt[..., None]).unflatten(1, (n, chunk))  # [B, T/C, C, H, P]: dt_s x_s
    a = (dt * A).unflatten(1, (n, chunk))  # [B, T/C, C, H]
    a_cum = torch.cumsum(a, dim=2)  # [B, T/C, C, H]
    B, C = B.unflatten(1, (n, chunk)), C.unflatten(1, (n, chunk))  # [B, T/C, C, G, N]
    y = diagonal_blocks(xd, a, B, C)  # [B, T/C, C, H, P], a permuted view
    entering, final = pass_states(chunk_states(xd, a_cum, B), a_cum, initial_state)
    # the contiguous term first: a sum takes its first operand's layout, and with it the
    # reshape below is a view, not a copy
    y = state_outputs(entering, a_cum, C) + y
    return y.reshape(b, n * chunk, *x.shape[2:])[:, :T].to(out_dtype), final


def decay_within(a: torch.Tensor) -> torch.Tensor:
    """exp(a_{s+1} + ... + a_t) [..., C, C] at [s, t] for s <= t (1 on the diagonal) from
    the log-decays a [..., C], and 1 for s > t, where the caller masks it out.

    The stable segment sum of `reference.segsum` (a masked cumulative sum, not
    cumsum_t - cumsum_s, which cancels once the decays are large), transposed so that the
    sum runs along the contiguous last dim, and with exp(0) = 1 left above it instead of
    -inf: one pass less per head, and the mask costs one pass per group instead.
    """
    L = a.shape[-1]
    after = torch.ones(L, L, dtype=torch.bool, device=a.device).triu(1)  # t > s
    return torch.exp(torch.cumsum(torch.where(after, a[..., None, :], 0.0), dim=-1))


def diagonal_blocks(xd, a, B, C) -> torch.Tensor:
    """Step 1: y_t = sum_{s <= t in the chunk} (C_t . B_s) exp(a_{s+1} + ... + a_t) dt_s x_s.

    xd [B, T/C, C, H, P], a [B, T/C, C, H], B, C [B, T/C, C, G, N] -> [B, T/C, C, H, P]
    (a permuted view)."""
    b, n, L, H, P = xd.shape
    G = B.shape[3]
    causal = torch.ones(L, L, dtype=torch.bool, device=xd.device).triu()  # s <= t
    cb = torch.einsum("bcsgn,bctgn->bgcst", B, C).masked_fill(~causal, 0)  # [B, G, T/C, C, C]
    decay = decay_within(a.permute(0, 3, 1, 2)).unflatten(1, (G, H // G))  # [B,G,H/G,T/C,C,C]
    scores = (cb[:, :, None] * decay).flatten(1, 2)  # [B, H, T/C, C(s), C(t)]
    y = scores.transpose(-1, -2) @ xd.permute(0, 3, 1, 2, 4)  # [B, H, T/C, C, P]
    return y.permute(0, 2, 3, 1, 4)


def chunk_states(xd, a_cum, B) -> torch.Tensor:
    """Step 2: each chunk's final state from its own inputs, sum_s exp(a_{s+1} + ... +
    a_end) dt_s x_s B_s^T: [B, T/C, H, P, N], each group's B against its H/G heads at once."""
    b, n, L, H, P = xd.shape
    G = B.shape[3]
    to_end = torch.exp(a_cum[:, :, -1:] - a_cum)  # [B, T/C, C, H]
    xw = (xd * to_end[..., None]).view(b, n, L, G, H // G * P)
    states = xw.permute(0, 1, 3, 4, 2) @ B.transpose(2, 3)  # [B, T/C, G, H/G * P, N]
    return states.view(b, n, H, P, -1)


def pass_states(states, a_cum, initial_state):
    """Step 3: the state entering each chunk [B, T/C, H, P, N] and the final one
    [B, H, P, N], by the recurrence h_c = exp(sum of chunk c's a) h_{c-1} + states_c."""
    b, n, H, P, N = states.shape
    if initial_state is None:
        state = states.new_zeros(b, H, P, N)
    else:
        state = initial_state.to(states.dtype)
    chunk_decay = torch.exp(a_cum[:, :, -1])[..., None, None]  # [B, T/C, H, 1, 1]
    entering = []
    # unbind, not indexing: each index's backward would write a full-size zero gradient
    for decay, own in zip(chunk_decay.unbind(1), states.unbind(1), strict=True):
        entering.append(state)
        state = decay * state + own
    return torch.stack(entering, dim=1), state


def state_outputs(entering, a_cum, C) -> torch.Tensor:
    """Step 4: y_t = exp(a_1 + ... + a_t) C_t . h_entering, per chunk: [B, T/C, C, H, P];
    each group's C against its H/G heads at once."""
    b, n, H, P, N = entering.shape
    L, G = C.shape[2], C.shape[3]
    y = C.transpose(2, 3) @ entering.view(b, n, G, H // G * P, N).transpose(-1, -2)
    y = y.transpose(2, 3).reshape(b, n, L, H, P)  # [B, T/C, C, H, P]
    return y * torch.exp(a_cum)[..., None]
