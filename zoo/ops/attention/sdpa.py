"""torch's fused SDPA: the CPU flash kernel here; flash/cuDNN/memory-efficient on CUDA."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .banded import banded_sdpa, worth_blocking
from .reference import causal_band, expand_kv


@functools.lru_cache(maxsize=32)
def band_mask(q_len: int, kv_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Cached per (Tq, Tk, W, device): rebuilding a T x T mask every step costs real time."""
    return causal_band(q_len, kv_len, window, device)


def sdpa_attention(q, k, v, *, window: int | None, scale: float) -> torch.Tensor:
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if window is not None and window >= kv_len:
        window = None  # every key is inside the window: no band to mask
    if worth_blocking(q_len, kv_len, window):  # a long band: O(T W) in blocks, not O(T^2)
        return banded_sdpa(q, k, v, window=window, scale=scale)
    mask, is_causal = None, False
    if window is None and q_len == kv_len:
        is_causal = True  # top-left and bottom-right alignment agree when Tq = Tk
    elif window is not None or q_len > 1:
        mask = band_mask(q_len, kv_len, window, q.device)  # never together with is_causal
    gqa = k.shape[1] != q.shape[1]
    if gqa and mask is not None and q.is_cuda:
        # CUDA's masked kernels do not take unequal head counts and would fall to MATH.
        k, v, gqa = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1]), False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          scale=scale, enable_gqa=gqa)
