"""A compressed-only sparse layer's decoding state (selection none or slots): the window's
last W keys and values in a ring, and the incomplete slot's pooling as a running softmax,
so that nothing cached grows with T but the complete slots (T / rate per KV head).

    k, v, first = window_keys(cache.k, cache.v, k, v, offset, W)   # the last W - 1 + new
    slot_k, slot_v = stream_slots(cache, k, v, logits, offset, rate)  # complete so far

The running state per KV head, pending [B, G, 2 K + 2]: the pooling logits' running max m,
the normalizer z = sum exp(l - m), and the keys' and values' sums weighted by exp(l - m)
(mean pooling: every logit 0). A slot completes as ak / z: the parallel forward's softmax
within the slot, up to rounding.
"""

from __future__ import annotations

import torch

from budgets.mixing.sparse import compress, pool_weights


def window_keys(ring_k: torch.Tensor, ring_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                offset: int, window: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The keys and values the window branch reads for new tokens at positions offset ..:
    the last W - 1 cached ones in position order, then the new ones [B, G, n, K], and the
    first one's position; the ring [B, G, W, K] (position p at p % W) then takes the new."""
    W, T = window, k.shape[2]
    first = max(0, offset - (W - 1))
    old = torch.arange(first, offset, device=k.device) % W
    keys = torch.cat([ring_k.index_select(2, old).to(k.dtype), k], 2)
    values = torch.cat([ring_v.index_select(2, old).to(v.dtype), v], 2)
    keep = min(T, W)
    at = torch.arange(offset + T - keep, offset + T, device=k.device) % W
    ring_k.index_copy_(2, at, k[:, :, T - keep:].to(ring_k.dtype))
    ring_v.index_copy_(2, at, v[:, :, T - keep:].to(ring_v.dtype))
    return keys, values, first


def merge(state: torch.Tensor | None, logits: torch.Tensor, k: torch.Tensor,
          v: torch.Tensor) -> torch.Tensor:
    """The running state [B, G, 2 K + 2] after tokens with logits [B, G, n], keys [B, G, n,
    K] and values (None: the state of these tokens alone)."""
    K = k.shape[-1]
    top = logits.max(-1).values  # [B, G]
    if state is not None:
        m, z, ak, av = state[..., 0], state[..., 1], state[..., 2:2 + K], state[..., 2 + K:]
        top = torch.maximum(top, m)
        scale = torch.exp(m - top)  # [B, G]: the old sums at the new max
    w = torch.exp(logits - top[..., None])  # [B, G, n]
    z_new, ak_new = w.sum(-1), (w[..., None] * k).sum(2)
    av_new = (w[..., None] * v).sum(2)
    if state is not None:
        z_new, ak_new = z * scale + z_new, ak * scale[..., None] + ak_new
        av_new = av * scale[..., None] + av_new
    return torch.cat([top[..., None], z_new[..., None], ak_new, av_new], -1)


def stream_slots(cache, k: torch.Tensor, v: torch.Tensor, logits: torch.Tensor | None,
                 offset: int, rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool new tokens (positions offset ..; keys [B, G, T, K], pooling logits [B, G, T] or
    None for the mean) into cache.slot_k and slot_v: the incomplete slot's running state
    merged with the tokens up to its end, the whole slots between pooled as the parallel
    forward pools them, the tokens after them a new running state. Returns the complete
    slots so far [B, G, S, K], [B, G, S, V]."""
    T, K = k.shape[2], k.shape[3]
    if logits is None:
        logits = k.new_zeros(k.shape[:3])  # mean pooling: a softmax of equal logits
    done = offset // rate
    head = min(T, -offset % rate)  # the tokens that finish the incomplete slot
    if head:
        state = merge(cache.pending.to(k.dtype), logits[..., :head], k[:, :, :head],
                      v[:, :, :head])
        cache.pending.copy_(state)
        if (offset + head) % rate == 0:  # complete: its keys and values are ak / z, av / z
            z = state[..., 1:2]
            cache.slot_k[:, :, done] = state[..., 2:2 + K] / z
            cache.slot_v[:, :, done] = state[..., 2 + K:] / z
            done += 1
    full = (T - head) // rate
    span = slice(head, head + full * rate)
    if full:
        sk, sv = compress(k[:, :, span], v[:, :, span],
                          pool_weights(logits[..., span], full * rate, rate, k), rate)
        cache.slot_k[:, :, done:done + full] = sk
        cache.slot_v[:, :, done:done + full] = sv
        done += full
    if span.stop < T:  # a new incomplete slot
        cache.pending.copy_(merge(None, logits[..., span.stop:], k[:, :, span.stop:],
                                  v[:, :, span.stop:]))
    return cache.slot_k[:, :, :done].to(k.dtype), cache.slot_v[:, :, :done].to(v.dtype)
