"""The token mixing of the delta rule: DeltaNet, Gated DeltaNet (GDN), Kimi Delta Attention.

    M = delta_mixing(q, k, beta, log_gate)     # [B, H, T, T], in q's dtype
    f = delta_factors(q, k, beta, log_gate)    # its past->future block, L R^T, rank <= K
    caps = delta_caps(block, T, d_model, heads, K, V, params)

Each head runs, from a zero state S (K x V),

    S_t = (I - b_t k_t k_t^T) D_t S_{t-1} + b_t k_t v_t^T,     o_t = S_t^T q_t

with D_t = I (DeltaNet), a_t I (GDN: one gate per head and token, log_gate [B, H, T]) or
diag(a_t) (KDA: one gate per key channel, log_gate [B, H, T, K]). This is fla's order
(`naive_recurrent_kda`, `chunk_kda`: decay the state, then the delta update); for a scalar
gate it reads S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T. q and k are as the
recurrence reads them (L2-normed, q scaled), log_gate = log a_t <= 0.

Every value channel of a head is mixed by one T x T matrix. With w_t = b_t (v_t - (D_t
S_{t-1})^T k_t), what token t writes, S_t = sum_{s<=t} Gamma(t, s) k_s w_s^T where
Gamma(t, s) = D_t ... D_{s+1} = diag(exp(G_t - G_s)), G the cumulative log gate, so

    o = (Q K^T . Gamma . tril) W,    (I + strict_tril(diag(b) (K K^T . Gamma))) W = diag(b) V
    M = (Q K^T . Gamma . tril) (I + strict_tril(diag(b) (K K^T . Gamma)))^-1 diag(b)

where (X Y^T . Gamma)[t, s] = sum_c x_tc y_sc exp(G_tc - G_sc) (`gated_scores`).

Past->future: v_s (s < h) reaches o_t (t >= h) only through the state at the split h - 1,
so with A_t = (I - b_t k_t k_t^T) D_t and Phi(t, r) = A_t ... A_{r+1} (K x K),

    M[t, s] = q_t^T Phi(t, h-1) Phi(h-1, s) b_s k_s = l_t . r_s

l_t = Phi(t, h-1)^T q_t, r_s = b_s Phi(h-1, s) k_s: M[h:, :h] = L R^T has rank <= K.
Torch only: the zoo's kernels and block and the Hugging Face capture import this.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..budget import RankBudget
from ..rank.factored import FactoredMixing

# query rows per block where a per-channel gate needs pairwise decays: such a block holds
# [..., ROWS, ROWS, K] at once, never [..., T, T, K]
ROWS = 16


def gate_columns(log_gate: torch.Tensor | None) -> torch.Tensor | None:
    """The log gate with a channel dim: [B, H, T, 1] from a scalar gate [B, H, T], a
    per-channel one [B, H, T, K] as it is; None stays None (no decay)."""
    if log_gate is None:
        return None
    return log_gate.unsqueeze(-1) if log_gate.dim() == 3 else log_gate


def cumulative(log_gate: torch.Tensor | None) -> torch.Tensor | None:
    """G, the running sum of the log gate over tokens: [B, H, T, 1 | K] (None: no decay)."""
    columns = gate_columns(log_gate)
    return None if columns is None else columns.cumsum(-2)


def gated_scores(x: torch.Tensor, y: torch.Tensor, G: torch.Tensor | None,
                 rows: int = ROWS) -> torch.Tensor:
    """(X Y^T . Gamma . tril) [..., T, T]: entry (i, j) = sum_c x_ic y_jc exp(G_ic - G_jc)
    for j <= i, 0 above; x, y [..., T, K], G [..., T, 1 | K] cumulative (or None: no decay).

    Every exponent is G_i - G_j with i >= j, <= 0 for log gates <= 0: nothing overflows. A
    per-channel gate is split at each row block's first row r: exp(G_i - G_r) exp(G_r - G_j)
    for the columns left of the block (one matmul, both factors <= 1), pairwise inside it.
    x may carry extra leading dims over y and G (several queries against one set of keys)."""
    if G is None:
        return torch.tril(x @ y.mT)
    T = x.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    if G.shape[-1] == 1:  # a scalar gate: one [T, T] decay
        gap = (G - G.mT).masked_fill(~causal, float("-inf"))  # [..., T, T]
        return (x @ y.mT) * torch.exp(gap)
    blocks = []
    for i0 in range(0, T, rows):
        i1 = min(i0 + rows, T)
        xi, Gi, ref = x[..., i0:i1, :], G[..., i0:i1, :], G[..., i0:i0 + 1, :]
        left = (xi * torch.exp(Gi - ref)) @ (y[..., :i0, :] * torch.exp(ref - G[..., :i0, :])).mT
        gap = Gi[..., :, None, :] - Gi[..., None, :, :]  # [..., r, r, K]
        gap = gap.masked_fill(~causal[i0:i1, i0:i1, None], float("-inf"))
        inside = torch.einsum("...ik,...jk,...ijk->...ij", xi, y[..., i0:i1, :], torch.exp(gap))
        blocks.append(F.pad(torch.cat([left, inside], -1), (0, T - i1)))  # [..., r, T]
    return torch.cat(blocks, -2)  # [..., T, T]


def delta_mixing(q: torch.Tensor, k: torch.Tensor, beta: torch.Tensor,
                 log_gate: torch.Tensor | None = None) -> torch.Tensor:
    """M [B, H, T, T] in q's dtype from q, k [B, H, T, K], beta [B, H, T] and the log gate
    (None, [B, H, T] or [B, H, T, K]): o = M v for every value channel, exactly."""
    # Q K^T . Gamma . tril and K K^T . Gamma . tril in one call: the decays are formed once
    scores, keys = gated_scores(torch.stack([q, k]), k, cumulative(log_gate)).unbind(0)
    A = keys.tril(-1) * beta[..., :, None]  # strict_tril(diag(b) (K K^T . Gamma))
    # X (I + A) = scores, solved from the right; A's zero diagonal stands for I's ones
    X = torch.linalg.solve_triangular(A, scores, upper=False, left=False, unitriangular=True)
    return X * beta[..., None, :]  # [B, H, T, T]


def _decay(log_gate: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """D_t as a column [B, H, 1 | K, 1] (None: no decay)."""
    columns = gate_columns(log_gate)
    return None if columns is None else torch.exp(columns[:, :, t, :, None])


def delta_factors(q: torch.Tensor, k: torch.Tensor, beta: torch.Tensor,
                  log_gate: torch.Tensor | None = None) -> FactoredMixing:
    """M's past->future block M[h:, :h] (h = T/2) as L R^T, L [B, H, T - h, K], R [B, H, h,
    K], in q's dtype: l_t = Phi(t, h-1)^T q_t forward from the split, r_s = b_s Phi(h-1, s)
    k_s backward from it (module docstring). Each sweep carries one K x K product per head,
    so nothing grows with T but the factors."""
    B, H, T, K = k.shape
    h = T // 2
    eye = torch.eye(K, dtype=k.dtype, device=k.device).expand(B, H, K, K)
    Z, L = eye, []  # Z = Phi(t, h-1)
    for t in range(h, T):
        D, kt = _decay(log_gate, t), k[:, :, t, :, None]  # [B, H, K, 1]
        Z = Z if D is None else D * Z
        Z = Z - beta[:, :, t, None, None] * kt @ (kt.mT @ Z)  # (I - b k k^T) D Z
        L.append((Z.mT @ q[:, :, t, :, None])[..., 0])  # [B, H, K]
    Y, R = eye, []  # Y = Phi(h-1, s)
    for s in range(h - 1, -1, -1):
        D, ks = _decay(log_gate, s), k[:, :, s, :, None]
        R.append(beta[:, :, s, None] * (Y @ ks)[..., 0])  # [B, H, K]
        Y = Y - beta[:, :, s, None, None] * (Y @ ks) @ ks.mT  # Y (I - b k k^T)
        Y = Y if D is None else Y * D.mT  # ... D_s, scaling columns
    return FactoredMixing(torch.stack(L, 2), torch.stack(R[::-1], 2))


def delta_caps(block: str, seq_len: int, d_model: int, n_heads: int, key_dim: int,
               value_dim: int, params: int, conv_state: int = 0,
               proj_flops: int | None = None) -> RankBudget:
    """The delta rule's caps over n_heads heads of the recurrence (value heads): its
    past->future block has rank <= K (one K x K product carries the past), the logits
    q . k rank K, the state K x V per head; `conv_state` elements of a short convolution
    are cached beside it (its last inputs). FLOPs: the projections (`proj_flops`, else 2
    per parameter) and per head and token the decay, the read by k, the rank-1 write and
    the read-out by q: 7 K V."""
    T, H, K, V = seq_len, n_heads, key_dim, value_dim
    return RankBudget(block=block, seq_len=T, n_heads=H, mixing=min(K, T // 2), logits=K,
                      value_path=min(d_model, H * V), inference=min(K, V), params=params,
                      cache_elements=H * K * V + conv_state,
                      flops_per_token=(2 * params if proj_flops is None else proj_flops)
                      + 7 * H * K * V)
