"""A transformers Cache that holds a compressed model's low-rank codes, not its keys and values.

    cache = lowrank_cache(model, layer_codes(bases), torch.bfloat16, rope=True)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)   # or model.generate
    held_bytes(cache)             # cache.py: codes only

Each layer is a transformers DynamicLayer whose `keys` and `values` are the codes
[B, 1, T, R] (R: the slot's sum of ranks over its KV heads, at the cache dtype), so
transformers' own bookkeeping (sequence length, masks, cropping, beam reordering) works on
them unchanged; `update` encodes the new tokens and returns every token's keys and values
rebuilt (cache.py says how, RoPE included). The angles come from
the model's own rotary embedding module, for positions 0..T-1 of the cached sequence.
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError as e:  # caches of one object per layer came with transformers 4.56
    raise ValueError(f"the low-rank cache needs transformers' per-layer caches "
                     f"(cache_utils.DynamicLayer, transformers 4.56 or later): {e}") from None

from .cache import CHECKED_TOKENS, SlotCodes, unrotate_half


class Rotary:
    """The model's rotary embedding (a module whose forward(x, position_ids) gives cos and
    sin [B, T, K]), for the cache to turn keys back and forth."""

    def __init__(self, module: nn.Module, width: int):
        self.module, self.width = module, width

    def angles(self, start: int, n: int, like: torch.Tensor):
        positions = torch.arange(start, start + n, device=like.device)[None]  # [1, n]
        cos, sin = self.module(like, positions)  # [1, n, K] each
        if cos.shape[-1] != self.width:
            raise ValueError(f"the rotary embedding turns {cos.shape[-1]} of the {self.width} "
                             f"channels of a head: the low-rank cache turns back whole heads "
                             f"only (a partial rotary is not served)")
        return cos[:, None], sin[:, None]  # [1, 1, n, K]: over batch and heads

    def unrotate(self, k: torch.Tensor, start: int) -> torch.Tensor:
        cos, sin = self.angles(start, k.shape[-2], k)
        return unrotate_half(k, cos, sin)

    def rotate(self, k: torch.Tensor) -> torch.Tensor:
        """k [B, G, T, K] at positions 0..T-1, rotated as the model rotates its keys."""
        cos, sin = self.angles(0, k.shape[-2], k)
        k1, k2 = k.chunk(2, dim=-1)
        return k * cos + torch.cat((-k2, k1), dim=-1) * sin


def rotary_of(model: nn.Module, width: int) -> Rotary:
    """The one rotary embedding module of a Hugging Face model; a model with none or with
    several (per layer type) is refused in one line."""
    found = [(name, m) for name, m in model.named_modules()
             if type(m).__name__.endswith("RotaryEmbedding")]
    if len(found) != 1:
        names = ", ".join(name for name, _ in found) or "none"
        raise ValueError(f"the {model.config.model_type} model has {len(found)} rotary "
                         f"embedding modules ({names}): the low-rank cache turns keys back by "
                         f"the angles of exactly one")
    return Rotary(found[0][1], width)


class LowRankLayer(DynamicLayer):
    """One attention layer's cache as codes: keys [B, 1, T, Rk], values [B, 1, T, Rv]."""

    def __init__(self, keys: SlotCodes, values: SlotCodes, rotary: Rotary | None,
                 dtype: torch.dtype):
        super().__init__()
        self.key_codes, self.value_codes, self.rotary, self.dtype = keys, values, rotary, dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        B = key_states.shape[0]
        self.key_codes.to(self.device), self.value_codes.to(self.device)
        self.keys = key_states.new_zeros((B, 1, 0, self.key_codes.codes), dtype=self.dtype)
        self.values = key_states.new_zeros((B, 1, 0, self.value_codes.codes), dtype=self.dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode the new tokens' keys [B, G, n, K] and values, keep their codes, and give
        back every cached token's keys and values rebuilt, [B, G, T, K] and [B, G, T, V]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        pre = key_states if self.rotary is None else self.rotary.unrotate(key_states, start)
        if start < CHECKED_TOKENS:  # positions whose angles are not all zero included
            turned = " turned back by their RoPE angles" if self.rotary is not None else ""
            self.key_codes.check_span(pre, "the keys" + turned)
            self.value_codes.check_span(value_states, "the values")
        new_k = self.key_codes.encode(pre).to(self.dtype)  # [B, 1, n, Rk]
        new_v = self.value_codes.encode(value_states).to(self.dtype)
        self.keys = torch.cat([self.keys, new_k], dim=-2)
        self.values = torch.cat([self.values, new_v], dim=-2)
        keys = self.key_codes.decode(self.keys, key_states.dtype)  # [B, G, T, K]
        if self.rotary is not None:
            keys = self.rotary.rotate(keys)
        return keys, self.value_codes.decode(self.values, value_states.dtype)


class LowRankCache(Cache):
    """A transformers Cache of LowRankLayers, one per attention layer."""

    def __init__(self, layers: list[LowRankLayer]):
        super().__init__(layers=layers)


def lowrank_cache(model: nn.Module, codes: list[tuple[SlotCodes, SlotCodes]],
                  dtype: torch.dtype, rope: bool) -> LowRankCache:
    """An empty LowRankCache for `model`, from its layers' codecs (cache.py layer_codes);
    rope: its keys' bases live before RoPE, so the cache turns them back."""
    n = int(model.config.num_hidden_layers)
    if len(codes) != n:
        raise ValueError(f"bases.pt holds {len(codes)} layers, the "
                         f"{model.config.model_type} model {n}")
    if getattr(model.config, "sliding_window", None) and any(
            t != "full_attention" for t in (getattr(model.config, "layer_types", None)
                                            or ["sliding_attention"])):
        raise ValueError(f"the {model.config.model_type} model has sliding-window layers: the "
                         f"low-rank cache serves layers that keep every token (a window's "
                         f"cache is not served yet)")
    rotary = rotary_of(model, codes[0][0].width) if rope else None
    return LowRankCache([LowRankLayer(k, v, rotary, dtype) for k, v in codes])
