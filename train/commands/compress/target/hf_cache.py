"""A transformers Cache that holds a compressed model's low-rank codes, not its keys and values.

    cache = lowrank_cache(model, layer_codes(bases), torch.bfloat16, rope=True)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)   # or model.generate
    held_bytes(cache)             # cache.py: codes (and a hybrid's states), no bases

Each layer is a transformers DynamicLayer whose `keys` and `values` are the codes
[B, 1, T, R] (R: the slot's sum of ranks over its KV heads, at the cache dtype), so
transformers' own bookkeeping (sequence length, masks, cropping, beam reordering) works on
them unchanged; `update` encodes the new tokens and returns every token's keys and values
rebuilt (cache.py says how, RoPE included). The angles come from
the model's own rotary embedding module, for positions 0..T-1 of the cached sequence.

A hybrid's cache has a layer per model layer: the attention layers' (by their numbers in
bases.pt) hold codes; every other layer is the one transformers builds for its config
(a delta rule's, an SSM's or a short convolution's states, in full), and a layer of both
(falcon_h1's) holds codes beside its states (LowRankHybridLayer).
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from transformers.cache_utils import (
        Cache,
        DynamicCache,
        DynamicLayer,
        LinearAttentionAndFullAttentionLayer,
        LinearAttentionLayer,
    )
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
        self._codecs(keys, values, rotary, dtype)

    def _codecs(self, keys: SlotCodes, values: SlotCodes, rotary: Rotary | None,
                dtype: torch.dtype) -> None:
        # code_dtype, not dtype: a hybrid layer's states set dtype to their own
        self.key_codes, self.value_codes, self.rotary = keys, values, rotary
        self.code_dtype = dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        B = key_states.shape[0]
        self.key_codes.to(self.device), self.value_codes.to(self.device)
        self.keys = key_states.new_zeros((B, 1, 0, self.key_codes.codes),
                                         dtype=self.code_dtype)
        self.values = key_states.new_zeros((B, 1, 0, self.value_codes.codes),
                                           dtype=self.code_dtype)
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
        new_k = self.key_codes.encode(pre).to(self.code_dtype)  # [B, 1, n, Rk]
        new_v = self.value_codes.encode(value_states).to(self.code_dtype)
        self.keys = torch.cat([self.keys, new_k], dim=-2)
        self.values = torch.cat([self.values, new_v], dim=-2)
        keys = self.key_codes.decode(self.keys, key_states.dtype)  # [B, G, T, K]
        if self.rotary is not None:
            keys = self.rotary.rotate(keys)
        return keys, self.value_codes.decode(self.values, value_states.dtype)


class LowRankHybridLayer(LowRankLayer, LinearAttentionAndFullAttentionLayer):
    """A hybrid layer's cache (falcon_h1's attention beside its SSM): the attention's codes
    as LowRankLayer holds them, the SSM's conv and recurrent states in full, as
    transformers' own layer of both holds them."""

    def __init__(self, keys: SlotCodes, values: SlotCodes, rotary: Rotary | None,
                 dtype: torch.dtype, number_of_states: int = 1):
        LinearAttentionAndFullAttentionLayer.__init__(self, number_of_states=number_of_states)
        self._codecs(keys, values, rotary, dtype)

    def lazy_initialization(self, *args, **kwargs) -> None:
        # the attention's update passes its keys and values; the states come as keywords
        if args:
            LowRankLayer.lazy_initialization(self, *args)
            return
        states = kwargs.get("conv_states")
        if states is not None:  # its step counter lives where the states do
            self.cumulative_length_linear = self.cumulative_length_linear.to(states.device)
        LinearAttentionLayer.lazy_initialization(self, **kwargs)


class LowRankCache(Cache):
    """A transformers Cache of LowRankLayers, one per attention layer, beside a hybrid's
    other layers as transformers holds them (their states in full)."""

    def __init__(self, layers: list):
        super().__init__(layers=layers)


