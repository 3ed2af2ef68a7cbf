"""The token mixing of an SSD scan: Mamba-2's state-space duality, and Mamba-1's selective
scan held in the same form (each channel a head of width P = 1, one decay per state entry).

    M = ssd_mixing(dt, A, B, C)                # [B, H, T, T], in the inputs' dtype
    f = ssd_factors(dt, A, B, C)               # its past->future block, rank <= N
    caps = ssd_caps(block, T, d_model, heads, head_dim, state, params)

with dt [B, T, H] the step sizes as the scan uses them (bias, softplus and clamp applied),
A [H] (one decay per head) or [H, N] (one per head and state entry), B, C [B, T, G, N] (head
h reads group h // (H / G)). Each head runs state_t = exp(A dt_t) state_{t-1} + dt_t x_t B_t^T
from zero and reads y_t = state_t C_t, so y = M x per head and channel with

    M[t, s] = sum_n C_t[n] B_s[n] exp(A[n] (dt_{s+1} + ... + dt_t)) dt_s     (s <= t; 0 above)

an N-semiseparable matrix (Dao & Gu 2024; Mamba's "hidden attention", Ali et al. 2024):
every block below the diagonal, the past->future block M[T/2:, :T/2] included, is a sum of N
outer products, so its rank is <= N whatever the inputs.

The decays are segment sums of the log-decays a = A dt, summed over each segment itself,
never as cumsum_t - cumsum_s: that difference cancels once the running sum is large (long
T, strong decay) and reads exp(0) = 1 where the true decay underflows. Everything is
computed in the dtype given: the zoo's reference passes fp32, the captures fp64. Torch only.
"""

from __future__ import annotations

import torch

from ..budget import RankBudget
from ..rank.factored import FactoredMixing


def expand_groups(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, G, N] -> [B, T, H, N]: group g serves heads g*H/G ... (g+1)*H/G - 1, as
    Mamba-2's kernels share one B and C among a group's heads."""
    return t.repeat_interleave(n_heads // t.shape[2], dim=2)


def segsum(a: torch.Tensor) -> torch.Tensor:
    """Stable segment sum [..., T] -> [..., T, T]: out[i, j] = a_{j+1} + ... + a_i for j <= i
    (0 on the diagonal), -inf above it, so that exp(out) is the causal decay matrix.

    A masked cumulative sum down each column, not cumsum_i - cumsum_j, which cancels
    catastrophically once the cumulative log-decay is large.
    """
    T = a.shape[-1]
    below = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)  # j < i
    a = a[..., :, None].expand(*a.shape, T).masked_fill(~below, 0)  # [..., i, j] = a_i, i > j
    out = torch.cumsum(a, dim=-2)  # sum of a_k over j < k <= i
    return out.masked_fill(~below.logical_or(torch.eye(T, dtype=torch.bool, device=a.device)),
                           float("-inf"))


def check_scan(dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    """Raises ValueError naming the shape that does not fit the others."""
    if dt.dim() != 3:
        raise ValueError(f"dt must be [B, T, H], got shape {tuple(dt.shape)}")
    H = dt.shape[-1]
    if A.dim() not in (1, 2) or A.shape[0] != H:
        raise ValueError(f"A must be [H] or [H, N] with H = {H}, got shape {tuple(A.shape)}")
    for name, t in (("B", B), ("C", C)):
        if t.dim() != 4 or t.shape[:2] != dt.shape[:2] or H % t.shape[2]:
            raise ValueError(f"{name} must be [B, T, G, N] with [B, T] = {list(dt.shape[:2])} "
                             f"and G dividing H = {H}, got shape {tuple(t.shape)}")
    if A.dim() == 2 and A.shape[1] != B.shape[-1]:
        raise ValueError(f"A [H, N] must have N = {B.shape[-1]} (B's state), got shape "
                         f"{tuple(A.shape)}")


def _heads(dt, B, C) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dt [B, H, T], and B, C per head [B, H, T, N]: the layout every product below takes."""
    H = dt.shape[-1]
    return (dt.transpose(1, 2), expand_groups(B, H).transpose(1, 2),
            expand_groups(C, H).transpose(1, 2))


def ssd_mixing(dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor) -> torch.Tensor:
    """M [B, H, T, T] with y = M x per head (module docstring), in the inputs' dtype."""
    check_scan(dt, A, B, C)
    dth, Bh, Ch = _heads(dt, B, C)  # [B, H, T], [B, H, T, N] x 2
    if A.dim() == 2:
        return _per_entry_mixing(dth, A, Bh, Ch)
    # one decay per head: it factors out of the sum over n, one T x T decay per head
    decay = torch.exp(segsum(dth * A[:, None]))  # [B, H, T, T]
    cb = torch.einsum("bhtn,bhsn->bhts", Ch, Bh)  # [B, H, T, T]
    return cb * decay * dth[..., None, :]  # dt_s scales column s


