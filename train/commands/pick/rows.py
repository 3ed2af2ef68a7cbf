"""The rows of pick's document: a candidate (one shape, or a hybrid) with its knob, caps,
reach, cache, parameters and FLOPs; a shape or a kind of hybrid that does not fit, and why.

    row = candidate_row(sized, c, ref_layer)      # evidence and the front come later
    row = hybrid_row(hybrid, c, ref_layer)        # the same keys, and the pattern's
    rows = hybrid_infeasible_rows(hybrids, c)     # one per global kind that fits nowhere

A hybrid's row has every key a uniform one has, so that the front, the table and --emit
read both alike: its caps are the largest over its layers (the global layers' p->f), its
cache, parameters and FLOPs the sums over them. Its own keys say what it is: `pattern`
(`sliding_window W=512, G=1 x5 + softmax G=4`), `unit` and `layers` (each layer kind with
its count, caps and costs).
"""

from __future__ import annotations

from typing import Any

from ...config.layers import HYBRID
from ...sizing.costs import MLP_RATIO, Cost, matched_base_width, matched_width
from ...sizing.families import describe
from ...sizing.match import default_d_mlp
from ...sizing.units import format_bytes, format_count
from .constraints import Constraints, Sized, reach
from .hybrids import Hybrid

CAP_AXES = ("mixing", "logits", "value_path", "inference")


def candidate_row(s: Sized, c: Constraints, ref_layer: int | None) -> dict[str, Any]:
    """A fitting shape's row: its knob, caps, reach, cache, parameters (raw and matched to
    the reference layer), FLOPs; evidence and the front are filled in later."""
    cost, b, L = s.cost, s.cost.budget, c.n_layers
    width, why = matched_width(cost, c.d_model, L, ref_layer, s.label)
    return {
        "family": s.shape.block, "block": s.shape.block, "label": s.label,
        "kwargs": dict(s.kwargs), "seq_len": c.seq_len, "knob": knob_cell(s),
        "limited_by": list(s.limited_by),
        "caps": {axis: getattr(b, axis) for axis in CAP_AXES},
        "carried": b.mixing,  # per head: the past->future rank a layer can carry across
        "reach_tokens": reach(cost.config, c.seq_len, L),
        "holds_associations": (b.mixing >= c.associations
                               and reach(cost.config, c.seq_len, L) >= c.seq_len - 1),
        "cache_elements": cost.cache_elements, "cache_bytes": cost.cache_bytes,
        "params": params_cell(c, L * cost.layer_base, cost.block_params, width, why),
        "flops": {"prefill_per_token": cost.prefill_flops, "decode_step": cost.decode_flops},
        "evidence": [], "front": False,
    }


def knob_cell(s: Sized) -> dict[str, Any]:
    return {"name": s.shape.knob, "symbol": s.shape.sizing.symbol, "value": s.value,
            "max": s.top, "shown": describe(s.shape.block, s.cost.config)}


def params_cell(c: Constraints, base: int, blocks: int, width: int | None,
                why: str | None) -> dict[str, Any]:
    """The blocks' parameters; the layers' with a 4 x d_model MLP, and with the MLP width
    that matches them to the reference (None, and why, when none does)."""
    L, D = c.n_layers, c.d_model
    raw_width = default_d_mlp(D, MLP_RATIO, None)
    return {"blocks": blocks, "layers": base + L * 2 * D * raw_width,
            "d_mlp": raw_width, "d_mlp_matched": width,
            "layers_matched": None if width is None else base + L * 2 * D * width,
            **({"unmatched": why} if why else {})}


def hybrid_row(h: Hybrid, c: Constraints, ref_layer: int | None) -> dict[str, Any]:
    """A fitting hybrid's row: the keys of candidate_row (its knob the cheap layers', its
    caps the largest over its layers, its figures their sums), and its pattern."""
    t, T = h.totals, c.seq_len
    kinds = [layer_kind("cheap", h.cheap.label, h.cheap.shape.block, h.cheap.kwargs,
                        h.n_cheap, h.cheap.cost),
             layer_kind("global", h.global_label, h.glob.block, h.glob.kwargs, h.n_global,
                        h.glob_cost)]
    caps = {axis: max(k["caps"][axis] for k in kinds) for axis in CAP_AXES}
    width, why = matched_base_width(t.base, c.d_model, c.n_layers, ref_layer, h.label)
    reach_tokens = max(reach(cost.config, T, n) for cost, n in
                       ((h.cheap.cost, h.n_cheap), (h.glob_cost, h.n_global)))
    return {
        "family": HYBRID, "block": HYBRID, "label": h.label, "pattern": h.pattern,
        "unit": {"every": h.every, "ratio": f"{h.every - 1}:1", "cheap_layers": h.n_cheap,
                 "global_layers": h.n_global},
        "layers": kinds, "kwargs": {}, "seq_len": T, "knob": knob_cell(h.cheap),
        "limited_by": list(h.cheap.limited_by),
        "caps": caps, "carried": caps["mixing"],  # the largest over the layers
        "reach_tokens": reach_tokens,
        "holds_associations": caps["mixing"] >= c.associations and reach_tokens >= T - 1,
        "cache_elements": t.cache_elements, "cache_bytes": t.cache_bytes,
        "params": params_cell(c, t.base, t.block_params, width, why),
        "flops": {"prefill_per_token": t.prefill_flops, "decode_step": t.decode_flops},
        "evidence": [], "front": False,
    }


