"""torch's fused SDPA: the CPU flash kernel here; flash/cuDNN/memory-efficient on CUDA.

Chunked attention (chunks of C keys, key 0 starting one): a prefill (Tq = Tk) folds the
chunks into the batch, each one plain causal attention over C keys, O(T C); shorter query
runs take the chunk mask. Sink logits enter as one more key (sinks.py), under a mask.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .banded import banded_sdpa, worth_blocking
from .reference import causal_band, expand_kv
from .sinks import with_sink_column, with_sink_key


@functools.lru_cache(maxsize=32)
def band_mask(q_len: int, kv_len: int, window: int | None, device: torch.device,
              chunk: int | None = None) -> torch.Tensor:
    """Cached per (Tq, Tk, W, device, C): rebuilding a T x T mask every step costs real time."""
    return causal_band(q_len, kv_len, window, device, chunk)


def chunks_in_batch(q, k, v, *, window: int | None, scale: float, chunk: int,
                    sinks: torch.Tensor | None) -> torch.Tensor:
    """A prefill under chunks of C: [B, H, T, *] -> [B * nb, H, C, *], each chunk attending
    within itself; padding to nb * C sits after the last real query, which cannot see it."""
    B, H, T, _ = q.shape
    nb = -(-T // chunk)
    pad = nb * chunk - T

    def fold(t: torch.Tensor) -> torch.Tensor:  # [B, n, T, d] -> [B * nb, n, C, d]
        n, d = t.shape[1], t.shape[-1]
        t = F.pad(t, (0, 0, 0, pad)).view(B, n, nb, chunk, d).transpose(1, 2)
        return t.reshape(B * nb, n, chunk, d)

    o = sdpa_attention(fold(q), fold(k), fold(v), window=window, scale=scale, sinks=sinks)
    V = o.shape[-1]
    return o.view(B, nb, H, chunk, V).transpose(1, 2).reshape(B, H, nb * chunk, V)[:, :, :T]


def sdpa_attention(q, k, v, *, window: int | None, scale: float, chunk: int | None = None,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if chunk is not None and chunk >= kv_len:
        chunk = None  # key 0 starts a chunk: one chunk holds every key
    if chunk is not None and q_len == kv_len:
        return chunks_in_batch(q, k, v, window=window, scale=scale, chunk=chunk, sinks=sinks)
    if window is not None and window >= kv_len:
        window = None  # every key is inside the window: no band to mask
    if chunk is None and worth_blocking(q_len, kv_len, window):
        # a long band: O(T W) in blocks, not O(T^2)
        return banded_sdpa(q, k, v, window=window, scale=scale, sinks=sinks)
    mask, is_causal = None, False
    if window is None and chunk is None and q_len == kv_len and sinks is None:
        is_causal = True  # top-left and bottom-right alignment agree when Tq = Tk
    elif window is not None or chunk is not None or q_len > 1 or sinks is not None:
        mask = band_mask(q_len, kv_len, window, q.device, chunk)  # never with is_causal
    V = v.shape[-1]
    if sinks is not None:
        q, k, v = with_sink_key(q, k, v, sinks, scale)  # the sink is one more key
        mask = with_sink_column(mask)
    gqa = k.shape[1] != q.shape[1]
    if gqa and mask is not None and q.is_cuda:
        # CUDA's masked kernels do not take unequal head counts and would fall to MATH.
        k, v, gqa = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1]), False
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                       scale=scale, enable_gqa=gqa)
    return o if sinks is None else o[..., :V]  # [B, H, Tq, V]: the sink's padding cut
