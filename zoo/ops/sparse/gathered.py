"""The gathered path: per chunk of queries, the selected keys and values are gathered
([B, G, C, n, K]) and attended over; the window's keys are one slice per chunk and the
slots a [C, S] product. Beyond the selection, its cost grows as T x (n + C + W + T/rate),
never T x T (the block's indexer, which chooses the keys, is the T x T part)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from budgets.mixing.sparse import masked_softmax, slot_visible, window_mask

from ..precision import upcast_16bit


def gather_rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [B, G, Tk, K] at idx [B, G, C, n] -> [B, G, C, n, K], as one embedding lookup in
    the flattened rows: its backward sums the rows' gradients ~4x faster on CPU than
    index_select's (a scatter_add per element)."""
    B, G, Tk, K = t.shape
    base = (torch.arange(B * G, device=t.device) * Tk).view(B, G, 1, 1)
    return F.embedding(idx + base, t.reshape(B * G * Tk, K))


def gathered_sparse(q, k, v, idx, valid, *, scale, offset=0, gates=None, window=None,
                    slots=None, rate=None, chunk_size=128, key_offset=0, slot_mask=None):
    out_dtype = q.dtype
    q, k, v, gates = upcast_16bit(q, k, v, gates)
    B, H, Tq, _ = q.shape
    G = k.shape[1]
    if slots is not None:
        slot_k, slot_v = (s.to(q.dtype) for s in slots)  # [B, G, S, K], [B, G, S, V]
    outputs, chosen = [], []
    for c0 in range(0, Tq, chunk_size):
        c1 = min(c0 + chunk_size, Tq)
        qc = q[:, :, c0:c1].unflatten(1, (G, H // G))  # [B, G, r, C, K]
        positions = torch.arange(offset + c0, offset + c1, device=q.device)
        parts = []
        if idx is not None:  # the selected branch
            ic, vc = idx[:, :, c0:c1], valid[:, :, c0:c1]  # [B, G, C, n]
            logits = torch.einsum("bgrck,bgcnk->bgrcn", qc, gather_rows(k, ic)) * scale
            p = masked_softmax(logits, vc[:, :, None])  # [B, G, r, C, n]
            parts.append(torch.einsum("bgrcn,bgcnv->bgrcv", p, gather_rows(v, ic)))
            chosen.append(p.flatten(1, 2))  # [B, H, C, n]
        if slots is not None:
            seen = slot_visible(positions, slot_k.shape[2], rate)  # [C, S]
            if slot_mask is not None:  # the slot selection's top-k
                seen = seen & slot_mask[:, :, None, c0:c1]  # [B, G, 1, C, S]
            pc = masked_softmax(qc @ slot_k[:, :, None].mT * scale, seen)
            parts.append(pc @ slot_v[:, :, None])  # [B, G, r, C, V]
        if window is not None:  # k holds positions key_offset ..
            lo, hi = max(key_offset, offset + c0 - window + 1), offset + c1
            keys = torch.arange(lo, hi, device=q.device)
            span = slice(lo - key_offset, hi - key_offset)
            pw = masked_softmax(qc @ k[:, :, None, span].mT * scale,
                                window_mask(positions, keys, window))
            parts.append(pw @ v[:, :, None, span])
        if gates is None:
            o = sum(parts)
        else:
            g = gates[:, :, c0:c1].unflatten(1, (G, H // G))  # [B, G, r, C, n_branches]
            o = sum(g[..., i, None] * part for i, part in enumerate(parts))
        outputs.append(o.flatten(1, 2))  # [B, H, C, V]
    chosen = torch.cat(chosen, 2).to(out_dtype) if chosen else None
    return torch.cat(outputs, 2).to(out_dtype), chosen
