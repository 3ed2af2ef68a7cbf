"""What each captured attention layer caches, measured as its inference rows.

    rows, caps = cache_rows(call, latent, eps)     # {"inference.k": ..., ...}, cap overrides

A layer with per-head keys and values caches them: inference.k and inference.v, joint over
KV heads [B, T, G*K], a windowed layer's last W - 1 tokens, a chunked layer's last chunk's.
A multi-head latent attention layer (deepseek_v3) caches something else: the latent
c [B, T, R] (kv_a_proj's output after kv_a_layernorm, the input of the linear expanding it
into per-head keys and values) and the shared rotary key k_r [B, T, dr]. Its rows are then
inference.latent and inference.rope_key, capped by min(T, R + dr) as zoo's mla block
declares (zoo/mla.py).
The expanding linear is found by budgets/capture/projections.py; the probe catches its input
(budgets/probe/inputs.py) during its forward pass. A DSA layer caches its indexer's keys
[B, T, d_I] beside them: inference.index_key, d_I more elements per token, the inference cap
min(T, max(width, d_I)) as budgets/mixing/sparse.py declares.
"""

from __future__ import annotations

import dataclasses

import torch

from ..budget import RankBudget
from ..capture.attention import AttentionCall
from .blocks import matrix_figures


def as_cached(key: torch.Tensor, value: torch.Tensor, window: int | None,
              chunk: int | None = None):
    """Keys and values [B, G, T, K] as the cache holds them after the prefill: a windowed
    layer's cache keeps the last W - 1 (the next query brings the W-th), a chunked layer's
    the last query's chunk (the keys it saw: 1 to C, budgets.attention_budget's live keys)."""
    T, start = key.shape[-2], 0
    if window is not None:
        start = max(T - max(window - 1, 1), 0)
    if chunk is not None:
        start = max(start, (T - 1) // chunk * chunk)
    return key[..., start:, :], value[..., start:, :]


def joint(kv: torch.Tensor) -> torch.Tensor:
    B, G, T, K = kv.shape
    return kv.float().transpose(1, 2).reshape(B, T, G * K)  # [B, T, G*K], as zoo caches it


def rotated_columns(call: AttentionCall) -> torch.Tensor:
    """[K] bool: the key columns RoPE changed (none when the layer has no RoPE)."""
    if call.key_pre is None:
        return torch.zeros(call.key.shape[-1], dtype=torch.bool, device=call.key.device)
    return (call.key != call.key_pre).flatten(0, -2).any(dim=0)


def latent_rows(call: AttentionCall, latent: torch.Tensor, eps: float) -> dict:
    """inference.latent [B, T, R] and inference.rope_key [B, T, dr]: an MLA layer's cache.
    The rotary key is shared by all heads: head 0's rotated columns."""
    B, T = call.key.shape[0], call.key.shape[-2]
    rows = {"inference.latent": matrix_figures(latent.reshape(B, T, -1).float(), eps,
                                               batch_dims=1)}
    rot = rotated_columns(call)
    if bool(rot.any()):
        rows["inference.rope_key"] = matrix_figures(call.key[:, 0, :, rot].float(), eps,
                                                    batch_dims=1)
    return rows


def latent_budget(budget: RankBudget, latent: torch.Tensor, call: AttentionCall
                  ) -> RankBudget:
    """The layer's caps with its cache's: min(T, R + dr), T (R + dr) elements (and a DSA
    indexer's keys: d_I more per token)."""
    T, R = call.key.shape[-2], latent.shape[-1]
    width = R + int(rotated_columns(call).sum())
    index = call.selection.index_dim if call.selection is not None else 0
    return dataclasses.replace(budget, inference=min(T, max(width, index)),
                               cache_elements=T * (width + index))


def cache_rows(call: AttentionCall, latent: torch.Tensor | None, eps: float) -> dict:
    """The layer's inference rows: its latent's when it caches one, else its K and V; a DSA
    indexer's keys beside them."""
    if latent is not None:
        rows = latent_rows(call, latent, eps)
    else:
        k, v = as_cached(call.key, call.value, call.window, call.chunk)
        rows = {"inference.k": matrix_figures(joint(k), eps, batch_dims=1),
                "inference.v": matrix_figures(joint(v), eps, batch_dims=1)}
    keys = call.selection.keys if call.selection is not None else None
    if keys is not None:  # [B, T, d_I], one key head
        rows["inference.index_key"] = matrix_figures(keys.float(), eps, batch_dims=1)
    return rows
