"""The candidates' order and their Pareto front, and the one line that says why nothing
fits.

    mark_front(rows)          # row["front"]: no other row has less cache and more p->f
    order = family_order([(row["family"], row["cache_bytes"]) for row in rows])

A candidate is on the front when no other one dominates it: no more cache, no less
past->future rank carried, and, where runs measured both, no less accuracy (a guess never
outdoes a measurement). Families are listed by their smallest cache, ties in the
registry's order (zoo.families()); `rankzoo blocks` orders its presets the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import zoo

from ...sizing.families import describe
from ...sizing.units import format_bytes, format_count
from .constraints import Constraints, Sized


def family_order(pairs: list[tuple[str, int | None]]) -> dict[str, int]:
    """Family -> its place: by the smallest cache among its rows (None last), then in
    the registry's order."""
    smallest: dict[str, float] = {}
    for family, cache in pairs:
        value = math.inf if cache is None else cache
        smallest[family] = min(smallest.get(family, math.inf), value)
    names = zoo.families()
    ranked = sorted(smallest, key=lambda f: (smallest[f], names.index(f) if f in names
                                             else len(names), f))
    return {f: i for i, f in enumerate(ranked)}


# the budgets besides the cache that a shape can exceed: (constraint, its name in
# Sized.limited_by, the cost, how it is asked for, how the fewest is said, its unit)
LIMITS = (("params_budget", "params", lambda s: s.cost.block_params, "block parameters",
           "the fewest parameters", ""),
          ("flops_budget", "FLOPs", lambda s: s.cost.prefill_flops, "FLOPs/token",
           "the fewest FLOPs", "/token"))


def nothing_fits(c: Constraints, sized: list[Sized]) -> str:
    """'nothing fits 1 KiB per sequence at 8192 tokens: the smallest cache is
    sliding_window (MQA) W=2, G=1 at 12 KiB' (and the fewest parameters or FLOPs when
    those budgets bind)."""
    def smallest(key: Callable[[Sized], int]) -> Sized:
        return min(sized, key=lambda s: (key(s), s.label))

    asked = [f"{format_bytes(c.cache_budget)} of cache per sequence at {c.seq_len} tokens"]
    cache = smallest(lambda s: s.cost.cache_bytes)
    found = [f"the smallest cache is {cache.label} {describe(cache.shape.block, cache.cost.config)}"
             f" at {format_bytes(cache.cost.cache_bytes)}"]
    for field, limit, cost, what, fewest, unit in LIMITS:
        budget = getattr(c, field)
        if budget is None:
            continue
        asked.append(f"{format_count(budget)} {what}")
        few = smallest(cost)
        if cost(few) > budget or limit in cache.limited_by:
            found.append(f"{fewest} {few.label} {describe(few.shape.block, few.cost.config)} "
                         f"with {format_count(cost(few))}{unit}")
    return f"nothing fits {', '.join(asked)}: {'; '.join(found)}"


def measured_accuracy(row: dict[str, Any]) -> float | None:
    """The accuracy a run measured at exactly this candidate's knob (the best of them)."""
    found = [e["accuracy"] for e in row["evidence"]
             if e["exact"] and e.get("accuracy") is not None]
    return max(found) if found else None


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a is at least as good as b everywhere and better somewhere: no more cache, no less
    carried rank, and, where both were measured, no less accuracy. A candidate without a
    measurement never dominates one with: what was measured is not outdone by a guess."""
    acc_a, acc_b = measured_accuracy(a), measured_accuracy(b)
    if acc_b is not None and acc_a is None:
        return False
    both = acc_a is not None and acc_b is not None
    no_worse = (a["cache_bytes"] <= b["cache_bytes"] and a["carried"] >= b["carried"]
                and (not both or acc_a >= acc_b))
    better = (a["cache_bytes"] < b["cache_bytes"] or a["carried"] > b["carried"]
              or (both and acc_a > acc_b))
    return no_worse and better


def mark_front(rows: list[dict[str, Any]]) -> None:
    """Set each row's "front": whether no other row dominates it."""
    for row in rows:
        row["front"] = not any(dominates(other, row) for other in rows if other is not row)
