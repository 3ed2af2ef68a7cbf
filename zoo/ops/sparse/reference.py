"""The reference: every branch's attention materialized over all keys with plain masks
(budgets/mixing/sparse.py's branch_probs, the mixing matrix's own), O(T^2) memory."""

from __future__ import annotations

from budgets.mixing.sparse import branch_probs, expand_heads, selection_mask

from ..precision import upcast_16bit


def reference_sparse(q, k, v, idx, valid, *, scale, offset=0, gates=None, window=None,
                     slots=None, rate=None, chunk_size=None, key_offset=0, slot_mask=None):
    out_dtype = q.dtype
    q, k, v, gates = upcast_16bit(q, k, v, gates)
    H, Tk = q.shape[1], k.shape[2]
    slot_keys = None if slots is None else slots[0].to(q.dtype)
    selected = None if idx is None else selection_mask(idx, valid, Tk)
    probs = branch_probs(q, k, selected, scale=scale, offset=offset, window=window,
                         slot_keys=slot_keys, rate=rate, key_offset=key_offset,
                         slot_mask=slot_mask)
    values = {"selected": v, "window": v, "compressed": None if slots is None else slots[1]}
    o = 0
    for i, (name, p) in enumerate(probs.items()):
        part = p @ expand_heads(values[name].to(q.dtype), H)  # [B, H, Tq, V]
        o = o + (part if gates is None else gates[..., i, None] * part)
    if idx is None:  # no selected branch
        return o.to(out_dtype), None
    chosen = probs["selected"].gather(-1, expand_heads(idx, H))  # [B, H, Tq, n]
    chosen = chosen * expand_heads(valid, H)  # a repeated index counts once
    return o.to(out_dtype), chosen.to(out_dtype)
