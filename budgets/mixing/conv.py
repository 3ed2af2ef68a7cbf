"""The token mixing of a gated short convolution: lfm2's `B·x`, a depthwise causal
convolution of width L, then `C·`.

    M = conv_mixing(b, c, weight)            # [B, Ch, T, T] fp64, one matrix per channel
    f = conv_factors(b, c, weight)           # its past->future block, rank <= L - 1
    caps = conv_caps(block, T, d_model, channels, width, params)

Channel c mixes its inputs x by

    y_t = C_t sum_{j < L} w[j] B_{t-j} x_{t-j}     M[t, s] = C_t w[t - s] B_s,  0 <= t - s < L

(w[j] the tap that reads j tokens back: a conv1d weight flipped, as torch correlates). M is
banded, so its past->future block M[T/2:, :T/2] is nonzero only in an (L-1) x (L-1) corner:
its rank is at most L - 1 per channel, whatever the gates. Torch only.
"""

from __future__ import annotations

import torch

from ..budget import RankBudget
from ..rank.factored import FactoredMixing


def taps(weight: torch.Tensor) -> torch.Tensor:
    """w [Ch, L]: w[:, j] weighs the input j tokens back, from a depthwise conv1d weight
    [Ch, 1, L] or [Ch, L] (torch correlates: its last tap reads the current token)."""
    return weight.reshape(weight.shape[0], -1).flip(-1)  # [Ch, L]


def _band(w: torch.Tensor, T: int) -> torch.Tensor:
    """The Toeplitz band W[c, t, s] = w[c, t - s] for 0 <= t - s < L, else 0: [Ch, T, T]."""
    lag = torch.arange(T, device=w.device)[:, None] - torch.arange(T, device=w.device)[None, :]
    inside = (lag >= 0) & (lag < w.shape[-1])  # [T, T]
    picked = w[:, lag.clamp(0, w.shape[-1] - 1)]  # [Ch, T, T]
    return picked * inside


def conv_mixing(b: torch.Tensor, c: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """M [B, Ch, T, T] in fp64 from the gates b, c [B, Ch, T] and the conv weight."""
    b, c = b.double(), c.double()
    band = _band(taps(weight).double(), b.shape[-1])  # [Ch, T, T]
    return c[..., :, None] * band * b[..., None, :]  # [B, Ch, T, T]


def conv_factors(b: torch.Tensor, c: torch.Tensor, weight: torch.Tensor) -> FactoredMixing:
    """M's past->future block as L R^T, [B, Ch, T - T/2, L-1] x [B, Ch, T/2, L-1] (fp32):
    column j of R picks the past token h-1-j (times its gate B), column j of L weighs it
    for each future token t by C_t w[t - (h-1-j)]."""
    w = taps(weight).double()  # [Ch, L]
    width, T = w.shape[-1], b.shape[-1]
    h, r = T // 2, max(width - 1, 1)
    j = torch.arange(r, device=b.device)
    s = h - 1 - j  # the past token column j picks, [r]
    t = torch.arange(h, T, device=b.device)
    lag = t[:, None] - s[None, :]  # [T - h, r]
    live = (lag < width) & (s >= 0)[None, :]
    Lw = w[:, lag.clamp(max=width - 1)] * live  # [Ch, T - h, r]
    L = c.double()[..., h:, None] * Lw  # [B, Ch, T - h, r]
    pick = (torch.arange(h, device=b.device)[:, None] == s[None, :]).double()  # [h, r]
    R = b.double()[..., :h, None] * pick  # [B, Ch, h, r]
    return FactoredMixing(L.float(), R.float())


def conv_caps(block: str, seq_len: int, d_model: int, channels: int, width: int,
              params: int) -> RankBudget:
    """A gated short convolution's caps: per channel the past->future block has rank
    <= L - 1 (its band's corner) and each token's mixing weight C_t w B_s is a product of
    scalars (logits 1); the cache holds the last L - 1 inputs of every channel."""
    T, Ch, L = seq_len, channels, width
    return RankBudget(block=block, seq_len=T, n_heads=Ch, mixing=min(L - 1, T // 2),
                      logits=1, value_path=min(d_model, Ch), inference=min(L - 1, Ch),
                      params=params, cache_elements=Ch * (L - 1),
                      # projections, the gates, the conv
                      flops_per_token=2 * params + 2 * Ch * (L + 2))
