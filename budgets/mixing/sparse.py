"""The token mixing of sparse attention: DSA's indexer top-k, NSA's and MoBA's block
selection, compressed slots and a local window, one family.

    M = sparse_mixing(q, k, selected, scale=..., gates=..., window=W, pool=Pool)  # [B, H, T, T]
    caps = sparse_caps(block, T, SparseShape(...), params, proj_flops)

A query at position p reads up to three branches, each a softmax over its own keys:

    selected    the keys a selection chose (a bool mask [B, G, Tq, Tk], made in the block:
                top-k by an indexer, or the tokens of top-k blocks), never one after p
    compressed  S = Tk // rate slots, slot j the pooled keys and values of tokens
                j*rate .. (j+1)*rate - 1 (Pool [B, G, S, Tk], rows summing to one), visible
                only once complete: (j + 1) * rate <= p + 1
    window      the last W keys, p itself included

and mixes them with per-head gates g [B, H, Tq, n_branches] (NSA's sigmoid gates; ones
where the block has no gate), so that, token to token,

    M = g_sel P_sel + g_cmp (P_cmp @ Pool) + g_win P_win,     y = o_proj(M @ V)

exactly: a compressed slot's value is Pool @ V, so its weight folds back to the tokens it
pooled. A query with no visible key in a branch (no complete slot yet) takes nothing from it.

Caps. A query carries from the past at most its selected keys (k tokens, or k blocks), the
complete slots and W - 1 window keys; but the rank of M's past->future block M[t:, :t] is
not bounded by k: each query row picks its own keys, so k = 1 with query t + i picking key
i already gives a permutation, rank t. With a selection in every configuration, the mixing
cap is T/2 as for full softmax (the window's W - 1 and the compressed branch's ceil(T/2 /
rate) bound only their own terms). The logits q . k are rank K in every branch (the
indexer's ReLU scores choose keys; they are not the attention's logits). The cache keeps
every token's keys and values (any may be selected later), the indexer's keys (d_I per
token), the complete slots, and for a gated pooling its logits (one per KV head and token).

Compressed-only layers (selection none: every complete slot, DeepSeek V4's HCA; slots: the
top_k complete slots by the group's q . slot key, its CSA) have no selected branch, and
their cap binds. At t = T // 2, M[t:, :t] = g_cmp P_cmp @ Pool[:, :t] + g_win P_win[t:, :t]
(gates diagonal per row), so its rows lie in span(rows of Pool[:, :t]) + span(the window's
columns). P_win[p, s] != 0 needs p - W < s <= p: for p >= t and s < t only the W - 1
columns t - W + 1 .. t - 1. Pool[:, :t] has a nonzero row only for a complete slot holding
a token before t (a slot is one key and one value row: one direction per head, whichever
slots each query reads), and one whose tokens before t all lie in the window's columns
adds nothing to that span: rank M[t:, :t] <= min(T // 2, W - 1 + ceil((t - W + 1) / rate)),
the slots counted up to T // rate, each term where its branch is present (without a
window: ceil(t / rate)). tests/budgets/mixing/test_sparse.py measures it on random
instances, where it is reached. They
cache the complete slots (2 G K per `rate` tokens), the window's W keys and values and
the incomplete slot's running pooling (G (2 K + 2)): the inference cap is the rank of
those rows, min(T, slots + W, G K).
Torch only: the zoo's kernels and block import this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..budget import RankBudget

BRANCHES = ("selected", "compressed", "window")  # the order of the gates' last dim


def expand_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, G, ...] -> [B, H, ...]: each KV head serves H/G query heads."""
    return t.repeat_interleave(n_heads // t.shape[1], dim=1)


def masked_softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax over the allowed entries of the last dim; a row with none is all zeros (a
    branch with nothing visible yet contributes nothing), with finite gradients."""
    low = torch.finfo(logits.dtype).min
    return torch.softmax(logits.masked_fill(~allowed, low), dim=-1) * allowed


def slot_visible(positions: torch.Tensor, slots: int, rate: int) -> torch.Tensor:
    """[Tq, S]: slot j is visible at position p once complete, (j + 1) * rate <= p + 1."""
    ends = (torch.arange(slots, device=positions.device) + 1) * rate  # [S]
    return ends[None, :] <= positions[:, None] + 1


def window_mask(positions: torch.Tensor, key_positions: torch.Tensor,
                window: int) -> torch.Tensor:
    """[Tq, Tk]: key s is in the window of p when p - W < s <= p."""
    gap = positions[:, None] - key_positions[None, :]
    return (gap >= 0) & (gap < window)


def selection_mask(idx: torch.Tensor, valid: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The selected keys as a bool mask [B, G, Tq, Tk] from indices [B, G, Tq, n] and their
    validity (an index may repeat where all but one of its entries are not valid)."""
    hits = torch.zeros(*idx.shape[:-1], kv_len, device=idx.device)
    return hits.scatter_add(-1, idx, valid.float()) > 0


def pool_weights(logits: torch.Tensor | None, kv_len: int, rate: int,
                 like: torch.Tensor) -> torch.Tensor:
    """Each token's weight in its slot [B, G, Tk // rate * rate]: 1 / rate (mean pooling),
    or a softmax of the pooling logits [B, G, Tk] within each slot (gated pooling)."""
    S = kv_len // rate
    if logits is None:
        return like.new_full((*like.shape[:2], S * rate), 1.0 / rate)
    blocks = logits[..., :S * rate].unflatten(-1, (S, rate))  # [B, G, S, rate]
    return torch.softmax(blocks, dim=-1).flatten(-2)


def compress(k: torch.Tensor, v: torch.Tensor, weights: torch.Tensor,
             rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots' keys and values [B, G, S, K], [B, G, S, V] from per-token weights [B, G,
    S * rate] (pool_weights): sum over each slot's tokens of weight x key (value)."""
    n = weights.shape[-1]

    def pool(t: torch.Tensor) -> torch.Tensor:
        return (t[:, :, :n] * weights[..., None]).unflatten(2, (n // rate, rate)).sum(3)

    return pool(k), pool(v)


def pooling_matrix(weights: torch.Tensor, kv_len: int, rate: int) -> torch.Tensor:
    """Pool [B, G, S, Tk]: slot j holds weights[j*rate:(j+1)*rate] at its tokens, so that
    Pool @ K is compress's keys."""
    n = weights.shape[-1]
    S = n // rate
    eye = torch.eye(S, dtype=weights.dtype, device=weights.device)  # [S, S]
    blocks = eye[:, :, None] * weights.unflatten(-1, (S, rate))[..., None, :, :]
    pool = blocks.flatten(-2)  # [B, G, S, S * rate]
    return torch.nn.functional.pad(pool, (0, kv_len - n))


def branch_probs(q: torch.Tensor, k: torch.Tensor, selected: torch.Tensor | None, *,
                 scale: float, offset: int = 0, window: int | None = None,
                 slot_keys: torch.Tensor | None = None, rate: int | None = None,
                 key_offset: int = 0, slot_mask: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
    """Each branch's attention, materialized: "selected" and "window" [B, H, Tq, Tk] over
    tokens, "compressed" [B, H, Tq, S] over slots; q [B, H, Tq, K] at positions offset ..,
    k [B, G, Tk, K] at positions key_offset .., selected [B, G, Tq, Tk] (None: no selected
    branch), slot_keys [B, G, S, K], slot_mask [B, G, Tq, S] the slots a query may read
    (the slot selection's top-k; None: every complete one)."""
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    positions = torch.arange(offset, offset + Tq, device=q.device)
    logits = q @ expand_heads(k, H).mT * scale  # [B, H, Tq, Tk]
    probs = {}
    if selected is not None:
        probs["selected"] = masked_softmax(logits, expand_heads(selected, H))
    if slot_keys is not None:
        slot_logits = q @ expand_heads(slot_keys, H).mT * scale  # [B, H, Tq, S]
        seen = slot_visible(positions, slot_keys.shape[2], rate)  # [Tq, S]
        if slot_mask is not None:
            seen = seen & expand_heads(slot_mask, H)  # [B, H, Tq, S]
        probs["compressed"] = masked_softmax(slot_logits, seen)
    if window is not None:
        keys = torch.arange(key_offset, key_offset + Tk, device=q.device)
        probs["window"] = masked_softmax(logits, window_mask(positions, keys, window))
    return probs


def sparse_mixing(q: torch.Tensor, k: torch.Tensor, selected: torch.Tensor | None, *,
                  scale: float, gates: torch.Tensor | None = None, window: int | None = None,
                  pool: torch.Tensor | None = None, rate: int | None = None,
                  slot_keys: torch.Tensor | None = None,
                  slot_mask: torch.Tensor | None = None) -> torch.Tensor:
    """M [B, H, T, T], token to token, so that o = M @ V (per query head) exactly: each
    branch's probabilities times its gate (gates [B, H, T, n_branches] in BRANCHES' order,
    over the branches present; None: ones), the compressed branch's folded back through
    Pool [B, G, S, T] (slot_keys: the slots as the forward pooled them; None: Pool @ k)."""
    H, T = q.shape[1], q.shape[2]
    if pool is not None and slot_keys is None:
        slot_keys = pool @ k  # [B, G, S, K]
    probs = branch_probs(q, k, selected, scale=scale, window=window,
                         slot_keys=None if pool is None else slot_keys, rate=rate,
                         slot_mask=slot_mask)
    if pool is not None:
        probs["compressed"] = probs["compressed"] @ expand_heads(pool, H)  # [B, H, T, T]
    M = q.new_zeros(q.shape[0], H, T, T)
    for i, name in enumerate(probs):
        M = M + (probs[name] if gates is None else gates[..., i, None] * probs[name])
    return M


# ---------------------------------------------------------------- caps and costs

@dataclass(frozen=True)
class SparseShape:
    """What the caps read of a sparse block: widths, the selection and the branches."""

    d_model: int
    n_heads: int  # H
    kv_heads: int  # G
    head_dim: int  # K = V
    selection: str  # token | block | slots | none
    top_k: int  # keys (token), blocks (block) or compressed slots (slots) per query
    block_size: int = 1  # tokens per selection block (block selection)
    index_heads: int = 0  # I (token selection)
    index_dim: int = 0  # d_I (token selection)
    rate: int | None = None  # tokens per compressed slot; None: no compressed branch
    gated_pooling: bool = False
    window: int | None = None  # W; None: no window branch


def keys_up_to(T: int, k: int) -> int:
    """sum over n = 1 .. T of min(k, n): keys seen when each position sees at most k."""
    return T * (T + 1) // 2 if k >= T else k * (k + 1) // 2 + (T - k) * k


def floor_sum(T: int, m: int) -> int:
    """sum over t = 0 .. T - 1 of t // m."""
    q, r = divmod(T, m)
    return m * q * (q - 1) // 2 + q * r


def selected_keys(s: SparseShape, T: int) -> int:
    """Keys the selected branch attends to, summed over positions 0 .. T - 1: min(k, p + 1)
    tokens; for blocks, all causal keys while p's block is among the first k, then k - 1
    whole blocks and p's own block up to p."""
    if s.selection == "token":
        return keys_up_to(T, s.top_k)
    span = s.top_k * s.block_size
    if span >= T:
        return T * (T + 1) // 2
    m = T - span  # positions past the first k blocks, starting on a block boundary
    full, rem = divmod(m, s.block_size)
    partial = full * s.block_size * (s.block_size - 1) // 2 + rem * (rem - 1) // 2
    return span * (span + 1) // 2 + m * ((s.top_k - 1) * s.block_size + 1) + partial


def slots_up_to(T: int, k: int, rate: int) -> int:
    """sum over p = 0 .. T - 1 of min(k, (p + 1) // rate): the slots read when each
    position reads at most k of its complete ones."""
    last = min(T, k * rate - 1)  # n = p + 1 below k * rate: n // rate < k
    return floor_sum(last + 1, rate) + k * max(0, T - last)


def compressed_rows(s: SparseShape, T: int) -> int:
    """What a compressed-only layer (selection none or slots) holds at length T, in rows
    of G K: the complete slots' keys and values, the window's W keys and values, and the
    incomplete slot's running pooling (keys and values summed, 2 K + 2 per KV head with
    its running max and normalizer; none at rate 1)."""
    slots = 2 * (T // s.rate) if s.rate is not None else 0
    return slots + 2 * (s.window or 0)


def pending_elements(s: SparseShape) -> int:
    """The incomplete slot's running pooling state per sequence: G (2 K + 2)."""
    return s.kv_heads * (2 * s.head_dim + 2) if s.rate is not None and s.rate > 1 else 0


def compressed_mixing(s: SparseShape, T: int) -> int:
    """The past->future cap of a compressed-only layer at t = T // 2 (module docstring):
    min(T // 2, W - 1 + the complete slots holding a token before the window's t - W + 1)."""
    t = T // 2
    through_window = s.window - 1 if s.window is not None else 0
    before = max(0, t - through_window)  # the past columns no window reaches
    through_slots = min(-(-before // s.rate), T // s.rate) if s.rate is not None else 0
    return min(t, through_slots + through_window)


def selection_covers(s: SparseShape, T: int) -> bool:
    """Whether the selection keeps every causal key at length T (it cannot bite)."""
    if s.selection == "none":
        return False
    if s.selection == "slots":
        return s.rate is not None and s.top_k >= T // s.rate
    blocks = -(-T // s.block_size) if s.selection == "block" else T
    return s.top_k >= blocks


def sparse_caps(block: str, seq_len: int, s: SparseShape, params: int,
                proj_flops: int) -> RankBudget:
    """The sparse family's caps (module docstring) and costs at T = seq_len. FLOPs per token
    averaged over the sequence: the projections (`proj_flops`), the selection's scores
    (the indexer's 2 I d_I + 2 I per causal key, or the group's 2 G K per candidate block
    and the blocks' means), and 4 H K per key attended in each branch (q . k and p v), the
    slots' pooling and the gates; one decode step is the T-th token's share
    (train/sizing/costs.py)."""
    T, H, G, K = seq_len, s.n_heads, s.kv_heads, s.head_dim
    if s.selection in ("none", "slots"):
        return compressed_caps(block, T, s, params, proj_flops)
    if s.selection == "token":
        scoring = (2 * s.index_heads * s.index_dim + 2 * s.index_heads) * T * (T + 1) // 2
    else:  # blocks 0 .. p // block_size are candidates at p; means: G K adds per token
        scoring = 2 * G * K * (T + floor_sum(T, s.block_size)) + G * K * T
    keys = selected_keys(s, T)
    cache = 2 * T * G * K + T * s.index_dim
    branches = 1
    if s.rate is not None:
        keys += floor_sum(T + 1, s.rate)  # complete slots at p: (p + 1) // rate
        scoring += 4 * G * K * T  # pooling keys and values
        cache += 2 * (T // s.rate) * G * K + (T * G if s.gated_pooling else 0)
        branches += 1
    if s.window is not None:
        keys += keys_up_to(T, s.window)
        branches += 1
    combine = 2 * H * K * branches * T if branches > 1 else 0
    return RankBudget(
        block=block, seq_len=T, n_heads=H,
        mixing=T // 2,  # each query picks its own keys: no k bounds M[t:, :t]
        logits=K,
        value_path=min(s.d_model, G * K),
        # every token's keys and values, the indexer's keys: their rank
        inference=min(T, max(G * K, s.index_dim)),
        params=params, cache_elements=cache,
        flops_per_token=proj_flops + (scoring + 4 * H * K * keys + combine) // T,
    )


def compressed_caps(block: str, T: int, s: SparseShape, params: int,
                    proj_flops: int) -> RankBudget:
    """Selection none (HCA-like: every complete slot) or slots (CSA-like: the top_k complete
    slots by q . slot key), beside an optional window: nothing cached grows as T but the
    slots (module docstring's compressed caps)."""
    H, G, K = s.n_heads, s.kv_heads, s.head_dim
    keys, scoring, branches = 0, 0, 0
    if s.rate is not None:
        complete = floor_sum(T + 1, s.rate)  # complete slots at p, summed: (p + 1) // rate
        keys += complete if s.selection == "none" else slots_up_to(T, s.top_k, s.rate)
        scoring += 4 * G * K * T  # pooling keys and values
        if s.selection == "slots":
            scoring += 2 * G * K * complete  # the group's summed query . each slot key
        branches += 1
    if s.window is not None:
        keys += keys_up_to(T, s.window)
        branches += 1
    combine = 2 * H * K * branches * T if branches > 1 else 0
    rows = (T // s.rate if s.rate is not None else 0) + (s.window or 0)
    return RankBudget(
        block=block, seq_len=T, n_heads=H,
        mixing=compressed_mixing(s, T),
        logits=K,
        value_path=min(s.d_model, G * K),
        inference=min(T, rows, G * K),  # the slots' and the window's rows of G K
        params=params,
        cache_elements=G * K * compressed_rows(s, T) + pending_elements(s),
        flops_per_token=proj_flops + (scoring + 4 * H * K * keys + combine) // T,
    )
