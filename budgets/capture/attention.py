"""One attention call as a capture saw it, and the P V engine that answers it.

    call = AttentionCall(module, query, key, value, scaling, window=..., mask=...)
    out = attend(call, keep_probs=True)     # P V [B, T, H, V]; P kept in call.probs

A source (transformers' attention interface, an SDPA call of any model code) hands each
layer's queries [B, H, T, K], keys [B, G, T, K] and values [B, G, T, V] after their norms
and RoPE, with the mask, scaling, window, attention chunks (read from the mask:
budgets/capture/masks.py), logit soft-cap and sink logits it attends under.
attend computes

    P = softmax(softcap(q k^T * scaling) + mask  [, sink column dropped after])   # [B, H, T, T]

and returns P V, so the model's output is what eager attention gives, a block of query
rows at a time: no [T, T] tensor unless the caller keeps P. The call is a Mixer
(budgets/capture/mixer.py): its kind, P, its matrix-free operator and its caps.
Nothing here imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..budget import RankBudget, attention_budget
from ..rank.matfree import AttentionMixing
from .selection import Selection

# query rows per block: a block of logits [B, H, rows, T] holds at most this many elements
CHUNK_ELEMENTS = 1 << 25


@dataclass
class AttentionCall:
    """One layer's attention call, as the interface received it."""

    module: nn.Module
    query: torch.Tensor  # [B, H, T, K] after norms and RoPE
    key: torch.Tensor  # [B, G, T, K]
    value: torch.Tensor  # [B, G, T, V]
    scaling: float
    window: int | None = None  # keys s > t - W seen by query t (the query included)
    chunk: int | None = None  # keys of query t's own chunk of C tokens (s // C == t // C)
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H] sink logits, a column no value reads
    mask: torch.Tensor | None = None  # [B, 1, T, T] additive or boolean; None: causal
    query_pre: torch.Tensor | None = None  # [B, H, T, K] before RoPE (None: no RoPE seen)
    key_pre: torch.Tensor | None = None  # [B, G, T, K]
    rotated: bool = False  # a rotary function ran for this call (its keys recovered or not)
    probs: torch.Tensor | None = None  # [B, H, T, T], when the caller keeps it
    output: torch.Tensor | None = None  # [B, T, H, V] what the layer's W_O reads
    out_proj: nn.Module | None = field(default=None, repr=False)  # the module holding W_O
    # DSA's top-k choice, already folded into `mask` (budgets/capture/selection.py)
    selection: Selection | None = field(default=None, repr=False)

    @property
    def rope(self) -> bool:
        return self.key_pre is not None

    # ---- the Mixer protocol (budgets/capture/mixer.py)
    kind_name = "attention"

    def kind(self, moe: bool) -> dict:
        """Sliding window W, chunks of C or global; RoPE (its keys before it recovered or
        not) or none; soft-capped logits; sinks; experts."""
        attention = "chunked" if self.chunk else "sliding" if self.window else "global"
        kind = {"attention": attention, "window": self.window, "chunk": self.chunk,
                "rope": self.rope or self.rotated, "softcap": self.softcap,
                "sinks": self.sinks is not None, "moe": moe}
        shape = " ".join([f"sliding W={self.window}"] * bool(self.window)
                         + [f"chunked C={self.chunk}"] * bool(self.chunk)) or "global"
        # no RoPE: no rotary function ran (NoPE layers, or learned absolute positions added
        # before the first layer); one ran whose output is not found in the keys: said so
        rope = "" if self.rope else (" RoPE (keys before rotation not recovered)"
                                     if self.rotated else " no RoPE")
        kind["label"] = shape + rope
        if self.selection is not None:  # each query attends to the indexer's top k keys
            kind["topk"] = self.selection.topk
            kind["label"] = kind["label"].replace("global", f"dsa top-k {self.selection.topk}")
        return kind

    def exact(self) -> torch.Tensor:
        return self.probs  # [B, H, T, T], kept by attend(keep_probs=True)

    def operator(self) -> AttentionMixing:
        if self.selection is not None:  # the operator knows causality, windows and chunks
            raise ValueError(f"{self.kind(False)['label']}: a top-k selection is measured "
                             f"exactly only, not matrix-free (matfree_from=None, or a probe "
                             f"length below matfree_from)")
        return AttentionMixing(self.query, self.key, self.scaling, self.window, self.softcap,
                               self.sinks, chunk=self.chunk)

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        """The caps zoo's softmax / sliding_window blocks declare for this shape."""
        H, G, K = self.query.shape[1], self.key.shape[1], self.key.shape[-1]
        if self.selection is not None:  # the sparse family's caps
            return self.selection.caps(block, seq_len, d_model, H, G, K, params)
        return attention_budget(block, seq_len, n_heads=H, n_kv_heads=G, head_dim=K,
                                d_model=d_model, window=self.window, params=params,
                                chunk=self.chunk)

    def release(self) -> None:
        """Measured: the tensors go, the call (its module, kind, output projection) stays."""
        self.probs = self.query = self.key = self.value = None
        self.query_pre = self.key_pre = None
        if self.selection is not None:
            self.selection.release()