def layer_kind(role: str, label: str, block: str, kwargs: dict[str, Any], count: int,
               cost: Cost) -> dict[str, Any]:
    """One kind of layer in a hybrid: what it is, how many, its caps and its figures over
    its `count` layers."""
    b = cost.budget
    return {"role": role, "label": label, "block": block, "kwargs": dict(kwargs),
            "count": count, "shown": describe(block, cost.config),
            "caps": {axis: getattr(b, axis) for axis in CAP_AXES},
            "cache_elements": cost.cache_elements, "cache_bytes": cost.cache_bytes,
            "block_params": cost.block_params,
            "flops": {"prefill_per_token": cost.prefill_flops,
                      "decode_step": cost.decode_flops}}


def over_text(c: Constraints, over: list[str] | tuple[str, ...], cache: int, params: int,
              flops: int) -> str:
    """`9 KiB of cache > 8 KiB, ...`: each budget exceeded, the figure against its limit."""
    figures = {"cache": f"{format_bytes(cache)} of cache",
               "params": f"{format_count(params)} block parameters",
               "FLOPs": f"{format_count(flops)} FLOPs/token"}
    limits = {"cache": format_bytes(c.cache_budget),
              "params": format_count(c.params_budget), "FLOPs": format_count(c.flops_budget)}
    return ", ".join(f"{figures[k]} > {limits[k]}" for k in over)


def infeasible_row(s: Sized, c: Constraints) -> dict[str, Any]:
    """A shape that does not fit: its smallest useful value and the budgets it exceeds."""
    cost = s.cost
    over = over_text(c, s.limited_by, cost.cache_bytes, cost.block_params, cost.prefill_flops)
    return {"family": s.shape.block, "block": s.shape.block, "label": s.label,
            "kwargs": dict(s.kwargs),
            "smallest": {"knob": s.shape.knob, "value": s.value,
                         "shown": describe(s.shape.block, cost.config),
                         "cache_bytes": cost.cache_bytes, "block_params": cost.block_params,
                         "prefill_flops": cost.prefill_flops},
            "over": list(s.limited_by),
            "reason": f"{s.label} at its smallest, "
                      f"{describe(s.shape.block, cost.config)}: {over}"}


def hybrid_infeasible_rows(hybrids: list[Hybrid], c: Constraints) -> list[dict[str, Any]]:
    """Per global kind, the unit lengths none of whose hybrids fits, in one row: the
    smallest of them (by cache), the budgets it exceeds, and what its global layers alone
    hold (usually the reason)."""
    rows = []
    for label in dict.fromkeys(h.global_label for h in hybrids):
        mine = [h for h in hybrids if h.global_label == label]
        units = [n for n in dict.fromkeys(h.every for h in mine)
                 if not any(h.fits for h in mine if h.every == n)]
        if units:
            worst = [h for h in mine if h.every in units]
            rows.append(hybrid_infeasible_row(
                min(worst, key=lambda h: (h.totals.cache_bytes, h.label)), units, c))
    return rows


def hybrid_infeasible_row(h: Hybrid, units: list[int], c: Constraints) -> dict[str, Any]:
    """The row of the hybrids with one global kind that fit at none of `units`."""
    t, g = h.totals, h.glob_cost
    ratios = ", ".join(f"{n - 1}:1" for n in sorted(units, reverse=True))
    label = f"hybrid {ratios} with {h.global_label}"
    alone = (f"its {h.n_global} global layer{'s' if h.n_global > 1 else ''} alone: "
             f"{format_bytes(g.cache_bytes)} of cache")
    over = over_text(c, h.over, t.cache_bytes, t.block_params, t.prefill_flops)
    return {"family": HYBRID, "block": HYBRID, "label": label,
            "kwargs": dict(h.glob.kwargs), "every": sorted(units),
            "smallest": {"knob": h.cheap.shape.knob, "value": h.cheap.value,
                         "shown": h.pattern, "cache_bytes": t.cache_bytes,
                         "block_params": t.block_params, "prefill_flops": t.prefill_flops},
            "over": list(h.over),
            "reason": f"{label} at its smallest, {h.pattern}: {over} ({alone})"}
