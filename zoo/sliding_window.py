"""Sliding-window softmax attention: each query sees W keys, itself included (a band).

The softmax block with a window (Mistral, Longformer's local attention): projections, RoPE
and GQA/MQA are `softmax`'s own, and so are its options `rope: false`, `sinks` (gpt-oss's
windowed layers) and `output_gate`; `chunk` is refused (a chunked layer is softmax's).
The rank story: the past->future block M[t:, :t] of a band matrix is nonzero only in its
top-right W-1 x W-1 corner (a query at t + i sees keys back to t + i - W + 1), so its rank
is at most min(W - 1, T/2) whatever the weights; the logits stay capped by K, the value
path by G*V, and the decoding state by the W cached keys.
The budget is softmax's own (`budgets.attention_budget`, given `window`).

Kernels (the attention registry): `sdpa` over a band (in blocks of queries when the band is
long, so training costs O(T W), see zoo/ops/attention/banded.py), `flex` (FlexAttention's
block mask; CUDA, as it has no backward on CPU), `flash_attn` (window_size=(W-1, 0)),
`xformers` (a bottom-right local mask), and the reference.

Decoding keeps a rolling cache of min(W, max_len) entries: memory is bounded by W, not T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .config import require
from .facts import Facts, Sizing
from .registry import register
from .softmax import SoftmaxAttention, SoftmaxConfig


@dataclass(frozen=True)
class SlidingWindowConfig(SoftmaxConfig):
    window: int = 128  # W: keys each query sees, itself included

    owner: ClassVar[str] = "sliding_window"

    def validate(self) -> None:
        super().validate()
        require(self.window >= 1,  # the type is checked from the annotation
                f"window (W, keys including the query itself) must be an int >= 1, "
                f"got {self.window!r}")
        require(self.chunk is None,  # its ring keeps the last W keys, not a chunk's
                f"sliding_window.chunk must be null, got {self.chunk!r}: a chunked layer is "
                "softmax with chunk: C")


@dataclass
class RollingKVCache:
    """The last min(W, max_len) keys and values in a ring; `length` counts all tokens seen.

    The token at absolute position p lives in slot p % capacity. Appending a chunk returns
    the keys it must attend to in order: the W - 1 before it, then the chunk itself. A
    single token's step returns the ring as it stands (every entry is inside the window,
    and softmax attention does not care in which order it meets its keys).
    """

    k: torch.Tensor  # [B, G, capacity, K]
    v: torch.Tensor  # [B, G, capacity, V]
    window: int
    max_len: int
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[-2]

    def _slots(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, device=self.k.device) % self.capacity

    def live(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last n (default: all held) keys and values in order: [B, G, n, K], [B, G, n, V]."""
        held = min(self.length, self.capacity)
        n = held if n is None else min(n, held)
        slots = self._slots(self.length - n, self.length)
        return self.k.index_select(2, slots), self.v.index_select(2, slots)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[-2]
        if self.capacity < self.window and self.length + n > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} cached + {n} new > max_len "
                             f"{self.max_len} (smaller than the window {self.window}, so the "
                             "ring cannot roll)")
        if (n == 1 and self.capacity == self.window) or self.length + n <= self.capacity:
            # Everything the new tokens may see fits in the ring: write, then attend to it.
            self.k[:, :, self._slots(self.length, self.length + n)] = k
            self.v[:, :, self._slots(self.length, self.length + n)] = v
            self.length += n
            if self.length <= self.capacity:
                return self.k[:, :, :self.length], self.v[:, :, :self.length]  # in order
            return self.k, self.v  # one new token; all W entries are inside its window
        past_k, past_v = self.live(self.window - 1)  # [B, G, <= W-1, *]
        keep = min(n, self.capacity)  # only the chunk's last `capacity` tokens stay
        slots = self._slots(self.length + n - keep, self.length + n)
        self.k[:, :, slots] = k[:, :, n - keep:]
        self.v[:, :, slots] = v[:, :, n - keep:]
        self.length += n
        return torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)


@register("sliding_window")
class SlidingWindowAttention(SoftmaxAttention):
    Config = SlidingWindowConfig
    facts = Facts(
        Sizing("window", lambda kw, D, T: range(1, T + 1),  # W > T: no more
               "W",
               "W = window: keys each query sees, itself included; caches the last W "
               "tokens' keys and values; G as for softmax",
               lambda c: f"W={c.window}, G={c.kv_heads}"),
        cache="kv", mirrors=("sliding",))

    @property
    def window(self) -> int:
        return self.config.window

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """Two windows (W=16 and W=64), and the narrow one with MQA (one K/V head)."""
        presets = [("sliding_window (W=16)", {"window": 16}),
                   ("sliding_window (W=64)", {"window": 64})]
        if n_heads > 1:
            presets.append(("sliding_window (W=16, MQA)", {"window": 16, "n_kv_heads": 1}))
        return presets

    def _init_cache(self, batch: int, max_len: int) -> RollingKVCache:
        """A ring of min(W, max_len) entries; with max_len >= W it rolls without end."""
        c, p = self.config, self.q_proj.weight
        shape = (batch, c.kv_heads, min(c.window, max_len), c.k_dim)
        return RollingKVCache(p.new_zeros(shape), p.new_zeros(shape), c.window, max_len)

    def key_value_heads(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """softmax's, for the tokens the rolling cache keeps after a prefill of x: the last
        min(T, W) (keys before RoPE from the same tokens)."""
        heads = super().key_value_heads(x)  # x checked there
        n = min(heads["k"].shape[-2], self.config.window)
        return {name: h[..., -n:, :] for name, h in heads.items()}

    def inference_state(self, cache: RollingKVCache) -> dict[str, torch.Tensor]:
        """The live window's keys and values in order: [B, min(T, W), G*K] and [B, ..., G*V]."""
        k, v = cache.live()  # [B, G, n, K]
        B, n = k.shape[0], k.shape[2]
        return {"k": k.transpose(1, 2).reshape(B, n, -1), "v": v.transpose(1, 2).reshape(B, n, -1)}
