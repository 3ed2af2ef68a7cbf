"""The chunked WY/UT form in pure torch (Yang et al. 2024, "Parallelizing Linear
Transformers with the Delta Rule"; fla's `naive_chunk_kda`): linear in T.

Inside a chunk of C tokens, with G the chunk's own cumulative log gate, what each token
writes given the state S entering the chunk is w = U - W S, where the UT transform
(I + strict_tril(diag(b) (K K^T . Gamma)))^-1 is applied once to diag(b) [K exp(G), V]:

    [W, U] = (I + A)^-1 diag(b) [K exp(G), V]          (one triangular solve per chunk)
    o      = (Q exp(G)) S + (Q K^T . Gamma . tril) (U - W S)
    S'     = exp(G_last) S + (K exp(G_last - G))^T (U - W S)

All but the state pass are batched over chunks; the pass is a loop over T/C chunks. Every
exponent is a decay over a span inside one chunk (<= 0), and the C x C scores are
budgets/mixing/delta.py's `gated_scores`, the closed form's own: the largest tensors are
[B, H, T/C, C, C] (and [..., 16, 16, K] row blocks for a per-channel gate); no T x T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from budgets.mixing.delta import gate_columns, gated_scores

from ..precision import upcast_16bit


def chunked_delta(q, k, v, beta, log_gate=None, *, initial_state=None, chunk_size: int = 64):
    out_dtype = q.dtype
    q, k, v, beta, log_gate, initial_state = upcast_16bit(q, k, v, beta, log_gate,
                                                          initial_state)
    B, H, T, K = k.shape
    V = v.shape[-1]
    C = min(chunk_size, T)
    n = -(-T // C)  # chunks
    pad = n * C - T
    g = gate_columns(log_gate)  # [B, H, T, 1 | K] or None
    if pad:  # b = 0, k = 0 and no decay there: the padded tokens leave the state as it is
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta = F.pad(beta, (0, pad))
        g = None if g is None else F.pad(g, (0, 0, 0, pad))
    q, k, v = (t.unflatten(2, (n, C)) for t in (q, k, v))  # [B, H, n, C, *]
    beta = beta.unflatten(2, (n, C))  # [B, H, n, C]
    G = None if g is None else g.unflatten(2, (n, C)).cumsum(-2)  # within each chunk
    W, U, scores = chunk_terms(q, k, v, beta, G)
    qd, kd, last = read_and_carry(q, k, G)
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    outputs = []
    # unbind, not indexing: each index's backward would write a full-size zero gradient
    for Wc, Uc, Pc, qc, kc, dc in zip(W.unbind(2), U.unbind(2), scores.unbind(2), qd.unbind(2),
                                      kd.unbind(2), last.unbind(2), strict=True):
        writes = Uc - Wc @ S  # [B, H, C, V]: b_t (v_t - (D_t S_{t-1})^T k_t)
        outputs.append(qc @ S + Pc @ writes)  # [B, H, C, V]
        S = dc * S + kc.mT @ writes  # [B, H, K, V]
    o = torch.stack(outputs, dim=2).reshape(B, H, n * C, V)[:, :, :T]
    return o.to(out_dtype), S


def chunk_terms(q, k, v, beta, G):
    """W [B, H, n, C, K] and U [..., C, V], what each token writes per unit of entering
    state and from its chunk's own values, and the causal scores Q K^T . Gamma [..., C, C]."""
    # Q K^T . Gamma and K K^T . Gamma in one call: the decays are formed once
    scores, keys = gated_scores(torch.stack([q, k]), k, G).unbind(0)  # [B, H, n, C, C] each
    A = keys.tril(-1) * beta[..., :, None]  # strict_tril(diag(b) K K^T . Gamma)
    kd = k if G is None else k * torch.exp(G)  # decayed from the chunk's start
    rhs = beta[..., None] * torch.cat([kd, v], dim=-1)  # [B, H, n, C, K + V]
    WU = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)  # (I + A)^-1
    W, U = WU.split([k.shape[-1], v.shape[-1]], dim=-1)
    return W, U, scores


def read_and_carry(q, k, G):
    """q decayed from the chunk's start (it reads the entering state), k decayed to the
    chunk's end (it writes the leaving one), and the chunk's whole decay as a column over
    the state's rows [B, H, n, 1 | K, 1] (ones without a gate)."""
    if G is None:
        return q, k, q.new_ones(*q.shape[:3], 1, 1)
    end = G[..., -1:, :]  # [B, H, n, 1, 1 | K]
    return q * torch.exp(G), k * torch.exp(end - G), torch.exp(end).mT
