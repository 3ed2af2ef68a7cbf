"""Causal softmax attention with RoPE: MHA, and GQA/MQA through `n_kv_heads`.

The rank story: the mixing matrix softmax(QK^T) has an unbounded kernel, so its
past->future block can reach rank T/2, while the logits are capped by the head dim K, the
value path by G*V, and the KV cache by min(T, G*K) per sequence.

The options 2026 models use, each a config field (docs/CONFIG.md), none moving a cap but
`chunk`'s:

- `rope: false`: NoPE, keys and queries unrotated (Llama 4's global layers, SmolLM3).
- `sinks: true`: a learned logit per head joins each row's softmax with no value behind it
  (gpt-oss): a row of M sums to less than 1; M is P with its rows scaled by positive
  factors, so its ranks are P's.
- `output_gate: headwise | elementwise`: o * sigmoid(x W_g) before W_O (Qwen3-Next),
  one scalar per head and token or one per channel. Headwise, M carries the gate (row t
  of head h scaled by g_h(t): still y = o_proj(M @ V) exactly); elementwise, a channel's
  gate cannot live in a per-head M, so `mixing_matrices` is the ungated P and
  y = o_proj(output_gates(x) * (P @ V)). A sigmoid never vanishes: either way the ranks of
  M's blocks are P's.
- `chunk: C`: a query sees only the keys of its own chunk of C tokens (Llama 4's local
  layers): a chunk boundary carries nothing across it. M is block diagonal; its
  past->future cap is what of one chunk crosses T/2 (budgets.past_future_cap), and the
  cache is a ring of C keys that starts over at every chunk boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

import budgets
from budgets import RankBudget, attention_budget

from .block import Block, CacheReadout, CacheSlot, split_heads
from .config import StrictConfig, positive_int, require
from .facts import Facts, Sizing, divisors
from .ops.attention import ATTENTION, AttnSpec, attention_probs
from .ops.attention.reference import expand_kv
from .registry import register
from .rope import apply_rope

# output_gate -> the gate's width per head, V given: one scalar per head, or one per channel
GATE_WIDTH = {"none": lambda V: 0, "headwise": lambda V: 1, "elementwise": lambda V: V}


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
    sinks: bool = False  # a learned sink logit per head (gpt-oss)
    output_gate: str = "none"  # none | headwise | elementwise: o * sigmoid(x W_g)
    chunk: int | None = None  # C: a query sees only its own chunk of C tokens (Llama 4)

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
        require(self.output_gate in GATE_WIDTH,
                f"output_gate {self.output_gate!r} unknown; known: {list(GATE_WIDTH)}")
        require(self.chunk is None or self.chunk >= 1,  # the type is checked already
                f"chunk (C, tokens per attention chunk) must be an int >= 1, got {self.chunk!r}")
        ATTENTION.check(self.backend)

    @property
    def k_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def gate_width(self) -> int:
        """The output gate projection's width: H (headwise), H*V (elementwise) or 0."""
        return self.n_heads * GATE_WIDTH[self.output_gate](self.k_dim)


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


@dataclass
class ChunkKVCache:
    """The keys and values of the current chunk of C tokens (Llama 4's chunked layers).

    The token at absolute position p lives in slot p % C, so a chunk's tokens fill slots
    0, 1, ... in order and a new chunk starts over at slot 0: no entry ever needs moving.
    Appending returns the keys the new tokens attend to, from the start of the first new
    token's chunk (the attention kernels count chunks from key 0); `length` counts all
    tokens seen.
    """

    k: torch.Tensor  # [B, G, capacity, K], capacity min(C, max_len)
    v: torch.Tensor  # [B, G, capacity, V]
    chunk: int
    max_len: int
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[-2]

    def held(self) -> int:
        """Tokens of the chunk the last token is in: the keys it saw."""
        return self.length - (self.length - 1) // self.chunk * self.chunk if self.length else 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, C, start = k.shape[-2], self.chunk, self.length
        if self.capacity < C and start + n > self.max_len:
            raise ValueError(f"KV cache overflow: {start} cached + {n} new > max_len "
                             f"{self.max_len} (smaller than the chunk {C}, so the ring "
                             "cannot start over)")
        first = start // C * C  # the chunk of the first new token starts here
        last = (start + n - 1) // C * C  # ... and that of the last new token here
        past = start - first  # earlier tokens of the first new token's chunk: slots 0 ..
        if first == last:  # all new tokens in one chunk: write, then attend to its slots
            self.k[:, :, past:past + n] = k
            self.v[:, :, past:past + n] = v
            self.length += n
            return self.k[:, :, :past + n], self.v[:, :, :past + n]  # [B, G, past + n, *]
        keys = torch.cat((self.k[:, :, :past], k), dim=2)  # [B, G, past + n, K]
        values = torch.cat((self.v[:, :, :past], v), dim=2)
        tail = start + n - last  # the new tokens of the last chunk stay
        self.k[:, :, :tail] = k[:, :, n - tail:]
        self.v[:, :, :tail] = v[:, :, n - tail:]
        self.length += n
        return keys, values


