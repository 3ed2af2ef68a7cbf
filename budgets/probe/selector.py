"""DSA's indexer read as the selector it is: how much it keeps, how far its choice is from
the attention's own, and the rank of its logits.

    layer["indexer"] = selector_figures(call, eps)     # a call with call.selection set

Per layer making a top-k selection (budgets/capture/selection.py), over the queries where
the selection bites (more keys visible than it keeps, t + 1 > k; none when T <= k):

  keys_kept       share of the keys a query can see that it attends to, k / (t + 1)
                  on average (what the selection costs the attention)
  dense_mass      share of the attention mass the dense softmax (same queries and keys, no
                  selection) puts on the selected keys: 1 when the indexer keeps exactly
                  what dense attention weighs, keys_kept when it chooses blindly
  topk_overlap    share of the dense softmax's own k heaviest keys that the indexer chose
  logits          rank_eps and erank of the indexer's scores [T, Tk] per sample (the keys
                  a query cannot see at 0), where the layer runs its own indexer; ReLU
                  and the heads' sum leave them without a structural cap
  past_future_keys  the past keys (s < T/2) a query of the second half (t >= T/2) attends
                  to: declared min(k, T/2), the realized mean and max (each row of the
                  past->future block M[T/2:, :T/2] has at most that many nonzeros; its
                  rank stays capped by T/2, since each row picks its own)

dense_mass and topk_overlap are per head, averaged over the batch and the biting queries;
the others are single numbers. A layer reusing another's choice (glm_moe_dsa's shared
layers) names it in `shared_from` and has no logits of its own.
"""

from __future__ import annotations

import dataclasses

import torch

from ..capture.attention import AttentionCall, probabilities, row_blocks
from .blocks import matrix_figures


def _dense(call: AttentionCall) -> AttentionCall:
    """The same call without its selection: the dense softmax over every visible key."""
    return dataclasses.replace(call, mask=call.selection.dense_mask, selection=None,
                               probs=None)


def _visible(mask: torch.Tensor | None, T: int, Tk: int, device) -> torch.Tensor:
    """[B or 1, 1, T, Tk] bool: the keys each query can see without the selection, from
    the call's mask before it (None: causal, as Selection.fold reads it)."""
    if mask is None:
        t = torch.arange(T, device=device)[:, None] + (Tk - T)
        return (torch.arange(Tk, device=device)[None, :] <= t)[None, None]
    mask = mask[..., :T, :Tk]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def selector_figures(call: AttentionCall, eps: float) -> dict:
    """The indexer's figures of one call with a selection (module docstring)."""
    sel = call.selection
    B, H, T, _ = call.query.shape
    Tk = call.key.shape[-2]
    out = {"topk": sel.topk, "index_heads": sel.index_heads, "index_dim": sel.index_dim,
           "shared_from": sel.shared_from}
    dense = _dense(call)
    visible = _visible(sel.dense_mask, T, Tk, call.query.device)  # [b, 1, T, Tk]
    seen = visible.sum(-1).expand(B, 1, T)  # [B, 1, T] keys each query can see
    bites = seen > sel.picked  # [B, 1, T]
    out["bites"] = bool(bites.any())
    chosen = sel.chosen(Tk) & visible  # [B, 1, T, Tk]
    half, shift = T // 2, Tk - T  # query t sits at key position t + shift
    past = chosen[:, 0, half:, :half + shift].sum(-1)  # [B, T - T/2]
    out["past_future_keys"] = {"declared": min(sel.topk, half),
                               "realized": float(past.double().mean()) if half else None,
                               "realized_max": int(past.max()) if half else None}
    for key in ("keys_kept", "dense_mass", "topk_overlap"):
        out[key] = None
    if sel.scores is not None and sel.shared_from is None:
        scores = sel.scores.float().masked_fill(~visible[:, 0], 0.0)  # [B, T, Tk]
        metrics, _ = matrix_figures(scores, eps, batch_dims=1)
        out["logits"] = {"rank_eps": metrics["rank_eps"][0], "erank": metrics["erank"][0],
                         "shape": metrics["shape"]}
    if not out["bites"]:
        return out  # T <= k: every visible key kept, nothing to compare
    kept = chosen.sum(-1)  # [B, 1, T]
    rows = bites.expand(B, H, T)  # [B, H, T]
    out["keys_kept"] = float((kept / seen.clamp(min=1))[bites].double().mean())
    mass, overlap = [], []
    for block in row_blocks(dense):
        P = probabilities(dense, block).double()  # [B, H, r, Tk]
        mine = chosen[:, :, block].expand_as(P)  # [B, H, r, Tk]
        mass.append((P * mine).sum(-1))  # [B, H, r]
        heaviest = P.topk(sel.picked, dim=-1).indices  # [B, H, r, k]
        overlap.append(mine.gather(-1, heaviest).double().mean(-1))  # [B, H, r]
    out["dense_mass"] = _per_head(torch.cat(mass, -1), rows)
    out["topk_overlap"] = _per_head(torch.cat(overlap, -1), rows)
    return out


def _per_head(x: torch.Tensor, rows: torch.Tensor) -> list[float]:
    """x [B, H, T] averaged over the batch and the rows where `rows` is True, per head."""
    w = rows.double()
    return [float(v) for v in ((x * w).sum((0, 2)) / w.sum((0, 2))).cpu()]


def short_probe_note(probe: dict) -> str | None:
    """The note for a probe too short for its layers' top-k selection to bite (T <= k:
    every key a query sees is kept), or None."""
    short = sorted({ly["indexer"]["topk"] for ly in probe["layers"]
                    if "indexer" in ly and not ly["indexer"]["bites"]})
    if not short:
        return None
    k = ", ".join(map(str, short))
    return (f"probe length {probe['seq_len']} <= the indexer's top-k ({k}): every key a "
            f"query can see is selected, so the selection cannot bite at that length and "
            f"the layers read as dense attention; probe with --seq-len above {max(short)}")
