"""The low-rank KV cache a saved compressed model decodes with: r codes per head and token.

    codes = SlotCodes(decoders, encoders)   # one slot: per head U_r [K, r], E_r [r, K]
    c = codes.encode(a)                     # a [B, G, T, K] -> codes [B, 1, T, R], R = sum r
    a = codes.decode(c, torch.float32)      # -> [B, G, T, K]: U_r E_r a per head, P a
    caches = zoo_caches(model, layers, batch=1, max_len=512, dtype=torch.bfloat16)
    logits = model(tokens, caches)          # a DecoderLM decoding from codes
    held_bytes(caches)                      # the bytes of every tensor the cache holds

`rankzoo compress --save` writes a model whose W_K and W_V are projected (P W per KV head)
and its bases (bases.pt). A cache of full keys would still hold K numbers per head and
token; this one holds the codes E_r a (r numbers per head and token, every head's codes of
a slot side by side in one [B, 1, T, R] tensor, R = the slot's sum of ranks, at the cache
dtype) and rebuilds U_r c on read. Since the projected keys are P a and E_r U_r = I, the
rebuilt keys equal the projected model's own: what was measured is what is served, and
the cache holds what the row counted, its bytes per token times the tokens.

Keys before RoPE (compress's default on RoPE models) are what the bases span, but the
model rotates them before they reach its cache. The cache turns each token's key back by
its position's angles (RoPE is a rotation per pair of channels: undone exactly, up to
rounding), keeps its codes, and rotates the rebuilt keys for positions 0..T-1 on read. A
layer's first CHECKED_TOKENS keys and values are checked to lie in the span of its bases,
so a model whose RoPE is not rotate-half over the whole head is refused in one line rather
than decoded wrong (hf_cache.py holds the Hugging Face side).

The bases are weights (the cost model of compress: `basis_bytes`, once per model): they
live in the SlotCodes, not in the cache, and held_bytes does not count them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoo.rope import apply_rope, rope_angles

SPAN_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}  # relative residual; else 5e-2
CHECKED_TOKENS = 16  # the first tokens' keys and values checked to lie in the bases' span


class SlotCodes:
    """One slot's codec (a layer's keys or values): per head a decoder U_r [K, r] and an
    encoder E_r [r, K], held as block-diagonal matrices over the heads."""

    def __init__(self, decoders: list[torch.Tensor], encoders: list[torch.Tensor] | None,
                 name: str = "slot"):
        K = decoders[0].shape[0]
        encoders = encoders or [u.T for u in decoders]  # an energy basis: E = U^T
        self.name, self.heads, self.width = name, len(decoders), K
        self.ranks = [int(u.shape[1]) for u in decoders]
        R = sum(self.ranks)
        self.enc = torch.zeros(R, self.heads * K, dtype=torch.float32)  # [R, G*K]
        self.dec = torch.zeros(self.heads * K, R, dtype=torch.float32)  # [G*K, R]
        at = 0
        for g, (u, e) in enumerate(zip(decoders, encoders, strict=True)):
            if tuple(u.shape) != (K, self.ranks[g]) or tuple(e.shape) != (self.ranks[g], K):
                raise ValueError(f"{name}: head {g}: decoder {tuple(u.shape)} and encoder "
                                 f"{tuple(e.shape)} do not pair as [K, r] and [r, K]")
            r = self.ranks[g]
            self.dec[g * K:(g + 1) * K, at:at + r] = u.float()
            self.enc[at:at + r, g * K:(g + 1) * K] = e.float()
            at += r

    @property
    def codes(self) -> int:
        """R: the numbers one token's codes take, every head's together."""
        return sum(self.ranks)

    def to(self, device) -> SlotCodes:
        self.enc, self.dec = self.enc.to(device), self.dec.to(device)
        return self

    def encode(self, a: torch.Tensor) -> torch.Tensor:
        """a [B, G, T, K] -> its codes [B, 1, T, R] (fp32; the cache casts them)."""
        B, G, T, K = a.shape
        if (self.heads, self.width) != (G, K):
            raise ValueError(f"{self.name}: activations {tuple(a.shape)} do not match "
                             f"{self.heads} heads of width {self.width}")
        flat = a.transpose(1, 2).reshape(B, T, G * K).float()  # [B, T, G*K]
        return (flat @ self.enc.T)[:, None]  # [B, 1, T, R]

    def decode(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """codes [B, 1, T, R] -> the rebuilt activations [B, G, T, K] in `dtype`."""
        B, _, T, _ = codes.shape
        flat = codes[:, 0].float() @ self.dec.T  # [B, T, G*K]
        return flat.view(B, T, self.heads, self.width).transpose(1, 2).to(dtype)

    def check_span(self, a: torch.Tensor, what: str) -> None:
        """A clear error unless a [B, G, T, K] lies in the span of the bases (P a = a):
        the saved weights and bases belong together, and the keys were turned back right."""
        if not a.numel():
            return
        rebuilt = self.decode(self.encode(a), torch.float32)
        scale = a.float().norm().clamp_min(1e-30)
        residual = float((rebuilt - a.float()).norm() / scale)
        tolerance = SPAN_TOLERANCE.get(a.dtype, 5e-2)
        if residual > tolerance:
            raise ValueError(f"{self.name}: {what} do not lie in the span of the saved bases "
                             f"(relative residual {residual:.2g} > {tolerance:g}): {SPAN_HINT}")


SPAN_HINT = ("the weights are not the ones saved with these bases, or the model's RoPE is "
             "not the rotate-half rotation over the whole head that the low-rank cache "
             "turns back")


def layer_codes(bases: dict) -> dict[int, tuple[SlotCodes, SlotCodes]]:
    """Per layer (the model's number: a hybrid's attention layers only), (keys' codec,
    values' codec) from bases.pt's document (saved/save.py)."""
    layers = sorted({int(key.split(".")[0]) for key in bases["bases"]})
    missing = [f"{i}.{kind}" for i in layers for kind in ("k", "v")
               if f"{i}.{kind}" not in bases["bases"]]
    if missing or not layers:
        raise ValueError(f"bases.pt: a KV cache needs keys and values of every layer it "
                         f"holds ({layers}); missing {missing or 'every layer'}")

    def codec(key: str) -> SlotCodes:
        return SlotCodes(bases["bases"][key], bases["encoders"].get(key), f"layer {key}")
    return {i: (codec(f"{i}.k"), codec(f"{i}.v")) for i in layers}


# ---------------------------------------------------------------- RoPE, undone and redone

def unrotate_half(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x from y = x cos + rotate_half(x) sin (cos, sin broadcast to y [..., T, K], each
    half a pair's angle): the rotation by minus the angle, divided by cos^2 + sin^2 where a
    model scales its angles' cos and sin (an attention scaling)."""
    y1, y2 = y.chunk(2, dim=-1)
    turned = torch.cat((-y2, y1), dim=-1)  # rotate_half(y)
    return (y * cos - turned * sin) / (cos * cos + sin * sin)


def zoo_unrotate(k: torch.Tensor, offset: int, base: float) -> torch.Tensor:
    """zoo.rope.apply_rope(x, offset, base) undone: x from k [B, G, T, K]."""
    positions = torch.arange(offset, offset + k.shape[-2], device=k.device)
    cos, sin = rope_angles(positions, k.shape[-1], base)  # [T, K/2]
    cos, sin = torch.cat((cos, cos), -1).to(k.dtype), torch.cat((sin, sin), -1).to(k.dtype)
    return unrotate_half(k, cos, sin)


# ---------------------------------------------------------------- a zoo model's cache

@dataclass
class LowRankKVCache:
    """A softmax block's cache as codes: the zoo KVCache's contract (append returns every
    key and value so far, `length` counts them), holding [B, max_len, R] codes per slot."""

    k: torch.Tensor  # [B, max_len, Rk] at the cache dtype
    v: torch.Tensor  # [B, max_len, Rv]
    keys: SlotCodes
    values: SlotCodes
    rope_base: float | None  # the block's RoPE base; None: keys cached as computed
    length: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, end = k.shape[-2], self.length + k.shape[-2]
        if end > self.k.shape[1]:
            raise ValueError(f"low-rank KV cache overflow: {self.length} cached + {n} new > "
                             f"max_len {self.k.shape[1]}")
        pre = k if self.rope_base is None else zoo_unrotate(k, self.length, self.rope_base)
        if self.length < CHECKED_TOKENS:  # a RoPE angle of 0 at position 0 proves nothing
            self.keys.check_span(pre, "the keys" + (" turned back" if self.rope_base else ""))
            self.values.check_span(v, "the values")
        self.k[:, self.length:end] = self.keys.encode(pre)[:, 0].to(self.k.dtype)
        self.v[:, self.length:end] = self.values.encode(v)[:, 0].to(self.v.dtype)
        self.length = end
        keys = self.keys.decode(self.k[:, None, :end], k.dtype)  # [B, G, end, K]
        if self.rope_base is not None:
            keys = apply_rope(keys, 0, self.rope_base)
        return keys, self.values.decode(self.v[:, None, :end], v.dtype)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def zoo_caches(model, layers: dict[int, tuple[SlotCodes, SlotCodes]], batch: int,
               max_len: int, dtype: torch.dtype) -> list[LowRankKVCache]:
    """One LowRankKVCache per layer of a DecoderLM whose blocks cache keys and values in
    full (softmax's KVCache), for up to max_len tokens; a block of another cache (a
    window's ring, a latent, a state) is refused in one line."""
    from zoo.softmax import KVCache

    blocks = [layer.mixer for layer in model.layers]
    if sorted(layers) != list(range(len(blocks))):
        raise ValueError(f"bases.pt holds layers {sorted(layers)}, the model "
                         f"0-{len(blocks) - 1}")
    out = []
    where = next(model.parameters()).device
    for i, block in enumerate(blocks):
        keys, values = layers[i]
        plain = block.init_cache(1, 1)
        if type(plain) is not KVCache:
            raise ValueError(f"layer {i} ({block.kind}) caches a {type(plain).__name__}: the "
                             f"low-rank cache serves blocks that keep every key and value "
                             f"(softmax); a window's ring is not served yet")
        rope = block.config.rope_base if block.config.rope else None
        out.append(LowRankKVCache(
            torch.zeros(batch, max_len, keys.codes, dtype=dtype, device=where),
            torch.zeros(batch, max_len, values.codes, dtype=dtype, device=where),
            keys.to(where), values.to(where), rope))
    return out


def kv_only(info: dict) -> str | None:
    """Why the low-rank cache does not serve the saved model compress.json's `info`
    describes: it holds keys and values, not a latent or a state (None: it serves it)."""
    if info.get("family", "kv") != "kv":
        return (f"a {info['family']} cache; the low-rank cache serves KV caches (keys and "
                f"values)")
    return None


def held_bytes(cache) -> int:
    """The bytes of every tensor a cache holds (a zoo list of LowRankKVCache, or a Hugging
    Face Cache's layers' keys and values, and a hybrid's conv and recurrent states): what
    it really occupies, at the dtype it holds each at, bases not included."""
    if isinstance(cache, list):
        return sum(c.nbytes for c in cache)
    return sum(t.nbytes for layer in cache.layers for t in _held(layer)
               if isinstance(t, torch.Tensor))


def _held(layer) -> list:
    """A transformers cache layer's tensors: keys, values, and states where it has any."""
    return [getattr(layer, "keys", None), getattr(layer, "values", None),
            *(getattr(layer, "conv_states", None) or {}).values(),
            *(getattr(layer, "recurrent_states", None) or {}).values()]