def lowrank_cache(model: nn.Module, codes: dict[int, tuple[SlotCodes, SlotCodes]],
                  dtype: torch.dtype, rope: bool) -> LowRankCache:
    """An empty LowRankCache for `model`, from its attention layers' codecs by layer number
    (cache.py layer_codes); rope: its keys' bases live before RoPE, so the cache turns them
    back. Each other layer keeps the cache layer transformers gives it."""
    n = int(model.config.num_hidden_layers)
    outside = sorted(i for i in codes if not 0 <= i < n)
    if outside:
        raise ValueError(f"bases.pt holds layers {outside}, the {model.config.model_type} "
                         f"model 0-{n - 1}")
    rotary = rotary_of(model, next(iter(codes.values()))[0].width) if rope else None
    plain = _plain_layers(model, n)
    return LowRankCache([layer if i not in codes else
                         _coded(model, i, layer, *codes[i], rotary, dtype)
                         for i, layer in enumerate(plain)])


def _plain_layers(model: nn.Module, n: int) -> list:
    """The cache layers transformers builds for the model's config, one per layer."""
    config = getattr(model.config, "get_text_config", lambda **_: model.config)(decoder=True)
    layers = DynamicCache(config=config).layers
    if len(layers) != n:
        raise ValueError(f"transformers' cache for the {model.config.model_type} model has "
                         f"{len(layers)} layers, the model {n}: the low-rank cache takes "
                         f"one per layer")
    return layers


def _coded(model: nn.Module, i: int, plain, keys: SlotCodes, values: SlotCodes,
           rotary: Rotary | None, dtype: torch.dtype) -> LowRankLayer:
    """Attention layer i's cache of codes, in place of transformers' `plain` layer: one
    that keeps every token (alone, or beside a hybrid's states), else refused."""
    if type(plain) is DynamicLayer:
        return LowRankLayer(keys, values, rotary, dtype)
    if type(plain) is LinearAttentionAndFullAttentionLayer:
        return LowRankHybridLayer(keys, values, rotary, dtype, plain.number_of_states)
    raise ValueError(f"the {model.config.model_type} model's layer {i} caches a "
                     f"{type(plain).__name__}: the low-rank cache serves layers that keep "
                     f"every token (a window's cache is not served yet)")


# transformers' cache layers the low-rank cache keeps beside its codes, or replaces
SERVED = (DynamicLayer, LinearAttentionLayer, LinearAttentionAndFullAttentionLayer)


def unserved_hybrid(model: nn.Module, ids: torch.Tensor, numbers: list[int]) -> str | None:
    """Why the low-rank cache cannot stand in for a hybrid's own cache (attention layers
    `numbers`), from the cache the model builds on ids [1, n]: a class of its own (MiniMax's,
    recurrent_gemma's), or a layer of a kind it does not hold; None: it can."""
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = next((out[k] for k in ("cache", "past_key_values") if k in out), None)
    kind = type(model.config).model_type
    if type(cache) is not DynamicCache:
        held = ("returns no cache object" if cache is None
                else f"keeps its cache in a {type(cache).__name__}")
        return (f"the {kind} model {held}: the low-rank cache decodes a hybrid through "
                f"transformers' DynamicCache layers alone")
    plain = _plain_layers(model, len(cache.layers))
    for i, (held, built) in enumerate(zip(cache.layers, plain, strict=True)):
        served = (DynamicLayer, LinearAttentionAndFullAttentionLayer) if i in numbers else SERVED
        if type(held) is not type(built) or type(held) not in served:
            return (f"the {kind} model's layer {i} caches a {type(held).__name__}: the "
                    f"low-rank cache serves layers that keep every token beside transformers' "
                    f"linear-attention states")
    return None


def unserved_rotary(model: nn.Module, width: int) -> str | None:
    """Why the low-rank cache cannot turn this model's keys back by their RoPE angles (no
    one rotary embedding, or one over part of each head); None: it can."""
    like = next(model.parameters())
    try:
        rotary_of(model, width).angles(0, 1, like.new_zeros(1, 1, width))
    except ValueError as e:
        return str(e)
    return None
