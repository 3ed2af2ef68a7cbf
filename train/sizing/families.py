"""How pick sizes each block family, read from the family's own declaration (its
`facts.sizing`, zoo/facts.py), and the shapes pick sizes: read by pick, blocks and
match.state (and through it the dry-run plan).

    sizing_table()["sliding_window"].knob -> "window";  describe("linear", config) -> "K=16, F=153"
    shapes(1024, 16) -> [Shape("softmax"), Shape("sliding_window", (("n_kv_heads", 16),),
                          "MHA"), ...]

A family's sizing says which knob sizes what it caches, the values that knob takes
(ascending; its costs never shrink along them), its symbol and what the symbols mean, and
the resolved knobs of a built block's config as a table cell. Every registered block
declares one, so a new block family is one module and one registry row (zoo/__init__.py);
the table is read afresh from the registry each time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zoo
from zoo.facts import Sizing

FEATURE_MAP_TAGS = {"taylor": "Taylor"}
# config keys whose resolved value is a property of the config (None: the default)
RESOLVED = {"n_kv_heads": "kv_heads", "feature_dim": "k_dim", "kv_lora_rank": "latent",
            "key_dim": "k_dim"}


def sizing_table() -> dict[str, Sizing]:
    """Block -> how pick sizes it, every registered family in listing order (the order
    families are listed in when their costs tie)."""
    return {name: zoo.facts_of(name).sizing for name in zoo.families()}


def group_tag(kv_heads: int, n_heads: int) -> str:
    """MHA, MQA or `GQA G=4` for G key/value heads among H query heads."""
    if kv_heads == n_heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else f"GQA G={kv_heads}"


def resolved(config: Any, key: str) -> Any:
    """A config's value of `key` with its default applied (n_kv_heads None -> H)."""
    return getattr(config, RESOLVED.get(key, key))


def describe(block: str, config: Any) -> str:
    """The resolved knobs of a block's config: `W=42, G=1`, `K=16, F=153`."""
    return zoo.facts_of(block).sizing.describe(config)


@dataclass(frozen=True)
class Shape:
    """One setting of a family whose knob pick sizes: the block, the settings kept fixed,
    and a tag telling the shapes of one family apart (MQA, Taylor)."""

    block: str
    fixed: tuple[tuple[str, Any], ...] = ()
    tag: str = ""
    own: Sizing | None = None  # a sizing of its own (a compressed sparse shape's rate)

    @property
    def sizing(self) -> Sizing:
        return self.own or zoo.facts_of(self.block).sizing

    @property
    def knob(self) -> str:
        return self.sizing.knob

    def base_kwargs(self, n_heads: int) -> dict[str, Any]:
        return {"n_heads": n_heads, **dict(self.fixed)}

    def label(self, config: Any = None) -> str:
        """`sliding_window (MQA)`; softmax is named by the G it was sized to."""
        tag = self.tag
        if self.block == "softmax" and config is not None:
            tag = group_tag(config.kv_heads, config.n_heads)
        return f"{self.block} ({tag})" if tag else self.block


def _windows(d_model: int, n_heads: int) -> list[Shape]:
    """A sliding window at each softmax preset's G (MHA, GQA, MQA)."""
    out = []
    for _, kwargs in zoo.block_class("softmax").variants(d_model, n_heads):
        groups = kwargs.get("n_kv_heads", n_heads)
        out.append(Shape("sliding_window", (("n_kv_heads", groups),),
                         group_tag(groups, n_heads)))
    return out


def _feature_maps(d_model: int, n_heads: int) -> list[Shape]:
    """Linear attention with each preset's feature map."""
    out = []
    for _, kwargs in zoo.block_class("linear").variants(d_model, n_heads):
        fmap = kwargs["feature_map"]
        out.append(Shape("linear", (("feature_map", fmap),), FEATURE_MAP_TAGS.get(fmap, fmap)))
    return out


def _delta_rules(d_model: int, n_heads: int) -> list[Shape]:
    """The delta rule with a gate: Gated DeltaNet (one decay per head, as Qwen3-Next's
    linear layers) and KDA (one per key channel, as Kimi Linear's). Plain DeltaNet is left
    out: it caches what GDN does and forgets nothing, so pick has nothing to weigh it by."""
    out = []
    for name, kwargs in zoo.block_class("delta").variants(d_model, n_heads):
        if kwargs.get("gate", "none") != "none":
            out.append(Shape("delta", tuple(sorted(kwargs.items())),
                             name.split("(")[-1].rstrip(")")))
    return out


def _sparse(d_model: int, n_heads: int) -> list[Shape]:
    """Sparse attention as itself (top_k sized: it caches every token's keys), and each
    compressed-only preset (DeepSeek V4's HCA and CSA) with its rate sized: its slots are
    all it caches that grows as T."""
    cls = zoo.block_class("sparse")
    out = [Shape("sparse")]
    for name, kwargs in cls.variants(d_model, n_heads):
        if kwargs.get("selection") in ("none", "slots"):
            fixed = tuple(sorted((k, v) for k, v in kwargs.items() if k != "rate"))
            out.append(Shape("sparse", fixed, name.split("(")[-1].rstrip(")"),
                             cls.compressed_sizing))
    return out


# the families pick sizes in more than one shape, or tags; any other is one untagged shape
SHAPES: dict[str, Callable[[int, int], list[Shape]]] = {
    "sliding_window": _windows,
    "moe": lambda d_model, n_heads: [Shape("moe", tag=f"E={n_heads}")],
    "linear": _feature_maps,
    "ssm": lambda d_model, n_heads: [Shape("ssm", tag="Mamba-2")],
    "delta": lambda d_model, n_heads: _delta_rules(d_model, n_heads),
    "sparse": _sparse,
}


def shapes(d_model: int, n_heads: int) -> list[Shape]:
    """Every shape pick sizes at these widths, the registered families in listing order:
    softmax (G sized), sliding windows at the softmax presets' G, MLA, MoE, linear
    attention with each preset's feature map, Mamba-2, Gated DeltaNet and KDA, and a new block as
    itself."""
    out = []
    for name in zoo.families():
        make = SHAPES.get(name)
        out += make(d_model, n_heads) if make is not None else [Shape(name)]
    return out


def knob_values(shape: Shape, kwargs: dict[str, Any], d_model: int,
                seq_len: int) -> Sequence[int]:
    """The values pick tries for the shape's knob, ascending; the cache (or, for MoE's k,
    the FLOPs) never shrinks along them."""
    return shape.sizing.values(kwargs, d_model, seq_len)