def _mask_rows(call: AttentionCall, rows: slice, Tk: int) -> torch.Tensor | None:
    """The additive mask of query rows `rows` [B or 1, 1, r, Tk], built causal (and
    windowed, chunked) when the model passed none."""
    if call.mask is not None:
        m = call.mask[:, :, rows, :Tk]
        if m.dtype == torch.bool:  # SDPA's convention: True where a key is seen
            return torch.zeros(m.shape, dtype=call.query.dtype, device=m.device).masked_fill(
                ~m, torch.finfo(call.query.dtype).min)
        return m
    T = call.query.shape[-2]
    t = torch.arange(rows.start, rows.stop, device=call.query.device)[:, None] + (Tk - T)
    s = torch.arange(Tk, device=call.query.device)[None, :]
    hidden = s > t
    if call.window is not None:
        hidden |= s <= t - call.window
    if call.chunk is not None:
        hidden |= s < t // call.chunk * call.chunk
    return torch.zeros(hidden.shape, dtype=call.query.dtype, device=hidden.device).masked_fill(
        hidden, torch.finfo(call.query.dtype).min)[None, None]  # [1, 1, r, Tk]


def probabilities(call: AttentionCall, rows: slice) -> torch.Tensor:
    """P of query rows `rows`, [B, H, r, Tk], as eager attention computes it."""
    H, G = call.query.shape[1], call.key.shape[1]
    k = call.key.repeat_interleave(H // G, dim=1)  # [B, H, Tk, K]
    logits = call.query[:, :, rows] @ k.transpose(-1, -2) * call.scaling  # [B, H, r, Tk]
    if call.softcap is not None:
        logits = torch.tanh(logits / call.softcap) * call.softcap
    mask = _mask_rows(call, rows, k.shape[-2])
    if mask is not None:
        logits = logits + mask
    if call.sinks is None:
        return torch.softmax(logits, dim=-1, dtype=torch.float32).to(call.query.dtype)
    sink = call.sinks.to(logits.dtype).reshape(1, H, 1, 1).expand(*logits.shape[:-1], 1)
    both = torch.cat([logits, sink], dim=-1)
    both = both - both.amax(dim=-1, keepdim=True)
    return torch.softmax(both, dim=-1, dtype=both.dtype)[..., :-1]  # the sink dropped


def row_blocks(call: AttentionCall) -> list[slice]:
    B, H, T, _ = call.query.shape
    r = max(1, CHUNK_ELEMENTS // max(1, B * H * call.key.shape[-2]))
    return [slice(i, min(i + r, T)) for i in range(0, T, r)]


def attend(call: AttentionCall, keep_probs: bool, fused: bool = False) -> torch.Tensor:
    """P V [B, T, H, V], a block of query rows at a time; P kept in call.probs if asked.
    `fused` (the matrix-free probe, masks as SDPA takes them): where P is not kept and
    torch's SDPA computes the same attention (no soft-capping, no sinks, a mask or pure
    causality), its fused kernel does, at a fraction of the time on long probes."""
    if fused and not keep_probs and _sdpa_serves(call):
        return _sdpa(call)
    H, G = call.query.shape[1], call.value.shape[1]
    v = call.value.repeat_interleave(H // G, dim=1)  # [B, H, Tk, V]
    outs, probs = [], []
    for rows in row_blocks(call):
        p = probabilities(call, rows)  # [B, H, r, Tk]
        outs.append(p.to(v.dtype) @ v)  # [B, H, r, V]
        if keep_probs:
            probs.append(p)
    if keep_probs:
        call.probs = torch.cat(probs, dim=-2)  # [B, H, T, Tk]
    return torch.cat(outs, dim=-2).transpose(1, 2).contiguous()  # [B, T, H, V]


def _sdpa_serves(call: AttentionCall) -> bool:
    square = call.query.shape[-2] == call.key.shape[-2]
    causal = call.mask is not None or (call.window is None and call.chunk is None and square)
    return call.softcap is None and call.sinks is None and causal


def _sdpa(call: AttentionCall) -> torch.Tensor:
    """SDPA's P V [B, T, H, V] under the call's mask (None: causal)."""
    H, G = call.query.shape[1], call.key.shape[1]
    k = call.key.repeat_interleave(H // G, dim=1)  # [B, H, Tk, K]
    v = call.value.repeat_interleave(H // G, dim=1)  # [B, H, Tk, V]
    out = torch.nn.functional.scaled_dot_product_attention(
        call.query, k, v, attn_mask=call.mask, is_causal=call.mask is None,
        scale=call.scaling)  # [B, H, T, V]
    return out.transpose(1, 2).contiguous()