def _per_entry_mixing(dt: torch.Tensor, A: torch.Tensor, Bh: torch.Tensor,
                      Ch: torch.Tensor) -> torch.Tensor:
    """M [B, H, T, T] for A [H, N]: each state entry n decays at its own rate, so the sum
    over n is taken term by term (dt [B, H, T], B and C [B, H, T, N])."""
    T = dt.shape[-1]
    gap = segsum(dt)  # sum of dt_u over s < u <= t, [B, H, T, T]; -inf above
    causal = torch.ones(T, T, dtype=torch.bool, device=dt.device).tril()
    M = torch.zeros_like(gap)
    for n in range(A.shape[-1]):
        # where, not a product with the mask: A * -inf above the diagonal is +inf (or NaN)
        decay = torch.where(causal, torch.exp(A[None, :, n, None, None] * gap), 0)
        M += Ch[..., n, None] * Bh[..., None, :, n] * decay  # [B, H, T, T]
    return M * dt[..., None, :]


def _log_decay(sums: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Segment sums [B, H, S] of the steps (dt A for A [H], dt for A [H, N]) -> the log
    decay of each state entry, [B, H, S, N] (or [B, H, S, 1], shared by all N)."""
    return sums[..., None] if A.dim() == 1 else A[None, :, None, :] * sums[..., None]


def ssd_factors(dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor) -> FactoredMixing:
    """M's past->future block M[h:, :h] (h = T/2) as L R^T, L [B, H, T - h, N] and
    R [B, H, h, N] in fp32 (the spectra engine's dtype; computed in the inputs' dtype).

    For t >= h > s the decay from s to t splits at the last past token h - 1:
        M[t, s] = sum_n C_t[n] exp(A[n] (dt_h + ... + dt_t)) . B_s[n] exp(A[n] (dt_{s+1} +
                  ... + dt_{h-1})) dt_s
    so both factors decay (never grow) and the block is their product, rank <= N. Each
    exponent is summed over its own segment (a running sum from h on, a sum back from
    h - 1), never a difference of running sums, as in segsum.
    """
    check_scan(dt, A, B, C)
    dth, Bh, Ch = _heads(dt, B, C)  # [B, H, T], [B, H, T, N] x 2
    h = dth.shape[-1] // 2
    steps = dth * A[:, None] if A.dim() == 1 else dth  # [B, H, T]
    ahead = steps[..., h:].cumsum(-1)  # sum over h <= u <= t, [B, H, T - h]
    back = steps[..., 1:h].flip(-1).cumsum(-1).flip(-1)  # sum over s < u <= h - 1, s < h - 1
    back = torch.cat([back, torch.zeros_like(steps[..., :1])], -1)  # s = h - 1: 0, [B, H, h]
    L = Ch[..., h:, :] * torch.exp(_log_decay(ahead, A))  # [B, H, T - h, N]
    R = Bh[..., :h, :] * torch.exp(_log_decay(back, A)) * dth[..., :h, None]  # [B, H, h, N]
    return FactoredMixing(L.float(), R.float())


def ssd_caps(block: str, seq_len: int, d_model: int, heads: int, head_dim: int, state: int,
             params: int, *, conv_cache: int = 0,
             projection_flops: int | None = None) -> RankBudget:
    """One SSD layer's caps: per head M is N-semiseparable (past->future rank <= N), the
    logits C_t . B_s have rank <= N, the state is P x N per head (rank <= min(N, P)).

    conv_cache: elements of a short convolution's state cached beside the SSM state (the
    zoo block counts its own; a captured scan knows none). projection_flops: FLOPs per
    token outside the scan, by default 2 * params (one multiply-add per parameter).
    """
    T, H, P, N = seq_len, heads, head_dim, state
    outside = 2 * params if projection_flops is None else projection_flops
    return RankBudget(block=block, seq_len=T, n_heads=H, mixing=min(N, T // 2), logits=N,
                      value_path=min(d_model, H * P), inference=min(N, P), params=params,
                      cache_elements=H * P * N + conv_cache,
                      # per head and token: the state's decay and write (4 P N), its read (2 P N)
                      flops_per_token=outside + 6 * H * P * N)