@register("softmax")
class SoftmaxAttention(Block):
    Config = SoftmaxConfig
    facts = Facts(
        Sizing("n_kv_heads", lambda kw, D, T: divisors(kw["n_heads"]),  # whole groups
               "G",
               "G = n_kv_heads: key/value heads shared by the H query heads (MHA: G = H; "
               "GQA: 1 < G < H; MQA: G = 1); caches keys and values of every token",
               lambda c: f"G={c.kv_heads}"),
        cache="kv", mirrors=("global", "chunked"))  # chunked: its `chunk` option

    def __init__(self, config: SoftmaxConfig):
        super().__init__(config)
        H, G, K = config.n_heads, config.kv_heads, config.k_dim
        self.add_projections(q=H * K, k=G * K, v=G * K, o=H * K, bias=config.bias)  # V = K
        if config.gate_width:  # after the others: their seeded initialization stays
            self.g_proj = nn.Linear(config.d_model, config.gate_width, bias=config.bias)
        # sink logits [H], zero at the start: e^0 takes a share of every row
        self.sinks = nn.Parameter(torch.zeros(H)) if config.sinks else None

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

    def output_gates(self, x: torch.Tensor) -> torch.Tensor | None:
        """sigmoid(x W_g) per head: [B, H, T, 1] headwise, [B, H, T, V] elementwise; None
        without a gate. The output is o_proj(output_gates(x) * attention)."""
        if not self.config.gate_width:
            return None
        return torch.sigmoid(split_heads(self.g_proj, x, self.config.n_heads))

    def _forward(self, x: torch.Tensor, cache: KVCache | ChunkKVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        c = self.config
        q, k, v = self.project(x, offset=cache.length if cache is not None else 0)
        if cache is not None:
            k, v = cache.append(k, v)  # [B, G, Tk, K]: what the new tokens may see
        spec = AttnSpec.of(q, k, v, window=self.window, chunk=c.chunk, sinks=self.sinks)
        backend = ATTENTION.resolve(c.backend, spec)
        self._backend = backend.name
        o = backend.fn(q, k, v, window=self.window, scale=1 / math.sqrt(c.k_dim),
                       chunk=c.chunk, sinks=self.sinks)  # [B, H, T, V]
        gate = self.output_gates(x)  # [B, H, T, 1 or V]
        if gate is not None:
            o = o * gate
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))  # [B, T, D]

    def _init_cache(self, batch: int, max_len: int) -> KVCache | ChunkKVCache:
        c, p = self.config, self.q_proj.weight
        if c.chunk is not None:  # a ring of min(C, max_len): with max_len >= C it never fills
            shape = (batch, c.kv_heads, min(c.chunk, max_len), c.k_dim)
            return ChunkKVCache(p.new_zeros(shape), p.new_zeros(shape), c.chunk, max_len)
        shape = (batch, c.kv_heads, max_len, c.k_dim)
        return KVCache(p.new_zeros(shape), p.new_zeros(shape))

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """softmax probabilities [B, H, T, T], recomputed on the reference path (sinks and
        chunks included); with a headwise gate, each row times its token's gate."""
        c = self.config
        q, k, _ = self.project(x)
        P = attention_probs(q, k, window=self.window, scale=1 / math.sqrt(c.k_dim),
                            chunk=c.chunk, sinks=self.sinks)  # [B, H, T, T]
        if c.output_gate == "headwise":
            P = P * self.output_gates(x)  # [B, H, T, 1]: exact, y = o_proj(M @ V)
        return P

    def _mixing_operator(self, x: torch.Tensor) -> budgets.AttentionMixing | None:
        """Queries and keys (window, chunks, sinks); None with a headwise gate, whose rows
        the operator does not scale: the probe then measures mixing_matrices exactly."""
        c = self.config
        if c.output_gate == "headwise":
            return None
        q, k, _ = self.project(x)  # [B, H, T, K], [B, G, T, K]
        return budgets.AttentionMixing(q, k, 1 / math.sqrt(c.k_dim), self.window,
                                       sinks=self.sinks, chunk=c.chunk)

    def cached_tokens(self, seq_len: int) -> int:
        """How many of seq_len tokens the cache keeps live: all, the window's W, or the
        last chunk's."""
        c, n = self.config, seq_len
        if self.window is not None:
            n = min(n, self.window)
        if c.chunk is not None:
            n = min(n, seq_len - (seq_len - 1) // c.chunk * c.chunk)
        return n

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
            heads = {"k": apply_rope(k, 0, c.rope_base), "v": v, "k_pre_rope": k} if c.rope \
                else {"k": k, "v": v}
            if c.chunk is None:
                return heads
            n = self.cached_tokens(x.shape[1])  # the last chunk's tokens
            return {name: h[..., -n:, :] for name, h in heads.items()}

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
        """Keys and values per KV head (V = K), of at most W tokens under a window (C under
        chunks)."""
        c = self.config
        live = self.window or c.chunk  # tokens held at most: a window's, a chunk's, or all
        return (CacheSlot("k", c.kv_heads, c.k_dim, window=live),
                CacheSlot("v", c.kv_heads, c.k_dim, window=live))

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

    def inference_state(self, cache: KVCache | ChunkKVCache) -> dict[str, torch.Tensor]:
        """The live keys and values [B, n, G*K], [B, n, G*V]: all T, or the last chunk's."""
        B = cache.k.shape[0]
        n = cache.held() if isinstance(cache, ChunkKVCache) else cache.length
        k = cache.k[:, :, :n].transpose(1, 2).reshape(B, n, -1)  # [B, T, G*K]
        v = cache.v[:, :, :n].transpose(1, 2).reshape(B, n, -1)  # [B, T, G*V]
        return {"k": k, "v": v}

    def _budget(self, seq_len: int) -> RankBudget:
        """The softmax family's one formula, window and chunk included: mixing T/2 (or
        min(W-1, T/2), or what of one chunk crosses T/2), logits K, value path G*V,
        inference the live keys' min(T, W, the chunk's, G*K); sinks and gates move none."""
        c = self.config
        return attention_budget(self.kind, seq_len, c.n_heads, c.kv_heads, c.k_dim, c.d_model,
                                window=self.window, params=self.param_count(), chunk=c.chunk,
                                gate=c.gate_width)
