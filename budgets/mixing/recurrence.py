"""The token mixing of a diagonal linear recurrence: recurrent_gemma's RG-LRU, one scalar
state per channel.

    M = recurrence_mixing(log_a, b)          # [B, Ch, T, T] fp64, one matrix per channel
    f = recurrence_factors(log_a, b)         # its past->future block, rank <= 1
    caps = recurrence_caps(block, T, d_model, channels, params)

Channel c runs h_t = a_t h_{t-1} + b_t x_t from h = 0, so

    M[t, s] = b_s prod_{s < u <= t} a_u          (s <= t; 0 above)

with log_a the log decay [B, Ch, T] (-inf where a_t = 0: a reset, a document's first
token, cuts every product that crosses it). The past->future block M[h:, :h] is
(prod_{h <= u <= t} a_u)(prod_{s < u < h} a_u b_s): an outer product, rank <= 1. Torch only.
"""

from __future__ import annotations

import torch

from ..budget import RankBudget
from ..rank.factored import FactoredMixing
from .ssd import segsum


def recurrence_mixing(log_a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """M [B, Ch, T, T] in fp64 from the log decay and input scale b, both [B, Ch, T]: the
    decay is SSD's segment sum (budgets/mixing/ssd.py segsum), in which a reset's -inf
    zeroes every product across it and no difference of running sums cancels."""
    return torch.exp(segsum(log_a.double())) * b.double()[..., None, :]  # [B, Ch, T, T]


def recurrence_factors(log_a: torch.Tensor, b: torch.Tensor) -> FactoredMixing:
    """M's past->future block as L R^T, [B, Ch, T - T/2, 1] x [B, Ch, T/2, 1] (fp32), the
    decay split at the last past token h - 1, each side summed over its own segment (from
    h on, and back from h - 1), so that both factors are at most 1 (times b)."""
    log_a = log_a.double()
    h = log_a.shape[-1] // 2
    ahead = log_a[..., h:].cumsum(-1)  # sum over h <= u <= t, [B, Ch, T - h]
    back = log_a[..., 1:h].flip(-1).cumsum(-1).flip(-1)  # sum over s < u <= h - 1
    back = torch.cat([back, torch.zeros_like(log_a[..., :1])], -1)  # s = h - 1: 0, [B, Ch, h]
    L = torch.exp(ahead)
    R = torch.exp(back) * b.double()[..., :h]
    return FactoredMixing(L[..., None].float(), R[..., None].float())


def recurrence_caps(block: str, seq_len: int, d_model: int, channels: int,
                    params: int) -> RankBudget:
    """A diagonal recurrence's caps: per channel a state of one scalar, so the past->future
    block has rank <= 1 and the mixing weight is a product of scalars (logits 1); the cache
    is the state vector of all channels, one row."""
    T, Ch = seq_len, channels
    return RankBudget(block=block, seq_len=T, n_heads=Ch, mixing=min(1, T // 2), logits=1,
                      value_path=min(d_model, Ch), inference=1, params=params,
                      cache_elements=Ch,
                      # projections and gates, then per channel the update and read-out
                      flops_per_token=2 * params + 4 * Ch)
