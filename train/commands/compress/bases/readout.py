"""How a cache's reader weighs its errors: the weights of output-aware bases, on one scale.

    keys, values = readout_weights(q, v, [P], w_o, scale**2, rope)  # an attention's slots
    rho, kappa = readout_sensitivity(P, v, M)      # per query: how errors reach the output
    W_k = query_weight(q, G, rope, rho * scale**2)  # [G, K, K] keys' weight
    W_v = value_weight(w_o, H, G)                   # [G, V, V] values' weight ...
    spread = value_spread(kappa, M, G)             # [G] ... on m m^T + spread (C - m m^T)
    U, E, gain = weighted_basis(C, W)              # the basis minimizing the weighted error

A slot (lowrank.py) of width K holds activations a with second
moment C = E[a a^T] per token. Keeping r directions, a -> P a, leaves the error (I - P) a,
and a reader with weight W feels E[(a - P a)^T W (a - P a)] = tr(W (I - P) C (I - P)^T).
Every weight here is scaled so that this is the squared error the layer adds to the
residual stream per token, to first order, in one unit for keys, values, latents and
states: the greedy allocation then compares directions of different slots and layers by
what each costs the output (docs/METRICS.md, "One scale"). readout_weights gives an
attention layer's keys' and values' weights (zoo's and Hugging Face's alike; MLA's latent
weight is built from them).

Attention output of head h at query i: o_i = W_O,h sum_j P_ij v_j. Errors of different
tokens j are treated as independent, except for their mean over tokens (a component every
value shares, which every query reads in full):
  values  E||delta o_i||^2 = ||W_O,h mean(delta v)||^2
                             + sum_j P_ij^2 ||W_O,h (delta v_j - mean(delta v))||^2,
          so the values' weight is W_O,h^T W_O,h on the effective second moment
          C_eff = m m^T + kappa (C - m m^T) (m the values' mean, kappa = mean_i sum_j
          P_ij^2, 1 / the number of keys a query effectively reads; value_spread);
  keys    a logit error delta s_ij = scale q_i . delta k_j moves the output by
          sum_j P_ij delta s_ij (W_O,h v_j - o_i), so
          E||delta o_i||^2 ~ rho_i scale^2 E_j (q_i . delta k_j)^2,
          rho_i = sum_j P_ij^2 ||W_O,h v_j - o_i||^2 (readout_sensitivity).
Averaged over queries, the key weight is sum_h mean_i rho_hi scale^2 q_hi q_hi^T (with
RoPE averaged over the rotation: pair_weight), the value weight sum_h W_O,h^T W_O,h with
C_eff's kappa averaged over the heads reading the KV head (weighted by tr W_O,h^T W_O,h).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch


class Weight(NamedTuple):
    """What a slot's reader supplies per batch: its weight [G, K, K] and, for values, the
    spread of value_spread [G] (None: the plain second moment)."""

    matrix: torch.Tensor
    spread: torch.Tensor | None = None


RIDGE = 1e-9  # relative to the weight's mean eigenvalue: directions no reader sees stay finite


def weighted_basis(gram: torch.Tensor, weight: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, E, gain) per head, fp64: gram C and weight W [G, K, K]. With S = W^(1/2), the
    eigenvectors Q of S C S by descending eigenvalue give U = S^-1 Q and E = Q^T S, so
    E U = I and P_r = U_r E_r minimizes tr(W (I - P) C (I - P)^T) over rank-r P (the
    generalized eigenproblem C W u = lambda u); gain: the eigenvalues, the weighted error
    each direction removes. r = K: P = I."""
    C, W = gram.double(), weight.double()
    K = W.shape[-1]
    W = (W + W.transpose(-1, -2)) / 2
    ridge = RIDGE * W.diagonal(dim1=-2, dim2=-1).mean(-1).clamp(min=1e-300)  # [G]
    w, V = torch.linalg.eigh(W + ridge[:, None, None] * torch.eye(K, dtype=W.dtype))
    w = w.clamp(min=float(ridge.min()))
    S = V @ torch.diag_embed(w.sqrt()) @ V.transpose(-1, -2)  # [G, K, K]
    S_inv = V @ torch.diag_embed(w.rsqrt()) @ V.transpose(-1, -2)
    gain, Q = torch.linalg.eigh(S @ C @ S)  # ascending
    gain, Q = gain.flip(-1).clamp(min=0.0), Q.flip(-1)
    return S_inv @ Q, Q.transpose(-1, -2) @ S, gain


