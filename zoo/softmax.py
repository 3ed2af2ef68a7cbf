"""Causal softmax attention with RoPE: MHA, and GQA/MQA through `n_kv_heads`.

The rank story: the mixing matrix softmax(QK^T) has an unbounded kernel, so its
past->future block can reach rank T/2, while the logits are capped by the head dim K, the
value path by G*V, and the KV cache by min(T, G*K) per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

import budgets
from budgets import RankBudget, attention_budget

from .block import Block, CacheReadout, CacheSlot, split_heads
from .config import StrictConfig, positive_int, require
from .facts import Facts, Sizing, divisors
from .ops.attention import ATTENTION, AttnSpec, attention_probs
from .ops.attention.reference import expand_kv
from .registry import register
from .rope import apply_rope


@dataclass(frozen=True)
class SoftmaxConfig(StrictConfig):
    d_model: int
    n_heads: int
    n_kv_heads: int | None = None  # None: MHA (G = H); 1: MQA; otherwise GQA
    head_dim: int | None = None  # None: d_model // n_heads
    rope: bool = True
    rope_base: float = 10000.0
    bias: bool = False
    backend: str = "auto"

    owner: ClassVar[str] = "softmax"  # the block name that errors start with

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads)
        if self.head_dim is None:
            require(self.d_model % self.n_heads == 0,
                    f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        else:
            positive_int(self.owner, head_dim=self.head_dim)
        if self.n_kv_heads is not None:
            positive_int(self.owner, n_kv_heads=self.n_kv_heads)
            require(self.n_heads % self.n_kv_heads == 0,
                    f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        require(not self.rope or self.k_dim % 2 == 0,
                f"RoPE needs an even head_dim, got {self.k_dim}")
        require(self.rope_base > 0, f"rope_base must be positive, got {self.rope_base}")
        ATTENTION.check(self.backend)

    @property
    def k_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


@dataclass
class KVCache:
    """Preallocated keys and values; `length` tokens are filled."""

    k: torch.Tensor  # [B, G, max_len, K]
    v: torch.Tensor  # [B, G, max_len, V]
    length: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[-2]
        if end > self.k.shape[-2]:
            raise ValueError(f"KV cache overflow: {self.length} cached + {k.shape[-2]} new "
                             f"> max_len {self.k.shape[-2]}")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # [B, G, end, K], [B, G, end, V]


@register("softmax")
class SoftmaxAttention(Block):
    Config = SoftmaxConfig
    facts = Facts(
        Sizing("n_kv_heads", lambda kw, D, T: divisors(kw["n_heads"]),  # whole groups
               "G",
               "G = n_kv_heads: key/value heads shared by the H query heads (MHA: G = H; "
               "GQA: 1 < G < H; MQA: G = 1); caches keys and values of every token",
               lambda c: f"G={c.kv_heads}"),
        cache="kv", mirrors=("global",))

    def __init__(self, config: SoftmaxConfig):
        super().__init__(config)
        H, G, K = config.n_heads, config.kv_heads, config.k_dim
        self.add_projections(q=H * K, k=G * K, v=G * K, o=H * K, bias=config.bias)  # V = K

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """Notable presets: MHA, GQA (a quarter of the heads, or half when H < 8), MQA."""
        presets = [("softmax (MHA)", {})]
        groups = n_heads // 4 if n_heads >= 8 else n_heads // 2
        if 1 < groups < n_heads and n_heads % groups == 0:
            presets.append((f"softmax (GQA, G={groups})", {"n_kv_heads": groups}))
        if n_heads > 1:
            presets.append(("softmax (MQA)", {"n_kv_heads": 1}))
        return presets

    @property
    def window(self) -> int | None:
        """Keys each query sees, itself included; None: all earlier keys (sliding_window: W)."""
        return None

    def project(self, x: torch.Tensor, offset: int = 0):
        """Queries, keys and values of x [B, T, D], rotated for positions offset + t."""
        c = self.config
        q = split_heads(self.q_proj, x, c.n_heads)  # [B, H, T, K]
        if c.rope:
            q = apply_rope(q, offset, c.rope_base)
        return (q, *self.keys_values(x, offset))

    def keys_values(self, x: torch.Tensor, offset: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys (rotated for positions offset + t) and values the cache holds, as the
        forward and the mixing take them: [B, G, T, K], [B, G, T, V]."""
        c = self.config
        k = split_heads(self.k_proj, x, c.kv_heads)  # [B, G, T, K]
        v = split_heads(self.v_proj, x, c.kv_heads)  # [B, G, T, V]
        return (apply_rope(k, offset, c.rope_base) if c.rope else k), v

    def _forward(self, x: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x, offset=cache.length if cache is not None else 0)
        if cache is not None:
            k, v = cache.append(k, v)  # [B, G, Tk, K]: everything seen so far
        backend = ATTENTION.resolve(self.config.backend, AttnSpec.of(q, k, v, window=self.window))
        self._backend = backend.name
        o = backend.fn(q, k, v, window=self.window, scale=1 / math.sqrt(self.config.k_dim))
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))  # [B, T, D]

    def _init_cache(self, batch: int, max_len: int) -> KVCache:
        c, p = self.config, self.q_proj.weight
        shape = (batch, c.kv_heads, max_len, c.k_dim)
        return KVCache(p.new_zeros(shape), p.new_zeros(shape))

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """softmax probabilities [B, H, T, T], recomputed on the reference path."""
        q, k, _ = self.project(x)
        return attention_probs(q, k, window=self.window, scale=1 / math.sqrt(self.config.k_dim))

    def _mixing_operator(self, x: torch.Tensor) -> budgets.AttentionMixing:
        q, k, _ = self.project(x)  # [B, H, T, K], [B, G, T, K]
        return budgets.AttentionMixing(q, k, 1 / math.sqrt(self.config.k_dim), self.window)

    def key_value_heads(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """An optional probe method (not the contract; budgets.probe.blocks measures it when a
        block has it): per KV head, in fp32 on the reference path, the keys "k" [B, G, T, K]
        and values "v" [B, G, T, V] a prefill of x caches, and with RoPE the keys before
        it, "k_pre_rope" (the projection's output, what low-rank KV methods compress)."""
        self.check_input(x)
        c = self.config
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            x = x.float()
            k = split_heads(self.k_proj, x, c.kv_heads)  # [B, G, T, K]
            v = split_heads(self.v_proj, x, c.kv_heads)  # [B, G, T, V]
            if not c.rope:
                return {"k": k, "v": v}
            return {"k": apply_rope(k, 0, c.rope_base), "v": v, "k_pre_rope": k}

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The value path per query head [B, H, T, V]: y = o_proj(P @ value_heads(x))."""
        return expand_kv(split_heads(self.v_proj, x, self.config.kv_heads), self.config.n_heads)

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        c = self.config
        wq = self.q_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        wk = expand_kv(self.k_proj.weight.float().view(1, c.kv_heads, c.k_dim, c.d_model),
                       c.n_heads)[0]  # [H, K, D]
        return {
            "qk": wq.transpose(1, 2) @ wk,  # [H, D, D]: W_Q^h W_K^h^T, rank <= K
            "value": self.v_proj.weight.float().T,  # [D, G*V]
            "out": self.o_proj.weight.float(),  # [D, H*V]
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """Keys and values per KV head (V = K), of the last W tokens under a window."""
        c = self.config
        return (CacheSlot("k", c.kv_heads, c.k_dim, window=self.window),
                CacheSlot("v", c.kv_heads, c.k_dim, window=self.window))

    def describe_cache(self) -> str:
        c = self.config
        return f"{c.kv_heads} KV heads x (K {c.k_dim} + V {c.k_dim})"

    def cache_readout(self, x: torch.Tensor) -> CacheReadout:
        """The rotated queries (RoPE keeps each pair's energy), the attention, the values
        per KV head and W_O: what reads the keys and values of x [B, T, D]."""
        q, _, v = self.project(x)  # [B, H, T, K], [B, G, T, V]
        c = self.config
        return CacheReadout(q, self.mixing_matrices(x), v, self.o_proj.weight, 1 / c.k_dim,
                            c.rope)

    def inference_state(self, cache: KVCache) -> dict[str, torch.Tensor]:
        B, n = cache.k.shape[0], cache.length
        k = cache.k[:, :, :n].transpose(1, 2).reshape(B, n, -1)  # [B, T, G*K]
        v = cache.v[:, :, :n].transpose(1, 2).reshape(B, n, -1)  # [B, T, G*V]
        return {"k": k, "v": v}

    def _budget(self, seq_len: int) -> RankBudget:
        """The softmax family's one formula, window included: mixing T/2 (or min(W-1, T/2)),
        logits K, value path G*V, inference the live keys' min(T, W, G*K)."""
        c = self.config
        return attention_budget(self.kind, seq_len, c.n_heads, c.kv_heads, c.k_dim, c.d_model,
                                window=self.window, params=self.param_count())
