"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax's exp(q . k) is replaced by a feature-map kernel phi(q) . phi(k), so

    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t),   S_t = sum_{s <= t} phi(k_s) v_s^T,
                                                z_t = sum_{s <= t} phi(k_s)

(the denominator only with `normalize`). Feature maps: `elu+1` (Katharopoulos), `relu`,
`identity` (unnormalized only) and `taylor`, the second-order Taylor map of exp(q . k / sqrt(K))
used by Based (Arora et al. 2024): phi(x) = [1, x / K^(1/4), x_i x_j / sqrt(K) (i < j),
x_i^2 / sqrt(2K)], so phi(q) . phi(k) = 1 + u + u^2 / 2 with u = q . k / sqrt(K), and
F = 1 + K + K(K+1)/2 (the symmetric square only: the budget states the true dimension).

The rank story: the mixing matrix is tril(phi(Q) phi(K)^T) (row-normalized), so every block
below the diagonal, the past->future block M[T/2:, :T/2] included, has rank <= F; the logits
phi(q) . phi(k) have rank <= F; the inference state S is F x V per head.

Paths: the quadratic reference (materializes the masked kernel matrix), the chunked form in
pure torch (the training path on CPU and CUDA, linear in T), the recurrence (decoding:
one-token steps with a cache take it under `auto`), and fla's chunked kernel on CUDA
(opt-in: `backend: fla`; see zoo/ops/linear_attn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

import budgets
from budgets import RankBudget

from .block import Block, CacheSlot, decode_step_backend, split_heads
from .config import StrictConfig, positive_int, require
from .facts import Check, Facts, Sizing
from .ops.linear_attn import LINEAR_ATTN, LinearAttnSpec, linear_attn_matrix
from .registry import register

FEATURE_MAPS = ("elu+1", "relu", "identity", "taylor")


def taylor_dim(k: int) -> int:
    """F of the second-order Taylor map on K inputs: 1 + K + K(K+1)/2."""
    return 1 + k + k * (k + 1) // 2


@dataclass(frozen=True)
class LinearConfig(StrictConfig):
    owner: ClassVar[str] = "linear"

    d_model: int
    n_heads: int
    feature_map: str = "elu+1"
    feature_dim: int | None = None  # K: per-head q/k width before the feature map; None: D/H
    normalize: bool = True  # divide by phi(q_t) . sum_{s<=t} phi(k_s)
    eps: float = 1e-6  # added to the denominator
    chunk_size: int = 64  # C, of the chunked path
    bias: bool = False
    backend: str = "auto"

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads,
                     chunk_size=self.chunk_size)
        require(self.d_model % self.n_heads == 0,
                f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        if self.feature_dim is not None:
            positive_int(self.owner, feature_dim=self.feature_dim)
        require(self.feature_map in FEATURE_MAPS,
                f"feature_map {self.feature_map!r} unknown; known: {list(FEATURE_MAPS)}")
        require(not (self.normalize and self.feature_map == "identity"),
                "normalize=True needs a positive feature map; feature_map 'identity' can make "
                "the denominator zero or negative (set normalize: false)")
        require(self.eps > 0, f"eps must be positive, got {self.eps!r}")
        LINEAR_ATTN.check(self.backend)

    @property
    def head_dim(self) -> int:  # V
        return self.d_model // self.n_heads

    @property
    def k_dim(self) -> int:  # K
        return self.feature_dim or self.head_dim

    @property
    def f_dim(self) -> int:  # F
        return taylor_dim(self.k_dim) if self.feature_map == "taylor" else self.k_dim


@dataclass
class LinearCache:
    """The recurrent state per head: S (and, normalizing, the key sum z as a last column)."""

    state: torch.Tensor  # [B, H, F, V] or [B, H, F, V + 1]
    length: int = 0


@register("linear")
class LinearAttention(Block):
    Config = LinearConfig
    facts = Facts(
        Sizing("feature_dim", lambda kw, D, T: range(1, 4 * D + 1),
               "K",
               "K = feature_dim: per-head query/key width before the feature map; F = "
               "features after it (elu+1: F = K; Taylor, Based's 2nd-order map: F = 1 + K + "
               "K(K+1)/2, so K=16 gives F=153); a state of F x V per head at any length",
               lambda c: f"K={c.k_dim}, F={c.f_dim}"),
        cache="state", state_row="inference.state",
        checks=(Check("cheaper_block", "linear_f{n}",
                      lambda n: {"block": "linear", "feature_map": "identity",
                                 "feature_dim": n, "normalize": False},
                      "linear attention with F = {n}"),))

    def __init__(self, config: LinearConfig):
        super().__init__(config)
        c = config
        H, K, V = c.n_heads, c.k_dim, c.head_dim
        self.add_projections(q=H * K, k=H * K, v=H * V, o=H * V, bias=c.bias)
        if c.feature_map == "taylor":
            i, j = torch.triu_indices(K, K)  # the K(K+1)/2 pairs i <= j
            weight = torch.where(i == j, 1 / math.sqrt(2 * K), 1 / math.sqrt(K))
            self.register_buffer("_pairs", torch.stack([i, j]), persistent=False)
            self.register_buffer("_pair_weight", weight, persistent=False)

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """elu+1 with K = D/H, and Based's Taylor map with K = min(16, D/H)."""
        k = min(16, d_model // max(n_heads, 1))
        return [("linear (elu+1)", {"feature_map": "elu+1"}),
                (f"linear (Taylor, K={k})", {"feature_map": "taylor", "feature_dim": k})]

    # ---------------------------------------------------------------- paths

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """phi: [..., K] -> [..., F]."""
        kind = self.config.feature_map
        if kind == "elu+1":
            return F.elu(x) + 1
        if kind == "relu":
            return F.relu(x)
        if kind == "identity":
            return x
        K = x.shape[-1]
        i, j = self._pairs
        square = x[..., i] * x[..., j] * self._pair_weight.to(x.dtype)  # [..., K(K+1)/2]
        return torch.cat([torch.ones_like(x[..., :1]), x / K ** 0.25, square], dim=-1)

    def features(self, x: torch.Tensor):
        """phi(q), phi(k) [B, H, T, F] and v [B, H, T, V] of x [B, T, D]."""
        H = self.config.n_heads
        q = self.feature_map(split_heads(self.q_proj, x, H))
        k = self.write_rows(self.feature_map(split_heads(self.k_proj, x, H)))
        return q, k, split_heads(self.v_proj, x, H)

    def write_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """phi(k) [B, H, T, F], the writer of the state's F rows, as every path takes it:
        the identity (compress wraps it to project the rows)."""
        return rows

    def state_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What writes the state's rows and what reads them: phi(k), phi(q) [B, H, T, F]."""
        q, k, _ = self.features(x)
        return k, q

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The value path per head [B, H, T, V]."""
        return split_heads(self.v_proj, x, self.config.n_heads)

    def readout(self, mixed: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """[B, H, T, V] mixed values -> y [B, T, D]: the output projection (x is unused)."""
        B, H, T, V = mixed.shape
        return self.o_proj(mixed.transpose(1, 2).reshape(B, T, H * V))

    def _forward(self, x: torch.Tensor, cache: LinearCache | None) -> torch.Tensor:
        c = self.config
        q, k, v = self.features(x)  # [B, H, T, F], [B, H, T, F], [B, H, T, V]
        if c.normalize:
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [B, H, T, V+1]
        if cache is not None and cache.state.shape[-1] != v.shape[-1]:
            raise ValueError(f"linear cache holds a state of shape {tuple(cache.state.shape)}; "
                             f"this block needs [B, {c.n_heads}, {c.f_dim}, {v.shape[-1]}]")
        requested = decode_step_backend(c.backend, cache, x.shape[1], step="recurrent")
        backend = LINEAR_ATTN.resolve(requested, LinearAttnSpec.of(q, k, v))
        self._backend = backend.name
        o, state = backend.fn(q, k, v, initial_state=None if cache is None else cache.state,
                              chunk_size=c.chunk_size)
        if cache is not None:
            cache.state = state.to(cache.state.dtype)
            cache.length += x.shape[1]
        if c.normalize:
            o = o[..., :-1] / (o[..., -1:] + c.eps)  # [B, H, T, V]
        return self.readout(o)

    def _init_cache(self, batch: int, max_len: int) -> LinearCache:
        """A zero state; its size does not depend on max_len (accepted for the contract)."""
        c = self.config
        return LinearCache(self.q_proj.weight.new_zeros(
            batch, c.n_heads, c.f_dim, c.head_dim + int(c.normalize)))

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """The masked kernel matrix [B, H, T, T], row-normalized when `normalize`.

        M[t, s] = phi(q_t) . phi(k_s) for s <= t (divided by sum_s M[t, s] + eps when
        normalizing), so that  y == self.readout(M @ self.value_heads(x))  exactly.
        """
        q, k, _ = self.features(x)
        M = linear_attn_matrix(q, k)  # [B, H, T, T]
        if self.config.normalize:
            M = M / (M.sum(-1, keepdim=True) + self.config.eps)
        return M

    def _mixing_operator(self, x: torch.Tensor) -> budgets.FactoredMixing:
        """M[t, s] = phi(q_t) . phi(k_s) / z_t for s <= t, so the past->future block is
        (phi(q) / z)[h:] @ phi(k)[:h]^T: rank <= F, exact from its factors."""
        q, k, _ = self.features(x)  # [B, H, T, F]
        h = x.shape[1] // 2
        if self.config.normalize:  # z_t = phi(q_t) . sum_{s<=t} phi(k_s) + eps
            q = q / ((q * k.cumsum(-2)).sum(-1, keepdim=True) + self.config.eps)
        return budgets.FactoredMixing(q[..., h:, :], k[..., :h, :])

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        c = self.config
        wq = self.q_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        wk = self.k_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        return {
            "qk": wq.transpose(1, 2) @ wk,  # [H, D, D]: W_Q^h W_K^h^T, rank <= K <= F
            "value": self.v_proj.weight.float().T,  # [D, H*V]
            "out": self.o_proj.weight.float(),  # [D, H*V]
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """The state per head: F rows of V (+ 1, normalizing) columns."""
        c = self.config
        return (CacheSlot("state", c.n_heads, c.f_dim, columns=c.head_dim + int(c.normalize)),)

    def describe_cache(self) -> str:
        c = self.config
        return f"{c.n_heads} heads x state F {c.f_dim} x {c.head_dim + int(c.normalize)}"

    def inference_state(self, cache: LinearCache) -> dict[str, torch.Tensor]:
        """The state S per head [B, H, F, V] (the key-sum column z left out)."""
        return {"state": cache.state[..., :self.config.head_dim]}

    def _budget(self, seq_len: int) -> RankBudget:
        c = self.config
        H, K, V, Fd, D, T = c.n_heads, c.k_dim, c.head_dim, c.f_dim, c.d_model, seq_len
        Vs = V + int(c.normalize)  # the state's columns
        return RankBudget(
            block=self.kind, seq_len=T, n_heads=H,
            mixing=min(Fd, T // 2),  # tril(phi(Q) phi(K)^T): off-diagonal blocks rank <= F
            logits=Fd,
            value_path=min(D, H * V),
            inference=min(Fd, V),  # per head
            params=self.param_count(),
            cache_elements=H * Fd * Vs,
            # projections, then per head the state update and its read-out (recurrent form)
            flops_per_token=2 * D * (2 * H * K + 2 * H * V) + 4 * H * Fd * Vs,
        )