def pair_weight(q_gram: torch.Tensor) -> torch.Tensor:
    """A query second moment [G, K, K] averaged over RoPE's rotation (rotate-half pairs
    (j, j + K/2)): each pair's diagonal block becomes its mean energy times I_2 and the
    blocks between pairs of different frequencies vanish, a diagonal [G, K, K] that
    commutes with every rotation."""
    K = q_gram.shape[-1]
    d = q_gram.diagonal(dim1=-2, dim2=-1)  # [G, K]
    pair = (d[..., :K // 2] + d[..., K // 2:]) / 2  # [G, K/2]
    return torch.diag_embed(torch.cat((pair, pair), dim=-1))


def query_weight(q: torch.Tensor, kv_heads: int, rope: bool,
                 per_query: torch.Tensor | None = None) -> torch.Tensor:
    """Queries q [B, H, T, K] -> per KV head the second moment of the query heads reading
    it [G, K, K] (head h reads KV head h // (H / G)), each query weighted by per_query
    [B, H, T] (None: 1), summed over heads and averaged over the B*T positions;
    pair-averaged with RoPE."""
    B, H, T, K = q.shape
    q64 = q.detach().cpu().double()
    if per_query is not None:
        q64 = q64 * per_query.detach().cpu().double().clamp(min=0.0).sqrt()[..., None]
    q64 = q64.reshape(B, kv_heads, H // kv_heads, T, K)
    m = torch.einsum("bgntk,bgntl->gkl", q64, q64) / (B * T)  # [G, K, K]
    return pair_weight(m) if rope else m


def value_weight(w_o: torch.Tensor, heads: int, kv_heads: int,
                 per_head: torch.Tensor | None = None) -> torch.Tensor:
    """W_O [D, H*V] (nn.Linear's [out, in]) -> per KV head the sum of per_head[h] W_O,h^T
    W_O,h over the query heads h reading it [G, V, V] (per_head None: 1)."""
    D, HV = w_o.shape
    V = HV // heads
    w = w_o.detach().cpu().double().reshape(D, heads, V)
    if per_head is not None:
        w = w * per_head.detach().cpu().double().clamp(min=0.0).sqrt()[None, :, None]
    w = w.reshape(D, kv_heads, heads // kv_heads, V)
    return torch.einsum("dgnv,dgnu->gvu", w, w)


def value_spread(kappa: torch.Tensor, M: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """kappa [B, H, T] of the query heads, M = W_O,h^T W_O,h [H, V, V] -> per KV head the
    mean kappa of the heads reading it, weighted by tr M_h [G]: how much of the values'
    fluctuation around their mean reaches the output."""
    k = kappa.detach().double().mean((0, 2)).cpu()  # [H]
    t = M.detach().double().diagonal(dim1=-2, dim2=-1).sum(-1).cpu()  # [H]
    k, t = k.reshape(kv_heads, -1), t.reshape(kv_heads, -1)
    return (k * t).sum(-1) / t.sum(-1).clamp(min=1e-300)


def head_gram(w_o: torch.Tensor, heads: int) -> torch.Tensor:
    """W_O [D, H*V] -> W_O,h^T W_O,h per query head [H, V, V]."""
    D, HV = w_o.shape
    w = w_o.detach().double().reshape(D, heads, HV // heads)
    return torch.einsum("dhv,dhu->hvu", w, w)


def readout_sensitivity(P: torch.Tensor, v: torch.Tensor, M: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho, kappa) [B, H, Tq] from attention P [B, H, Tq, S] over values v [B, H, S, V]
    (per query head) read through M = W_O,h^T W_O,h [H, V, V] (module docstring):
    kappa_i = sum_j P_ij^2, rho_i = sum_j P_ij^2 ||W_O,h v_j - o_i||^2, in fp64. Rows are
    independent: a caller may pass P a block of query rows at a time."""
    P, v, M = P.double(), v.double(), M.to(P.device, torch.float64)
    P2 = P.square()
    Mv = v @ M  # [B, H, S, V]: (M v_j) per token
    n = (Mv * v).sum(-1)  # [B, H, S]: ||W_O,h v_j||^2
    u = P @ v  # [B, H, Tq, V]: the attention output before W_O
    w = P2 @ v  # [B, H, Tq, V]
    Mu = u @ M
    kappa = P2.sum(-1)  # [B, H, Tq]
    rho = P2 @ n[..., None]  # [B, H, Tq, 1]
    rho = rho[..., 0] - 2 * (w * Mu).sum(-1) + (u * Mu).sum(-1) * kappa
    return rho.clamp(min=0.0), kappa


def readout_weights(q: torch.Tensor, v: torch.Tensor, probs: Iterable[torch.Tensor],
                    w_o: torch.Tensor, scale2: float, rope: bool) -> tuple[Weight, Weight]:
    """The keys' and the values' Weight of one attention layer, on one scale (module
    docstring): queries q [B, H, T, K] reading the keys (pair-averaged with RoPE), values v
    [B, G, S, V] per KV head, the attention as blocks of query rows [B, H, r, S] in order
    (one block: all of it), W_O [D, H*V], and scale2 the logits' scale squared."""
    H, G = q.shape[1], v.shape[1]
    M = head_gram(w_o, H)  # [H, V, V]
    v_h = v.repeat_interleave(H // G, dim=1)  # [B, H, S, V]: the values each head reads
    parts = [readout_sensitivity(P, v_h, M) for P in probs]
    rho = torch.cat([p[0] for p in parts], dim=-1)  # [B, H, T]
    kappa = torch.cat([p[1] for p in parts], dim=-1)
    return (Weight(query_weight(q, G, rope, rho * scale2)),
            Weight(value_weight(w_o, H, G), value_spread(kappa, M, G)))
