"""The eager reference: materializes the probabilities. Slow (O(T^2) memory) and exact."""

from __future__ import annotations

import torch


def causal_band(q_len: int, kv_len: int, window: int | None, device) -> torch.Tensor:
    """True where query i may see key j: bottom-right causal, at most `window` keys back."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # [Tq, 1]
    k_pos = torch.arange(kv_len, device=device)[None, :]  # [1, Tk]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed  # [Tq, Tk]


def expand_kv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, G, T, *] -> [B, H, T, *]: each key/value head serves H/G query heads."""
    return t.repeat_interleave(n_heads // t.shape[1], dim=1)


def attention_probs(q, k, *, window: int | None, scale: float) -> torch.Tensor:
    """Softmax attention probabilities [B, H, Tq, Tk] in the dtype of q."""
    k = expand_kv(k, q.shape[1])  # [B, H, Tk, K]
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, H, Tq, Tk]
    allowed = causal_band(q.shape[-2], k.shape[-2], window, q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def reference_attention(q, k, v, *, window: int | None, scale: float) -> torch.Tensor:
    probs = attention_probs(q, k, window=window, scale=scale)  # [B, H, Tq, Tk]
    return probs @ expand_kv(v, q.shape[1])  # [B, H, Tq, V]
