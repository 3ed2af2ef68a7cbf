"""The hybrids `rankzoo pick` proposes: a few global layers among cheaper ones, the cheap
layers' knob sized to what the global layers leave of each budget.

    h = Hybrids()                      # units of 2, 4, 6 and 8 layers, where they divide L;
                                       # keep="best": those no other hybrid outdoes
    for hyb in size_hybrids(c, h):
        hyb.fits, hyb.pattern          # True, 'sliding_window W=512, G=1 x5 + softmax G=4'

A unit of N layers is N - 1 cheap layers (a shape pick sizes alone whose cache does not
grow with the sequence, or grows only to a window: sliding windows, linear attention, the
SSM) and then one global layer (full softmax attention at the global G, or MLA at its
default latent), last in its unit as Gemma 3 places it; the unit repeats to fill
n_layers. N = 2, 4, 6, 8 give the ratios real models use: gpt-oss 1:1, Qwen3-Next 3:1
(linear:full), Gemma 3 5:1, Jamba and Nemotron-H about 7:1.

The L / N global layers are costed first (their knob is fixed: they are there to see the
whole past). The cheap layers' knob is then sized as a uniform shape's is
(constraints.size), over the other L - L / N layers and against what the global layers
left of every budget. Every figure is the blocks' own `budget(seq_len)`, per layer kind
(a window caches min(W, T) tokens), added up over the layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import zoo

from ...sizing.costs import Cost
from ...sizing.families import Shape, describe, group_tag, shapes
from .constraints import Constraints, Sized, size

# layers per unit, the last one global: 1:1 (gpt-oss), 3:1 (Qwen3-Next), 5:1 (Gemma 3),
# 7:1 (Jamba, Nemotron-H)
UNITS = (2, 4, 6, 8)
# which hybrids the document keeps: those no other hybrid outdoes (on the hybrids' own
# front, which keeps the best of each ratio in view; the front of all candidates may hold
# none), every one that fits, none
KEEP = ("best", "all", "none")


@dataclass(frozen=True)
class Hybrids:
    """Which hybrids pick proposes: units of `every` layers (None: those of UNITS that
    divide n_layers), global softmax layers at `global_kv_heads` key/value heads (None:
    the GQA preset's G), and which the document keeps (`keep`, one of KEEP)."""

    every: tuple[int, ...] | None = None
    global_kv_heads: int | None = None
    keep: str = "best"

    def check(self, c: Constraints) -> None:
        """Errors that name the flag and its value."""
        if self.keep not in KEEP:
            raise ValueError(f"--hybrids {self.keep}: expected one of {list(KEEP)}")
        for n in self.every or ():
            if n < 2:
                raise ValueError(f"--global-every {n}: a unit needs a cheap layer before its "
                                 "global one, so at least 2")
            if c.n_layers % n:
                raise ValueError(f"--global-every {n} does not divide --n-layers "
                                 f"{c.n_layers}: the unit repeats to fill the model")
        G = self.global_kv_heads
        if G is not None and (G < 1 or c.n_heads % G):
            raise ValueError(f"--global-kv-heads {G} must divide --n-heads {c.n_heads}")

    def units(self, n_layers: int) -> tuple[int, ...]:
        """The unit lengths tried, shortest first."""
        if self.every is not None:
            return tuple(sorted(set(self.every)))
        return tuple(n for n in UNITS if n_layers % n == 0)

    def to_dict(self, c: Constraints) -> dict[str, Any]:
        """What is proposed, resolved, and what was asked for (None: the default)."""
        return {"every": list(self.units(c.n_layers)), "keep": self.keep,
                "global_kv_heads": global_kv_heads(c, self),
                "asked": {"every": None if self.every is None else list(self.every),
                          "global_kv_heads": self.global_kv_heads}}


@dataclass(frozen=True)
class Global:
    """The global layers' block: fixed settings, n_heads included."""

    block: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Totals:
    """A hybrid's figures over all its layers."""

    cache_elements: int
    cache_bytes: int
    block_params: int
    prefill_flops: int
    decode_flops: int
    base: int  # the layers' parameters without their MLPs (blocks and norms)


@dataclass(frozen=True)
class Hybrid:
    """One hybrid: units of `every` layers, `glob_cost` over its global layers, `cheap`
    sized over the others against what the global layers left. `over`: the budgets the
    whole exceeds (none when it fits)."""

    every: int
    n_layers: int
    glob: Global
    glob_cost: Cost
    cheap: Sized
    over: tuple[str, ...]

    @property
    def n_global(self) -> int:
        return self.n_layers // self.every

    @property
    def n_cheap(self) -> int:
        return self.n_layers - self.n_global

    @property
    def fits(self) -> bool:
        return self.cheap.fits and not self.over

    @property
    def totals(self) -> Totals:
        g, s = self.glob_cost, self.cheap.cost
        return Totals(cache_elements=g.cache_elements + s.cache_elements,
                      cache_bytes=g.cache_bytes + s.cache_bytes,
                      block_params=g.block_params + s.block_params,
                      prefill_flops=g.prefill_flops + s.prefill_flops,
                      decode_flops=g.decode_flops + s.decode_flops,
                      base=self.n_global * g.layer_base + self.n_cheap * s.layer_base)

    @property
    def global_label(self) -> str:
        """`softmax (GQA G=4)`, `mla`: the global layers as pick names a shape."""
        return Shape(self.glob.block).label(self.glob_cost.config)

    @property
    def label(self) -> str:
        """`sliding_window (MQA) x5 + softmax (GQA G=4)`: the unit by its shapes."""
        return f"{self.cheap.label} x{self.every - 1} + {self.global_label}"

    @property
    def pattern(self) -> str:
        """`sliding_window W=512, G=1 x5 + softmax G=4`: the unit with its knobs."""
        cheap = part(self.cheap.shape, self.cheap.cost.config)
        glob = part(Shape(self.glob.block), self.glob_cost.config)
        return f"{cheap} x{self.every - 1} + {glob}"

    def unit(self) -> list[tuple[str, dict[str, Any]]]:
        """The repeating unit, one (block, kwargs) per layer: the cheap ones, then the
        global one."""
        cheap = (self.cheap.shape.block, dict(self.cheap.kwargs))
        return [cheap] * (self.every - 1) + [(self.glob.block, dict(self.glob.kwargs))]


def part(shape: Shape, config: Any) -> str:
    """One layer kind in a pattern: `sliding_window W=512, G=1`, `linear (Taylor) K=1,
    F=3`; a tag that only repeats the G its knobs show is left out."""
    text = describe(shape.block, config)
    tag = shape.tag
    groups = getattr(config, "kv_heads", None)
    if tag and not (groups is not None and tag == group_tag(groups, config.n_heads)):
        return f"{shape.block} ({tag}) {text}"
    return f"{shape.block} {text}"


def is_cheap(block: str) -> bool:
    """Whether a family can be a hybrid's cheap layer: its cache is a state of fixed size,
    or a window's (what the family declares, zoo/facts.py)."""
    facts = zoo.facts_of(block)
    return facts.cache == "state" or "sliding" in facts.mirrors


def global_kv_heads(c: Constraints, h: Hybrids) -> int:
    """The global softmax layers' G: the one asked for, else the GQA preset's (a quarter of
    the heads, the layout of Gemma 3's, gpt-oss's and Jamba's attention layers), else the
    fewest among the presets."""
    if h.global_kv_heads is not None:
        return h.global_kv_heads
    presets = zoo.block_class("softmax").variants(c.d_model, c.n_heads)
    groups = [kw.get("n_kv_heads", c.n_heads) for _, kw in presets]
    gqa = [g for g in groups if 1 < g < c.n_heads]
    return gqa[0] if gqa else min(groups)


def global_kinds(c: Constraints, h: Hybrids) -> list[Global]:
    """Full softmax attention at the global G, and MLA at its default latent."""
    return [Global("softmax", {"n_heads": c.n_heads, "n_kv_heads": global_kv_heads(c, h)}),
            Global("mla", {"n_heads": c.n_heads})]


def size_hybrids(c: Constraints, h: Hybrids) -> list[Hybrid]:
    """Every hybrid of a unit length, a global kind and a cheap shape that builds at these
    widths, sized (fitting or not); none with keep == "none"."""
    if h.keep == "none":
        return []
    h.check(c)
    cheap = [s for s in shapes(c.d_model, c.n_heads) if is_cheap(s.block)]
    out = []
    for every in h.units(c.n_layers):
        for glob in global_kinds(c, h):
            try:
                glob_cost = layers_of(c, c.n_layers // every).cost(glob.block, glob.kwargs)
            except ValueError:  # not buildable here; its uniform row says why
                continue
            for shape in cheap:
                try:
                    out.append(size_hybrid(c, every, glob, glob_cost, shape))
                except ValueError:  # no knob value builds; its uniform row says why
                    continue
    return out


def size_hybrid(c: Constraints, every: int, glob: Global, glob_cost: Cost,
                shape: Shape) -> Hybrid:
    """The cheap layers' knob sized to what the global layers leave of every budget."""
    n_cheap = c.n_layers - c.n_layers // every
    cheap = size(shape, left_over(c, n_cheap, glob_cost))
    hyb = Hybrid(every, c.n_layers, glob, glob_cost, cheap, ())
    return replace(hyb, over=tuple(c.over(hyb.totals)))  # Totals has the figures over() reads


def layers_of(c: Constraints, n_layers: int) -> Constraints:
    return replace(c, n_layers=n_layers)


def left_over(c: Constraints, n_layers: int, used: Cost) -> Constraints:
    """The constraints of the cheap layers: `n_layers` of them, each budget less what the
    global layers use (at least 1, so that a budget the global layers exhaust is one
    nothing meets)."""
    def rest(budget: int | None, spent: int) -> int | None:
        return None if budget is None else max(1, budget - spent)

    return replace(c, n_layers=n_layers,
                   cache_budget=rest(c.cache_budget, used.cache_bytes),
                   params_budget=rest(c.params_budget, used.block_params),
                   flops_budget=rest(c.flops_budget, used.prefill_flops))
