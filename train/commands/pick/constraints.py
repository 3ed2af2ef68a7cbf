"""What the model must meet (Constraints), and each shape's knob sized to it (size).

    c = Constraints(d_model=1024, n_heads=16, n_layers=24, seq_len=8192,
                    cache_budget=256 * 1024, cache_dtype="bf16")
    s = size(Shape("sliding_window", (("n_kv_heads", 1),), "MQA"), c)
    s.value, s.cost.cache_bytes, s.limited_by    # 42, 258048, ("cache",)

The knob's values come from the family's declared sizing (zoo/facts.py), ascending, and
the costs never shrink along them: the smallest useful value (one whose layer carries
something across the sequence) is checked against the budgets, then a bisection finds the
largest value that meets them all. Values a block's config rejects are stepped over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...sizing.costs import Cost, block_cost
from ...sizing.families import Shape, knob_values
from ...sizing.match import accepted
from ...sizing.units import DTYPE_BYTES, dtype_name


@dataclass(frozen=True)
class Constraints:
    """What the model must meet. cache_budget: bytes per sequence at seq_len, all layers,
    at cache_dtype; params_budget: the blocks' parameters, all layers (the MLPs, which
    matching sizes, are left out); flops_budget: the blocks' FLOPs per token at seq_len,
    averaged over the sequence (prefill), all layers; associations: the key-value pairs the
    model must recall (MQAR's num_kv_pairs in --emit)."""

    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    cache_budget: int
    cache_dtype: str = "bf16"
    params_budget: int | None = None
    flops_budget: int | None = None
    associations: int = 16

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "seq_len", "cache_budget",
                     "params_budget", "flops_budget", "associations"):
            value = getattr(self, name)
            if value is None and name in ("params_budget", "flops_budget"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive int, "
                                 f"got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"--n-heads {self.n_heads} must divide --d-model {self.d_model}: "
                             "the blocks split d_model into heads")
        object.__setattr__(self, "cache_dtype", dtype_name(self.cache_dtype))

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.cache_dtype]

    def cost(self, block: str, kwargs: dict[str, Any]) -> Cost:
        return block_cost(block, kwargs, self.d_model, self.seq_len, self.n_layers,
                          self.dtype_bytes)

    def over(self, cost: Cost) -> list[str]:
        """The budgets this cost exceeds: "cache", "params", "FLOPs"."""
        out = []
        if cost.cache_bytes > self.cache_budget:
            out.append("cache")
        if self.params_budget is not None and cost.block_params > self.params_budget:
            out.append("params")
        if self.flops_budget is not None and cost.prefill_flops > self.flops_budget:
            out.append("FLOPs")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"d_model": self.d_model, "n_heads": self.n_heads, "n_layers": self.n_layers,
                "seq_len": self.seq_len, "cache_budget_bytes": self.cache_budget,
                "cache_dtype": self.cache_dtype, "dtype_bytes": self.dtype_bytes,
                "params_budget": self.params_budget, "flops_budget": self.flops_budget,
                "associations": self.associations}


@dataclass(frozen=True)
class Sized:
    """A shape with its knob sized: the value, its cost, and what stops a larger value
    (budgets it would exceed, or "range": the largest value there is). When `fits` is
    False, `value` is the smallest useful one and `limited_by` the budgets it exceeds."""

    shape: Shape
    kwargs: dict[str, Any]
    value: int
    cost: Cost
    limited_by: tuple[str, ...]
    fits: bool
    top: int  # the knob's largest value

    @property
    def label(self) -> str:
        return self.shape.label(self.cost.config)



class KnobCosts:
    """A shape's knob values at the constraints, each value's cost built once when first
    asked for (a ValueError for a value the block's config rejects)."""

    def __init__(self, shape: Shape, c: Constraints):
        self.shape, self.c = shape, c
        self.base = shape.base_kwargs(c.n_heads)
        self.values = knob_values(shape, self.base, c.d_model, c.seq_len)
        self.costs: dict[int, Cost] = {}

    def __len__(self) -> int:
        return len(self.values)

    def kwargs(self, i: int) -> dict[str, Any]:
        return {**self.base, self.shape.knob: self.values[i]}

    def cost(self, i: int) -> Cost:
        if i not in self.costs:
            self.costs[i] = self.c.cost(self.shape.block, self.kwargs(i))
        return self.costs[i]

    def sized(self, i: int, limited_by: list[str], fits: bool) -> Sized:
        return Sized(self.shape, self.kwargs(i), self.values[i], self.cost(i),
                     tuple(limited_by), fits, self.values[len(self.values) - 1])


def size(shape: Shape, c: Constraints) -> Sized:
    """The largest knob value of `shape` that meets every budget: the smallest useful value
    (the first whose layer carries a past->future rank >= 1) is checked, then a bisection
    over the values finds the largest that fits (costs never shrink along them)."""
    knob = KnobCosts(shape, c)
    lo, low_cost = smallest_useful(knob)
    if c.over(low_cost):
        return knob.sized(lo, c.over(low_cost), False)
    best, _ = largest_fitting(knob, lo)
    above = accepted(knob.cost, range(best + 1, len(knob)))
    return knob.sized(best, ["range"] if above is None else c.over(above[1]), True)


def smallest_useful(knob: KnobCosts) -> tuple[int, Cost]:
    """(index, cost) of the first accepted value whose layer carries a past->future rank
    >= 1; a ValueError saying why there is none (the block's own reason when no value
    builds, from its first value)."""
    start = 0
    while True:
        found = accepted(knob.cost, range(start, len(knob)))
        if found is None:
            try:
                knob.cost(0)
            except ValueError as e:
                raise ValueError(f"no {knob.shape.knob} builds at d_model={knob.c.d_model}, "
                                 f"n_heads={knob.c.n_heads} ({e})") from None
            raise ValueError(f"no {knob.shape.knob} carries anything across the sequence")
        if found[1].budget.mixing >= 1:
            return found
        start = found[0] + 1


def largest_fitting(knob: KnobCosts, first: int) -> tuple[int, Cost]:
    """(index, cost) of the largest accepted value that meets every budget, given that the
    value at `first` does: a bisection over the indices, each read as the nearest accepted
    value at or below it."""
    def at_or_below(i: int) -> tuple[int, Cost]:
        found = accepted(knob.cost, range(i, first - 1, -1))
        assert found is not None  # the value at `first` is accepted
        return found

    lo, hi = first, len(knob) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if knob.c.over(at_or_below(mid)[1]):
            hi = mid - 1
        else:
            lo = mid
    return at_or_below(lo)


def reach(config: Any, seq_len: int, n_layers: int) -> int:
    """How many tokens back the stack of layers can bring anything from: a sliding window
    W - 1 per layer, added up over the layers; every other block sees the whole past."""
    window = getattr(config, "window", None)
    return seq_len - 1 if window is None else min(seq_len - 1, n_layers * (window - 1))

