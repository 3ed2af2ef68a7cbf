"""Sliding-window attention in blocks: SDPA over a band costs O(T W), not O(T^2).

A bool band mask does not make SDPA skip the masked scores: the CPU flash kernel still
computes all T x T of them (measured: at T = 8192 a W = 128 band mask costs twice the full
causal call). Here queries go in blocks of C; block b (positions bC .. bC + C - 1) sees
only keys bC - W .. bC + C - 1, so each block is one small SDPA call on [C, C + W] and all
blocks run as one batched call. Keys are padded with W zeros in front; a per-block mask
[nb, C, C + W] (cached per (T, W, C, device)) keeps the band and hides the padding.
Queries past T (padding to a multiple of C) are computed and dropped.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .reference import expand_kv
from .sinks import with_sink_column, with_sink_key


def block_size(window: int) -> int:
    """Queries per block: the window itself, but at least 64 so that tiny windows still
    make calls large enough to amortize the kernel's overhead."""
    return max(window, 64)


def worth_blocking(q_len: int, kv_len: int, window: int | None) -> bool:
    """Blocks pay off once the sequence spans a few blocks; only prefill (Tq = Tk) is blocked."""
    return window is not None and q_len == kv_len and kv_len >= 2 * block_size(window) + window


@functools.lru_cache(maxsize=32)
def block_band_mask(seq_len: int, window: int, block: int, device: torch.device) -> torch.Tensor:
    """True where query i of block b may see key j of that block's [C + W] key slab."""
    n_blocks = -(-seq_len // block)
    i = torch.arange(block, device=device)[:, None]  # [C, 1] query within its block
    j = torch.arange(block + window, device=device)[None, :]  # [1, C + W] key within the slab
    b = torch.arange(n_blocks, device=device)[:, None, None]  # [nb, 1, 1]
    # key j of block b sits at position bC - W + j, query i at bC + i: the band is
    # 0 <= (bC + i) - (bC - W + j) < W, i.e. i < j <= i + W; positions < 0 are padding.
    return (j > i) & (j <= i + window) & (j >= window - b * block)  # [nb, C, C + W]


def banded_sdpa(q, k, v, *, window: int, scale: float,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, T, K], k [B, G, T, K], v [B, G, T, V] -> [B, H, T, V], W keys incl. self;
    sink logits [H], when given, as one more key of every slab (sinks.py)."""
    B, H, T, K = q.shape
    G, V = k.shape[1], v.shape[-1]
    C = block_size(window)
    nb = -(-T // C)
    pad = nb * C - T
    q_blocks = F.pad(q, (0, 0, 0, pad)).view(B, H, nb, C, K).transpose(1, 2)  # [B, nb, H, C, K]
    q_blocks = q_blocks.reshape(B * nb, H, C, K)

    def slabs(t: torch.Tensor) -> torch.Tensor:  # [B, G, T, d] -> [B * nb, G, C + W, d]
        d = t.shape[-1]
        padded = F.pad(t, (0, 0, window, pad))  # [B, G, W + nb C, d]
        windows = padded.unfold(2, C + window, C)  # [B, G, nb, d, C + W]
        return windows.permute(0, 2, 1, 4, 3).reshape(B * nb, G, C + window, d)

    k_slabs, v_slabs = slabs(k), slabs(v)
    mask = block_band_mask(T, window, C, q.device)  # [nb, C, C + W]
    mask = mask.expand(B, nb, C, C + window).reshape(B * nb, 1, C, C + window)
    if sinks is not None:  # [.., K + 1] queries and keys, the sink key last in each slab
        q_blocks, k_slabs, v_slabs = with_sink_key(q_blocks, k_slabs, v_slabs, sinks, scale)
        mask = with_sink_column(mask)
    gqa = G != H
    if gqa and q.is_cuda:  # CUDA's masked kernels do not take unequal head counts
        k_slabs, v_slabs, gqa = expand_kv(k_slabs, H), expand_kv(v_slabs, H), False
    o = F.scaled_dot_product_attention(q_blocks, k_slabs, v_slabs, attn_mask=mask, scale=scale,
                                       enable_gqa=gqa)  # [B * nb, H, C, V]
    o = o[..., :V]  # [B * nb, H, C, V]: a sink's padding cut
    return o.reshape(B, nb, H, C, V).transpose(1, 2).reshape(B, H, nb * C, V)[:, :, :T]
