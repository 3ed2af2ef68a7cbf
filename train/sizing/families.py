"""The block families: one row each, read by pick, blocks and match.state (and through it
the dry-run plan); CACHE_KINDS names the cache each keeps, as compress projects it.

    FAMILIES["sliding_window"].knob -> "window";  describe("linear", config) -> "K=16, F=153"
    shapes(1024, 16) -> [Shape("softmax"), Shape("sliding_window", (("n_kv_heads", 16),),
                          "MHA"), ...]

A row says which knob sizes what the family caches, the values that knob takes (ascending;
its costs never shrink along them), its symbol and what the symbols mean, the resolved
knobs of a built block's config as a table cell, and what kind of cache it keeps. A new
block family is one row of FAMILIES.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import zoo

# a knob's values, ascending, from (block kwargs, d_model, seq_len); values the block's
# config rejects (an odd MoE head_dim under RoPE, kv_lora_rank > d_model) are skipped
# where they are tried
Values = Callable[[dict, int, int], Iterable[int]]


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt n): n_heads may be as large as d_model."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Family:
    """One block family: the knob pick sizes and its values, its symbol, what the symbols
    mean, the resolved knobs of a built block's config as a table cell, the kind of cache
    it keeps (what compress projects: kv, mla, linear, ssm), and, where it is another
    knob, the one match.state sizes to equal cache (MoE: k sets FLOPs, head_dim the cache)."""

    block: str
    knob: str
    values: Values
    symbol: str
    legend: str
    describe: Callable[[Any], str]
    cache: str
    state: tuple[str, Values] | None = None

    @property
    def state_knob(self) -> tuple[str, Values]:
        """(knob, values) that size the cache: match.state's STATE_KNOBS entry."""
        return self.state if self.state is not None else (self.knob, self.values)


def group_tag(kv_heads: int, n_heads: int) -> str:
    """MHA, MQA or `GQA G=4` for G key/value heads among H query heads."""
    if kv_heads == n_heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else f"GQA G={kv_heads}"


# in the order they are listed when caches tie
FAMILIES = {f.block: f for f in (
    Family("softmax", "n_kv_heads", lambda kw, D, T: divisors(kw["n_heads"]),  # whole groups
           "G",
           "G = n_kv_heads: key/value heads shared by the H query heads (MHA: G = H; GQA: "
           "1 < G < H; MQA: G = 1); caches keys and values of every token",
           lambda c: f"G={c.kv_heads}", "kv"),
    Family("sliding_window", "window", lambda kw, D, T: range(1, T + 1),  # W > T: no more
           "W",
           "W = window: keys each query sees, itself included; caches the last W tokens' keys "
           "and values; G as for softmax",
           lambda c: f"W={c.window}, G={c.kv_heads}", "kv"),
    Family("mla", "kv_lora_rank", lambda kw, D, T: range(1, D + 1),  # R <= d_model
           "R",
           "R = kv_lora_rank: the latent cached per token (DeepSeek-V2), beside one shared "
           "RoPE key of width dr",
           lambda c: f"R={c.latent}, dr={c.rope_dim}", "mla"),
    Family("moe", "top_k", lambda kw, D, T: range(1, kw["n_heads"] + 1),  # k of E heads
           "k",
           "k = top_k: expert heads each token uses, of E = n_heads; one key/value head is "
           "shared by all (it caches like MQA), so k sets the FLOPs, not the cache",
           lambda c: f"k={c.top_k} of E={c.n_heads}", "kv",
           state=("head_dim", lambda kw, D, T: range(1, 4 * D + 1))),  # K = V of every head
    Family("linear", "feature_dim", lambda kw, D, T: range(1, 4 * D + 1),
           "K",
           "K = feature_dim: per-head query/key width before the feature map; F = features "
           "after it (elu+1: F = K; Taylor, Based's 2nd-order map: F = 1 + K + K(K+1)/2, so "
           "K=16 gives F=153); a state of F x V per head at any length",
           lambda c: f"K={c.k_dim}, F={c.f_dim}", "linear"),
    Family("ssm", "d_state", lambda kw, D, T: range(1, 4 * D + 1),
           "N",
           "N = d_state: the Mamba-2 state per head, P x N with P = expand x D / H, plus the "
           "short convolution's last d_conv - 1 inputs, at any length",
           lambda c: f"N={c.d_state}, P={c.head_dim}", "ssm"),
)}
# block -> the kind of cache it keeps, as compress projects it
CACHE_KINDS = {f.block: f.cache for f in FAMILIES.values()}
FEATURE_MAP_TAGS = {"taylor": "Taylor"}
# config keys whose resolved value is a property of the config (None: the default)
RESOLVED = {"n_kv_heads": "kv_heads", "feature_dim": "k_dim", "kv_lora_rank": "latent"}


def resolved(config: Any, key: str) -> Any:
    """A config's value of `key` with its default applied (n_kv_heads None -> H)."""
    return getattr(config, RESOLVED.get(key, key))


def describe(block: str, config: Any) -> str:
    """The resolved knobs of a block's config: `W=42, G=1`, `K=16, F=153`."""
    family = FAMILIES.get(block)
    return family.describe(config) if family is not None else ""


@dataclass(frozen=True)
class Shape:
    """One setting of a family whose knob pick sizes: the block, the settings kept fixed,
    and a tag telling the shapes of one family apart (MQA, Taylor)."""

    block: str
    fixed: tuple[tuple[str, Any], ...] = ()
    tag: str = ""

    @property
    def family(self) -> Family:
        return FAMILIES[self.block]

    @property
    def knob(self) -> str:
        return self.family.knob

    def base_kwargs(self, n_heads: int) -> dict[str, Any]:
        return {"n_heads": n_heads, **dict(self.fixed)}

    def label(self, config: Any = None) -> str:
        """`sliding_window (MQA)`; softmax is named by the G it was sized to."""
        tag = self.tag
        if self.block == "softmax" and config is not None:
            tag = group_tag(config.kv_heads, config.n_heads)
        return f"{self.block} ({tag})" if tag else self.block


def shapes(d_model: int, n_heads: int) -> list[Shape]:
    """Every shape pick sizes at these widths: softmax (G sized), sliding windows at the
    softmax presets' G (MHA, GQA, MQA), MLA, MoE, linear attention with each preset's
    feature map, Mamba-2."""
    out = [Shape("softmax")]
    for _, kwargs in zoo.block_class("softmax").variants(d_model, n_heads):
        groups = kwargs.get("n_kv_heads", n_heads)
        out.append(Shape("sliding_window", (("n_kv_heads", groups),),
                         group_tag(groups, n_heads)))
    out += [Shape("mla"), Shape("moe", tag=f"E={n_heads}")]
    for _, kwargs in zoo.block_class("linear").variants(d_model, n_heads):
        fmap = kwargs["feature_map"]
        out.append(Shape("linear", (("feature_map", fmap),), FEATURE_MAP_TAGS.get(fmap, fmap)))
    out.append(Shape("ssm", tag="Mamba-2"))
    return out


def knob_values(shape: Shape, kwargs: dict[str, Any], d_model: int,
                seq_len: int) -> Sequence[int]:
    """The values pick tries for the shape's knob, ascending; the cache (or, for MoE's k,
    the FLOPs) never shrinks along them."""
    return shape.family.values(kwargs, d_model, seq_len)
