"""Which keys each query attends to, chosen in chunks of queries and without gradients
(top-k is not differentiable): by DSA's lightning indexer, or by NSA's and MoBA's block
means. Both backends of the sparse op take what these return.

    idx, valid = token_selection(qi, ki, wi, top_k, offset, chunk)   # [B, Tq, n] each
    idx, valid = block_selection(q, k, top_k, block_size, offset, chunk)
                                                                     # [B, G, Tq, n * block]

Ties are broken by position, earliest first: ReLU scores tie at zero, and a prefill, its
decoding steps and the parallel forward must choose alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_scores(qi: torch.Tensor, ki: torch.Tensor, wi: torch.Tensor) -> torch.Tensor:
    """DSA's indexer: score(t, s) = sum_i w_i(t) relu(q_i(t) . k(s)); qi [B, Tq, I, d_I],
    ki [B, Tk, d_I], wi [B, Tq, I] -> [B, Tq, Tk]."""
    return torch.einsum("bti,btis->bts", wi, torch.relu(torch.einsum("btid,bsd->btis", qi, ki)))


def index_scores_at(qi: torch.Tensor, ki: torch.Tensor, wi: torch.Tensor,
                    idx: torch.Tensor) -> torch.Tensor:
    """The indexer's scores at the selected keys only, idx [B, Tq, n] -> [B, Tq, n]: what
    its auxiliary loss reads, T x n rather than T x T."""
    B, Tk, _ = ki.shape
    base = (torch.arange(B, device=idx.device) * Tk).view(B, 1, 1)
    kg = F.embedding(idx + base, ki.reshape(B * Tk, -1))  # [B, Tq, n, d_I]
    return torch.einsum("bti,btin->btn", wi, torch.relu(torch.einsum("btid,btnd->btin", qi, kg)))


def indexer_kl(qi, ki, wi, idx: torch.Tensor, valid: torch.Tensor,
               chosen: torch.Tensor) -> torch.Tensor:
    """KL(p || softmax(indexer scores)) over the selected keys idx [B, Tq, n] (valid [B, Tq,
    n]), averaged over queries: p the selected attention chosen [B, H, Tq, n] averaged over
    heads and detached, as DSA's sparse stage trains its indexer."""
    scores = index_scores_at(qi, ki, wi, idx).float()  # [B, Tq, n]
    logp = torch.log_softmax(scores.masked_fill(~valid, torch.finfo(scores.dtype).min), -1)
    p = chosen.detach().float().mean(1)  # [B, Tq, n]: rows sum to one over the valid
    return (torch.xlogy(p, p) - p * logp).masked_fill(~valid, 0).sum(-1).mean()


def top(scores: torch.Tensor, allowed: torch.Tensor, n: int):
    """The n best allowed entries of the last dim, in ascending position, and which are
    allowed. Ties at the n-th value go to the earliest positions: topk gives that value,
    and a running count of its ties says which of them make up the n (a full stable sort
    costs ~8x topk's time). Rows with fewer than n allowed fill up with not-allowed ones.
    A NaN score ranks last (NaN in, NaN out, as every block takes it: it compares neither
    above nor equal to the threshold, and a row would come up short of n)."""
    low = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    scores = torch.where(allowed & ~scores.isnan(), scores, low)
    threshold = scores.topk(n, dim=-1).values[..., -1:]  # the n-th largest
    above, tied = scores > threshold, scores == threshold
    need = n - above.sum(-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(-1) <= need))  # exactly n per row
    idx = chosen.nonzero()[:, -1].view(*scores.shape[:-1], n)
    return idx, allowed.expand_as(scores).gather(-1, idx)


@torch.no_grad()
def token_selection(qi, ki, wi, top_k: int, offset: int, chunk_size: int):
    """The top_k keys by the indexer among the causal ones, per query: [B, Tq, n] indices
    and validity, n = min(top_k, Tk); with top_k >= p + 1 every causal key of p."""
    Tq, Tk = qi.shape[1], ki.shape[1]
    n = min(top_k, Tk)
    keys = torch.arange(Tk, device=qi.device)
    picks = []
    for c0 in range(0, Tq, chunk_size):
        c1 = min(c0 + chunk_size, Tq)
        positions = torch.arange(offset + c0, offset + c1, device=qi.device)
        scores = index_scores(qi[:, c0:c1], ki, wi[:, c0:c1])  # [B, C, Tk]
        picks.append(top(scores, keys[None, :] <= positions[:, None], n))
    return torch.cat([p[0] for p in picks], 1), torch.cat([p[1] for p in picks], 1)


@torch.no_grad()
def block_selection(q, k, top_k: int, block_size: int, offset: int, chunk_size: int):
    """The tokens of the top_k blocks per query and KV head, blocks scored by the group's
    summed queries against each complete block's mean key (MoBA, NSA's selected branch);
    the query's own block always among them, its keys after the query not valid:
    [B, G, Tq, n * block_size] indices and validity, n = min(top_k, blocks)."""
    B, H, Tq, K = q.shape
    G, Tk = k.shape[1], k.shape[2]
    blocks, full = -(-Tk // block_size), Tk // block_size
    means = k[:, :, :full * block_size].unflatten(2, (full, block_size)).mean(3)
    means = torch.nn.functional.pad(means, (0, 0, 0, blocks - full))  # [B, G, blocks, K]
    queries = q.unflatten(1, (G, H // G)).sum(2)  # [B, G, Tq, K]
    n = min(top_k, blocks)
    ids, inside = torch.arange(blocks, device=q.device), torch.arange(block_size, device=q.device)
    out_idx, out_valid = [], []
    for c0 in range(0, Tq, chunk_size):
        c1 = min(c0 + chunk_size, Tq)
        positions = torch.arange(offset + c0, offset + c1, device=q.device)
        own = (positions // block_size)[:, None]  # [C, 1]
        scores = queries[:, :, c0:c1] @ means.mT  # [B, G, C, blocks]
        scores = scores.masked_fill(ids == own, float("inf"))  # its own block first
        chosen, valid = top(scores, ids <= own, n)  # [B, G, C, n]
        tokens = chosen[..., None] * block_size + inside  # [B, G, C, n, block]
        valid = valid[..., None] & (tokens <= positions[:, None, None])
        out_idx.append(tokens.clamp(max=Tk - 1).flatten(-2))  # past Tk: never valid
        out_valid.append(valid.flatten(-2))
    return torch.cat(out_idx, 2), torch.cat(out_valid, 2)


@torch.no_grad()
def slot_selection(q, slot_k, top_k: int, rate: int, offset: int):
    """The top_k complete slots per query and KV head, scored by the group's summed queries
    against each slot's pooled key (CSA-like; q . slot key, the attention's own, rather
    than a separate indexer): a bool mask [B, G, Tq, S], every complete slot while there
    are no more than top_k."""
    B, H, Tq, _ = q.shape
    G, S = slot_k.shape[1], slot_k.shape[2]
    positions = torch.arange(offset, offset + Tq, device=q.device)
    complete = (torch.arange(S, device=q.device) + 1) * rate <= positions[:, None] + 1
    mask = torch.zeros(B, G, Tq, S, dtype=torch.bool, device=q.device)
    if S == 0:
        return mask
    scores = q.unflatten(1, (G, H // G)).sum(2) @ slot_k.mT  # [B, G, Tq, S]
    idx, valid = top(scores, complete, min(top_k, S))  # [B, G, Tq, n]
    return mask.scatter_(-1, idx, valid)
