"""The token mixing of linear attention under a per-head decay: MiniMax's lightning
attention, one constant decay exp(-slope) per head.

    M = decayed_mixing(q, k, slope)           # [B, H, T, T] fp64
    f = decayed_factors(q, k, slope)          # its past->future block, rank <= K
    caps = decayed_caps(block, T, d_model, heads, K, V, params)

Each head reads its values v by

    o_t = sum_{s <= t} (q_t . k_s) exp(-slope (t - s)) v_s       M[t, s] = q_t . k_s lambda^(t-s)

which lightning attention computes in blocks (intra-block Q K^T under the decay mask, inter-
block through the decayed state K^T V): no softmax, no normalization. The past->future
block factors as (q_t lambda^(t-h+1)) . (k_s lambda^(h-1-s)): rank <= K. Torch only.
"""

from __future__ import annotations

import torch

from ..budget import RankBudget
from ..rank.factored import FactoredMixing


def _steps(T: int, slope: torch.Tensor, device) -> torch.Tensor:
    """-slope * t per head: the log decay accumulated by token t, [1, H, T] fp64."""
    t = torch.arange(T, device=device, dtype=torch.float64)
    return -slope.double().reshape(1, -1, 1) * t


def decayed_mixing(q: torch.Tensor, k: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """M [B, H, T, T] in fp64 from q, k [B, H, T, K] and the decay rate slope [H] (> 0)."""
    T = q.shape[-2]
    G = _steps(T, slope, q.device)  # [1, H, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf"))
    return (q.double() @ k.double().mT) * torch.exp(decay)  # [B, H, T, T]


def decayed_factors(q: torch.Tensor, k: torch.Tensor, slope: torch.Tensor) -> FactoredMixing:
    """M's past->future block as L R^T, [B, H, T - T/2, K] x [B, H, T/2, K] (fp32), the
    decay split at the last past token so that neither factor grows."""
    T = q.shape[-2]
    h = T // 2
    G = _steps(T, slope, q.device)[..., None]  # [1, H, T, 1]
    pivot = G[..., h - 1:h, :]
    L = q.double()[..., h:, :] * torch.exp(G[..., h:, :] - pivot)
    R = k.double()[..., :h, :] * torch.exp(pivot - G[..., :h, :])
    return FactoredMixing(L.float(), R.float())


def decayed_caps(block: str, seq_len: int, d_model: int, heads: int, key_dim: int,
                 value_dim: int, params: int) -> RankBudget:
    """Linear attention's caps, as zoo's linear block declares them with F = K: the
    past->future block of q k^T under a decay has rank <= K, the state K x V per head."""
    T, H, K, V = seq_len, heads, key_dim, value_dim
    return RankBudget(block=block, seq_len=T, n_heads=H, mixing=min(K, T // 2), logits=K,
                      value_path=min(d_model, H * V), inference=min(K, V), params=params,
                      cache_elements=H * K * V,
                      # projections, then per head the state update and its read-out
                      flops_per_token=2 * params + 4 * H * K * V)
