"""The candidates' order and their Pareto front, and the one line that says why nothing
fits.

    mark_front(rows)          # row["front"]: no other row has less cache and more p->f
    undominated(hybrid_rows, hybrid_rows)   # those no other hybrid outdoes
    order = family_order([(row["family"], row["cache_bytes"]) for row in rows])

A candidate is on the front when no other one dominates it: no more cache, no less
past->future rank carried (layer by layer, so that a hybrid's global layers do not stand
for its cheap ones), and, where runs measured both, no less accuracy (a guess never
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


def carried_by_layer(row: dict[str, Any], n: int) -> list[int]:
    """The past->future rank each of n layers carries, ascending: a hybrid's from its layer
    kinds (`layers`, each with its count), a uniform candidate's `carried` in every layer."""
    if "layers" not in row:
        return [row["carried"]] * n
    return sorted(k["caps"]["mixing"] for k in row["layers"] for _ in range(k["count"]))


def layer_count(row: dict[str, Any]) -> int | None:
    return sum(k["count"] for k in row["layers"]) if "layers" in row else None


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a is at least as good as b everywhere and better somewhere: no more cache, no less
    carried rank, and, where both were measured, no less accuracy. A candidate without a
    measurement never dominates one with: what was measured is not outdone by a guess.

    The carried rank is compared layer by layer, each stack's layers ranked from the one
    that carries least: a hybrid's global layers carry T/2 whatever its cheap layers do, so
    its largest p->f alone would let the hybrid with the least cache outdo every other one,
    whatever their ratios. Between uniform candidates this is their `carried`."""
    acc_a, acc_b = measured_accuracy(a), measured_accuracy(b)
    if acc_b is not None and acc_a is None:
        return False
    both = acc_a is not None and acc_b is not None
    n = layer_count(a) or layer_count(b) or 1
    pairs = list(zip(carried_by_layer(a, n), carried_by_layer(b, n), strict=True))
    no_worse = (a["cache_bytes"] <= b["cache_bytes"] and all(x >= y for x, y in pairs)
                and (not both or acc_a >= acc_b))
    better = (a["cache_bytes"] < b["cache_bytes"] or any(x > y for x, y in pairs)
              or (both and acc_a > acc_b))
    return no_worse and better


def undominated(rows: list[dict[str, Any]], among: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that no row of `among` dominates."""
    return [row for row in rows
            if not any(dominates(other, row) for other in among if other is not row)]


def mark_front(rows: list[dict[str, Any]]) -> None:
    """Set each row's "front": whether no other row dominates it."""
    front = {id(row) for row in undominated(rows, rows)}
    for row in rows:
        row["front"] = id(row) in front
