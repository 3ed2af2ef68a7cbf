"""The eager reference: materializes the probabilities. Slow (O(T^2) memory) and exact."""

from __future__ import annotations

import torch


def causal_band(q_len: int, kv_len: int, window: int | None, device,
                chunk: int | None = None) -> torch.Tensor:
    """True where query i may see key j: bottom-right causal, at most `window` keys back,
    and inside the query's own chunk of `chunk` keys (key 0 starts a chunk)."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # [Tq, 1]
    k_pos = torch.arange(kv_len, device=device)[None, :]  # [1, Tk]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    if chunk is not None:
        allowed &= k_pos // chunk == q_pos // chunk
    return allowed  # [Tq, Tk]


def expand_kv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, G, T, *] -> [B, H, T, *]: each key/value head serves H/G query heads."""
    return t.repeat_interleave(n_heads // t.shape[1], dim=1)


def attention_probs(q, k, *, window: int | None, scale: float, chunk: int | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention probabilities [B, H, Tq, Tk] in the dtype of q. Sink logits [H]
    join each row as one more column, dropped after the softmax: rows then sum to < 1."""
    H = q.shape[1]
    k = expand_kv(k, H)  # [B, H, Tk, K]
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, H, Tq, Tk]
    allowed = causal_band(q.shape[-2], k.shape[-2], window, q.device, chunk)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.to(scores.dtype).view(1, H, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]


def reference_attention(q, k, v, *, window: int | None, scale: float, chunk: int | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    probs = attention_probs(q, k, window=window, scale=scale, chunk=chunk, sinks=sinks)
    return probs @ expand_kv(v, q.shape[1])  # [B, H, Tq, V]
