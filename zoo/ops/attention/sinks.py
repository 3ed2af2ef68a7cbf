"""Sink logits (gpt-oss) on kernels that have no sink column of their own.

A sink is one more logit per head in every row's softmax, with no value behind it:
o_t = sum_s e^{S_ts} v_s / (sum_s e^{S_ts} + e^{sink}). Two exact ways to get it from a
kernel that only knows plain attention:

- as one more key (`with_sink_key`): queries gain a channel holding sink / scale, keys a
  zero channel, and one extra key [0, ..., 0, 1] with a zero value is appended; its score
  is (sink / scale) * 1 * scale = sink for every query of the head. The extra key is the
  same for every head, so GQA's shared key heads still serve, and gradients reach the
  sink through the queries. Any mask gains a column of True for it (`with_sink_column`).
  Values are padded with zeros to the queries' width (and queries and keys to the values'
  when those are wider): torch's CPU flash kernel takes equal widths only, and unequal
  ones fall to the materializing path, 3-4x slower (measured at T = 2048); the caller cuts
  the output back to V.
- from the row's log-sum-exp (`rescale_by_lse`), for kernels that return it:
  o * Z / (Z + e^sink) = o * sigmoid(lse - sink).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def with_sink_key(q, k, v, sinks: torch.Tensor, scale: float):
    """q [B, H, Tq, K], k [B, G, Tk, K], v [B, G, Tk, V], sinks [H] -> q' [B, H, Tq, E],
    k' [B, G, Tk + 1, E], v' [B, G, Tk + 1, E], E = max(K + 1, V): the sink is key Tk, its
    channel K; the output's first V channels are the attention's."""
    B, H, Tq, K = q.shape
    E = max(K + 1, v.shape[-1])
    column = (sinks.to(q.dtype) / scale).view(1, H, 1, 1).expand(B, H, Tq, 1)
    q = F.pad(torch.cat((q, column), dim=-1), (0, E - K - 1))  # [B, H, Tq, E]
    k = F.pad(k, (0, E - K))  # [B, G, Tk, E]: real keys read nothing of channel K
    sink_key = torch.zeros_like(k[:, :, :1])  # [B, G, 1, E]
    sink_key[..., K] = 1
    k = torch.cat((k, sink_key), dim=2)  # [B, G, Tk + 1, E]
    v = F.pad(v, (0, E - v.shape[-1], 0, 1))  # [B, G, Tk + 1, E]: the sink adds no value
    return q, k, v


def with_sink_column(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask [..., Tq, Tk] with the sink key seen by every query: [..., Tq, Tk + 1]."""
    return torch.cat((mask, mask.new_ones(*mask.shape[:-1], 1)), dim=-1)


def rescale_by_lse(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """o [B, H, Tq, V] of plain attention and its rows' log-sum-exp [B, H, Tq] -> the
    output with the sink in each row's normalizer."""
    dtype = torch.promote_types(o.dtype, torch.float32)  # fp64 stays fp64
    keep = torch.sigmoid(lse.to(dtype) - sinks.to(dtype).view(1, -1, 1))  # [B, H, Tq]
    return o * keep.to(o.dtype)[..., None]
