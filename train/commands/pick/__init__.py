"""`rankzoo pick`: from a model's constraints to the blocks that fit them, each sized.

    c = Constraints(d_model=1024, n_heads=16, n_layers=24, seq_len=8192,
                    cache_budget=256 * 1024, cache_dtype="bf16")
    doc = pick_document(c)                     # candidates, the families that do not fit
    doc = pick_document(c, runs=["runs/pick"])  # ... with what finished runs measured

For every block family pick sizes the knob that sets what the family caches (SHAPES: the
KV heads G of softmax attention, the window W, the feature width K of linear attention, the
SSM state N, the MLA latent R; for MoE the number of active heads k, which sets its FLOPs)
to the largest value whose cache per sequence at the target length, over all layers and at
the cache dtype, fits the budget (and, when given, whose parameters and FLOPs fit theirs).
A value whose layer carries nothing across the sequence (a window of one key) is no
candidate. Each candidate is shown with its declared caps, its costs and, from `--runs`,
what the runs measured for it; the Pareto front of cache bytes against the past->future
rank it can carry (and measured accuracy, where there is one) is marked.

Every figure comes from the blocks themselves: each setting is built on the meta device
(shapes, no weights) and its `budget(seq_len)` gives the caps, the parameters, the cached
elements and the FLOPs per token; pick multiplies by the layers and the dtype's bytes and
nothing else. One decode step is the cost of the seq_len-th token,
T * flops(T) - (T - 1) * flops(T - 1) from the budget's average FLOPs per token (exact up to
the budget's integer rounding, under T FLOPs). Parameters are matched the way
`match: {params: true}` matches them (train/experiment/plan.py): the MLP width that gives a layer the
parameters of a multi-head softmax layer with a 4 x d_model MLP.

`--emit pick.yaml` writes the shortlist (the front, or every candidate) as an experiment
`rankzoo train` runs as is: matched in parameters, on MQAR with the requested associations
at the target length, so that its runs come back to `pick --runs` as evidence.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.table import Table

import zoo
from budgets import RankBudget

from ...config import parse_experiment
from ...experiment.plan import STATE_KNOBS, accepted, default_d_mlp, match_d_mlp, mlp_floor
from ...lm.decoder import Layer
from ...rundir.files import read_yaml
from ...rundir.read import has_results, is_variant_dir, variant_dirs, variant_report
from ...sizing.units import (
    DTYPE_BYTES,
    byte_flag,
    dtype_name,
    format_bytes,
    format_count,
)

# ---------------------------------------------------------------- families and knobs

@dataclass(frozen=True)
class Family:
    """What a family's knobs are: the one pick sizes, its symbol, what the symbols mean, and
    the resolved knobs of a built block's config as a table cell."""

    block: str
    knob: str
    symbol: str
    legend: str
    describe: Callable[[Any], str]


def group_tag(kv_heads: int, n_heads: int) -> str:
    """MHA, MQA or `GQA G=4` for G key/value heads among H query heads."""
    if kv_heads == n_heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else f"GQA G={kv_heads}"


# in the order they are listed when caches tie
FAMILIES = {f.block: f for f in (
    Family("softmax", "n_kv_heads", "G",
           "G = n_kv_heads: key/value heads shared by the H query heads (MHA: G = H; GQA: "
           "1 < G < H; MQA: G = 1); caches keys and values of every token",
           lambda c: f"G={c.kv_heads}"),
    Family("sliding_window", "window", "W",
           "W = window: keys each query sees, itself included; caches the last W tokens' keys "
           "and values; G as for softmax",
           lambda c: f"W={c.window}, G={c.kv_heads}"),
    Family("mla", "kv_lora_rank", "R",
           "R = kv_lora_rank: the latent cached per token (DeepSeek-V2), beside one shared "
           "RoPE key of width dr",
           lambda c: f"R={c.latent}, dr={c.rope_dim}"),
    Family("moe", "top_k", "k",
           "k = top_k: expert heads each token uses, of E = n_heads; one key/value head is "
           "shared by all (it caches like MQA), so k sets the FLOPs, not the cache",
           lambda c: f"k={c.top_k} of E={c.n_heads}"),
    Family("linear", "feature_dim", "K",
           "K = feature_dim: per-head query/key width before the feature map; F = features "
           "after it (elu+1: F = K; Taylor, Based's 2nd-order map: F = 1 + K + K(K+1)/2, so "
           "K=16 gives F=153); a state of F x V per head at any length",
           lambda c: f"K={c.k_dim}, F={c.f_dim}"),
    Family("ssm", "d_state", "N",
           "N = d_state: the Mamba-2 state per head, P x N with P = expand x D / H, plus the "
           "short convolution's last d_conv - 1 inputs, at any length",
           lambda c: f"N={c.d_state}, P={c.head_dim}"),
)}
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
    """The values pick tries, ascending; the cache never shrinks along them. The state
    knobs are match.state's (train/experiment/plan.py STATE_KNOBS); MoE's k runs over its E heads."""
    if shape.knob == "top_k":
        return range(1, kwargs["n_heads"] + 1)
    knob, values = STATE_KNOBS[shape.block]
    if knob != shape.knob:
        raise AssertionError(f"{shape.block}: pick sizes {shape.knob}, match.state {knob}")
    return values(kwargs, d_model, seq_len)


# ---------------------------------------------------------------- costs

MLP_RATIO = 4.0  # the reference layer's MLP: 4 x d_model, as model.mlp_ratio's default
MATCH_TOLERANCE = 0.05
NORM = "rmsnorm"  # model.norm's default


@dataclass(frozen=True)
class Cost:
    """One block setting at the target: its budget per layer, and figures over all layers."""

    budget: RankBudget  # one layer at seq_len
    config: Any  # the block's resolved config
    layer_base: int  # one layer's parameters without its MLP (the block and two norms)
    cache_elements: int  # per sequence, all layers
    cache_bytes: int
    block_params: int  # all layers' blocks
    prefill_flops: int  # per token, averaged over seq_len, all layers' blocks
    decode_flops: int  # the seq_len-th token, all layers' blocks


def block_cost(block: str, kwargs: dict[str, Any], d_model: int, seq_len: int,
               n_layers: int = 1, dtype_bytes: int = 2) -> Cost:
    """Build the block on the meta device and read its budget; a ValueError names a
    setting its config rejects."""
    with torch.device("meta"):
        built = zoo.build(block, d_model=d_model, **kwargs)
        mlp = 2 * d_model  # the MLP at width 1: its up and down projections
        layer_base = sum(p.numel() for p in Layer(d_model, 1, built, NORM).parameters()) - mlp
    budget = built.budget(seq_len)
    step = budget.flops_per_token
    if seq_len > 1:
        step = seq_len * step - (seq_len - 1) * built.budget(seq_len - 1).flops_per_token
    L = n_layers
    return Cost(budget=budget, config=built.config, layer_base=layer_base,
                cache_elements=L * budget.cache_elements,
                cache_bytes=L * budget.cache_elements * dtype_bytes,
                block_params=L * (budget.params or built.param_count()),
                prefill_flops=L * budget.flops_per_token, decode_flops=L * max(step, 0))


def reference_layer(d_model: int, n_heads: int, seq_len: int) -> int:
    """The parameters of the layer every candidate is matched to: multi-head softmax
    attention with a 4 x d_model MLP (ValueError when it cannot be built at these widths)."""
    ref = block_cost("softmax", {"n_heads": n_heads}, d_model, seq_len)
    return ref.layer_base + 2 * d_model * default_d_mlp(d_model, MLP_RATIO, None)


def matched_width(cost: Cost, d_model: int, n_layers: int, ref_layer: int | None,
                  label: str) -> tuple[int | None, str | None]:
    """(d_mlp, None): the MLP width that gives this setting's layers the reference's
    parameters within 5% (train/experiment/plan.py match_d_mlp); (None, why) when none does."""
    if ref_layer is None:
        return None, "no reference: multi-head softmax attention cannot be built here"
    L = n_layers
    try:
        width = match_d_mlp(L * ref_layer, L * cost.layer_base, 2 * d_model * L,
                            MATCH_TOLERANCE, label, floor=mlp_floor(d_model),
                            ref_width=default_d_mlp(d_model, MLP_RATIO, None))
    except ValueError as e:
        return None, str(e)
    return width, None


# ---------------------------------------------------------------- constraints and sizing

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


def size(shape: Shape, c: Constraints) -> Sized:
    """The largest knob value of `shape` that meets every budget: the smallest useful value
    (the first whose layer carries a past->future rank >= 1) is checked, then a bisection
    over the values finds the largest that fits (costs never shrink along them)."""
    base = shape.base_kwargs(c.n_heads)
    values = knob_values(shape, base, c.d_model, c.seq_len)
    costs: dict[int, Cost] = {}

    def cost_at(i: int) -> Cost:  # a ValueError for a value the block's config rejects
        if i not in costs:
            costs[i] = c.cost(shape.block, {**base, shape.knob: values[i]})
        return costs[i]

    floor, start = None, 0
    while floor is None:
        found = accepted(cost_at, range(start, len(values)))
        if found is None:  # the block's own reason, from its first value
            try:
                cost_at(0)
            except ValueError as e:
                raise ValueError(f"no {shape.knob} builds at d_model={c.d_model}, n_heads="
                                 f"{c.n_heads} ({e})") from None
            raise ValueError(f"no {shape.knob} carries anything across the sequence")
        floor, start = (found if found[1].budget.mixing >= 1 else None), found[0] + 1
    lo, low_cost = floor
    top = values[len(values) - 1]

    def sized(i: int, cost: Cost, limited_by: list[str], fits: bool) -> Sized:
        return Sized(shape, {**base, shape.knob: values[i]}, values[i], cost,
                     tuple(limited_by), fits, top)

    if c.over(low_cost):
        return sized(lo, low_cost, c.over(low_cost), False)

    first = lo

    def at_or_below(i: int) -> tuple[int, Cost]:  # the nearest accepted value <= i
        found = accepted(cost_at, range(i, first - 1, -1))
        assert found is not None  # the smallest useful value is accepted
        return found

    hi = len(values) - 1
    while lo < hi:  # the largest i whose nearest accepted value at or below it fits
        mid = (lo + hi + 1) // 2
        if c.over(at_or_below(mid)[1]):
            hi = mid - 1
        else:
            lo = mid
    best, cost = at_or_below(lo)
    above = accepted(cost_at, range(best + 1, len(values)))
    return sized(best, cost, ["range"] if above is None else c.over(above[1]), True)


# ---------------------------------------------------------------- the document

def reach(config: Any, seq_len: int, n_layers: int) -> int:
    """How many tokens back the stack of layers can bring anything from: a sliding window
    W - 1 per layer, added up over the layers; every other block sees the whole past."""
    window = getattr(config, "window", None)
    return seq_len - 1 if window is None else min(seq_len - 1, n_layers * (window - 1))


def recall_cell(row: dict[str, Any]) -> str:
    """yes; or why not: `reach 984` (the stack sees only that far back), `p->f 5` (the
    past->future cap is under the associations)."""
    if row["holds_associations"]:
        return "yes"
    if row["reach_tokens"] < row["seq_len"] - 1:
        return f"reach {row['reach_tokens']:,}"
    return f"p->f {row['carried']}"


def candidate_row(s: Sized, c: Constraints, ref_layer: int | None) -> dict[str, Any]:
    cost, b, D, L = s.cost, s.cost.budget, c.d_model, c.n_layers
    width, why = matched_width(cost, D, L, ref_layer, s.label)
    raw_width = default_d_mlp(D, MLP_RATIO, None)
    return {
        "family": s.shape.block, "block": s.shape.block, "label": s.label,
        "kwargs": dict(s.kwargs), "seq_len": c.seq_len,
        "knob": {"name": s.shape.knob, "symbol": s.shape.family.symbol, "value": s.value,
                 "max": s.top, "shown": describe(s.shape.block, cost.config)},
        "limited_by": list(s.limited_by),
        "caps": {"mixing": b.mixing, "logits": b.logits, "value_path": b.value_path,
                 "inference": b.inference},
        "carried": b.mixing,  # per head: the past->future rank a layer can carry across
        "reach_tokens": reach(cost.config, c.seq_len, L),
        "holds_associations": (b.mixing >= c.associations
                               and reach(cost.config, c.seq_len, L) >= c.seq_len - 1),
        "cache_elements": cost.cache_elements, "cache_bytes": cost.cache_bytes,
        "params": {"blocks": cost.block_params,
                   "layers": L * (cost.layer_base + 2 * D * raw_width),
                   "d_mlp": raw_width, "d_mlp_matched": width,
                   "layers_matched": None if width is None else
                   L * (cost.layer_base + 2 * D * width),
                   **({"unmatched": why} if why else {})},
        "flops": {"prefill_per_token": cost.prefill_flops, "decode_step": cost.decode_flops},
        "evidence": [], "front": False,
    }


def infeasible_row(s: Sized, c: Constraints) -> dict[str, Any]:
    cost = s.cost
    figures = {"cache": f"{format_bytes(cost.cache_bytes)} of cache",
               "params": f"{format_count(cost.block_params)} block parameters",
               "FLOPs": f"{format_count(cost.prefill_flops)} FLOPs/token"}
    limits = {"cache": format_bytes(c.cache_budget),
              "params": format_count(c.params_budget), "FLOPs": format_count(c.flops_budget)}
    over = ", ".join(f"{figures[k]} > {limits[k]}" for k in s.limited_by)
    return {"family": s.shape.block, "block": s.shape.block, "label": s.label,
            "kwargs": dict(s.kwargs),
            "smallest": {"knob": s.shape.knob, "value": s.value,
                         "shown": describe(s.shape.block, cost.config),
                         "cache_bytes": cost.cache_bytes, "block_params": cost.block_params,
                         "prefill_flops": cost.prefill_flops},
            "over": list(s.limited_by),
            "reason": f"{s.label} at its smallest, "
                      f"{describe(s.shape.block, cost.config)}: {over}"}


def pick_document(c: Constraints, runs: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Candidates (one per shape whose knob fits), grouped by family and ordered by cache;
    the shapes that do not fit and why; with `runs`, what they measured, joined to the
    candidates. A ValueError when nothing fits, naming the smallest cache there is."""
    sized, unbuilt = [], []
    for shape in shapes(c.d_model, c.n_heads):
        try:
            sized.append(size(shape, c))
        except ValueError as e:  # no value of its knob builds at these widths: say why
            unbuilt.append({"family": shape.block, "block": shape.block,
                            "label": shape.label(), "kwargs": shape.base_kwargs(c.n_heads),
                            "smallest": None, "over": [],
                            "reason": f"{shape.label()}: {e}"})
    if not sized:
        raise ValueError(f"no block can be built at d_model={c.d_model}, n_heads={c.n_heads}: "
                         f"e.g. {unbuilt[0]['reason']}")
    fitting = [s for s in sized if s.fits]
    if not fitting:
        raise ValueError(nothing_fits(c, sized))
    try:
        ref_layer = reference_layer(c.d_model, c.n_heads, c.seq_len)
    except ValueError:
        ref_layer = None
    rows = [candidate_row(s, c, ref_layer) for s in fitting]
    notes: list[str] = []
    if runs:
        join_evidence(list(zip(fitting, rows, strict=True)), read_runs(runs, c, notes), c, notes)
    mark_front(rows)
    order = family_order([(r["family"], r["cache_bytes"]) for r in rows])
    rows.sort(key=lambda r: (order[r["family"]], r["cache_bytes"], r["label"]))
    return {
        "constraints": c.to_dict(),
        "reference": {"block": "softmax", "label": "MHA", "d_mlp": default_d_mlp(
            c.d_model, MLP_RATIO, None), "layer_params": ref_layer},
        "candidates": rows,
        "infeasible": [infeasible_row(s, c) for s in sized if not s.fits] + unbuilt,
        "runs": [str(r) for r in runs],
        "notes": notes,
    }


def family_order(pairs: list[tuple[str, int | None]]) -> dict[str, int]:
    """Family -> its place: by the smallest cache among its rows (None last), then in
    FAMILIES order."""
    smallest: dict[str, float] = {}
    for family, cache in pairs:
        value = math.inf if cache is None else cache
        smallest[family] = min(smallest.get(family, math.inf), value)
    names = list(FAMILIES)
    ranked = sorted(smallest, key=lambda f: (smallest[f], names.index(f) if f in names
                                             else len(names), f))
    return {f: i for i, f in enumerate(ranked)}


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
    if c.params_budget is not None:
        asked.append(f"{format_count(c.params_budget)} block parameters")
        few = smallest(lambda s: s.cost.block_params)
        if few.cost.block_params > c.params_budget or "params" in cache.limited_by:
            found.append(f"the fewest parameters {few.label} "
                         f"{describe(few.shape.block, few.cost.config)} with "
                         f"{format_count(few.cost.block_params)}")
    if c.flops_budget is not None:
        asked.append(f"{format_count(c.flops_budget)} FLOPs/token")
        few = smallest(lambda s: s.cost.prefill_flops)
        if few.cost.prefill_flops > c.flops_budget or "FLOPs" in cache.limited_by:
            found.append(f"the fewest FLOPs {few.label} "
                         f"{describe(few.shape.block, few.cost.config)} with "
                         f"{format_count(few.cost.prefill_flops)}/token")
    return f"nothing fits {', '.join(asked)}: {'; '.join(found)}"


# ---------------------------------------------------------------- the Pareto front

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
    for row in rows:
        row["front"] = not any(dominates(other, row) for other in rows if other is not row)


# ---------------------------------------------------------------- evidence from runs

def read_runs(dirs: Sequence[str | Path], c: Constraints, notes: list[str]) -> list[dict]:
    """What the finished runs under `dirs` (experiment or variant directories) measured,
    one record per run; a run trained at another d_model, n_heads or seq_len is left out
    with a note."""
    records = []
    for d in dirs:
        path = Path(d)
        if not path.exists():
            raise FileNotFoundError(f"--runs {d}: no such run directory")
        if not path.is_dir():
            raise NotADirectoryError(f"--runs {d}: not a run directory (a file)")
        vdirs = [path] if is_variant_dir(path) else [
            v for v in variant_dirs(path) if has_results(v)]
        if not vdirs:
            notes.append(f"{path}: no results (no report.json or ranks.jsonl): ignored")
        for vdir in vdirs:
            record = run_record(vdir, c, notes)
            if record is not None:
                records.append(record)
    return records


def run_record(vdir: Path, c: Constraints, notes: list[str]) -> dict | None:
    config_path = vdir / "config.yaml"
    if not config_path.is_file():
        notes.append(f"{vdir}: no config.yaml, so its block is unknown: ignored")
        return None
    config = read_yaml(config_path) or {}
    block = dict(config.get("block") or {})
    name = block.pop("name", None)
    d_model = (config.get("model") or {}).get("d_model")
    seq_len = (config.get("data") or {}).get("seq_len")
    if name is None or d_model is None or seq_len is None:
        notes.append(f"{vdir}: config.yaml lacks block.name, model.d_model or data.seq_len: "
                     "ignored")
        return None
    trained = {"d_model": d_model, "n_heads": block.get("n_heads"), "seq_len": seq_len}
    target = {"d_model": c.d_model, "n_heads": c.n_heads, "seq_len": c.seq_len}
    differ = [k for k in trained if trained[k] != target[k]]
    if differ:
        notes.append(f"{vdir}: trained at {', '.join(f'{k}={trained[k]}' for k in differ)}, "
                     f"not the target's {', '.join(f'{k}={target[k]}' for k in differ)}: "
                     "its figures do not carry over; ignored")
        return None
    variant = variant_report(vdir)["variants"][0]
    metrics = variant.get("metrics", {})
    status = variant.get("status")
    state = status.get("state") if isinstance(status, dict) else None
    if state not in (None, "finished"):
        notes.append(f"{vdir}: {state} at step {variant['step']}: its figures are not final")
    n_layers = (config.get("model") or {}).get("n_layers")
    if n_layers is not None and n_layers != c.n_layers:
        notes.append(f"{vdir}: measured with {n_layers} layers, the target has {c.n_layers}")
    by_kv = {k.rsplit("/kv", 1)[1]: v for k, v in metrics.items()
             if k.startswith("val/accuracy/kv")}
    return {"run": str(vdir), "variant": variant["variant"], "block": name, "kwargs": block,
            "n_layers": n_layers, "step": variant["step"],
            "state": state,
            "accuracy": metrics.get("val/accuracy"), "accuracy_by_kv": by_kv,
            "probe_len": variant["seq_len"], **axis_means(variant)}


def axis_means(variant: dict) -> dict[str, dict[str, float | None]]:
    """The realized rank and utilization of the mixing (past->future) and inference axes,
    each the mean over layers and quantities of the report's rows."""
    sums: dict[str, dict[str, list[float]]] = {"mixing": {}, "inference": {}}
    for layer in variant["layers"]:
        for row in layer["axes"]:
            if row["axis"] in sums:
                for key in ("realized_mean", "utilization", "declared"):
                    if row.get(key) is not None:
                        sums[row["axis"]].setdefault(key, []).append(float(row[key]))

    def mean(xs: list[float] | None) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {"realized": {a: mean(s.get("realized_mean")) for a, s in sums.items()},
            "utilization": {a: mean(s.get("utilization")) for a, s in sums.items()},
            "declared_at_probe": {a: mean(s.get("declared")) for a, s in sums.items()}}


def same_setting(s: Sized, record: dict, c: Constraints) -> int | None:
    """The run's knob value when the run is shape `s` at some value of its knob (same
    block, same fixed settings, and the same declared budget at that value), else None."""
    if record["block"] != s.shape.block:
        return None
    kwargs = record["kwargs"]
    candidate = s.shape.base_kwargs(c.n_heads)
    if s.shape.knob in kwargs:
        candidate[s.shape.knob] = kwargs[s.shape.knob]
    try:
        run = c.cost(record["block"], kwargs)
        ours = c.cost(s.shape.block, candidate)
    except (ValueError, TypeError):
        return None
    if run.budget != ours.budget:
        return None
    if any(resolved(run.config, k) != resolved(ours.config, k) for k, _ in s.shape.fixed):
        return None
    return resolved(run.config, s.shape.knob)


def join_evidence(pairs: list[tuple[Sized, dict]], records: list[dict], c: Constraints,
                  notes: list[str]) -> None:
    """Each record to the candidate it measured (exactly, or at another value of the same
    knob); the exact ones first, then by distance of the knob."""
    for record in records:
        for s, row in pairs:
            value = same_setting(s, record, c)
            if value is not None:
                row["evidence"].append({**record, "knob_value": value,
                                        "exact": value == s.value})
                break
        else:
            settings = ", ".join(f"{k}={v}" for k, v in record["kwargs"].items())
            notes.append(f"{record['run']}: {record['block']} ({settings}) is none of the "
                         "candidates' settings: ignored")
    for s, row in pairs:
        row["evidence"].sort(key=lambda e: (not e["exact"], abs(e["knob_value"] - s.value),
                                            -(e.get("accuracy") or 0.0)))


# ---------------------------------------------------------------- tables

def pick_tables(doc: dict[str, Any]) -> list[Table]:
    """The candidates grouped by family (a section each), the families that do not fit,
    and the knobs' legend."""
    c = doc["constraints"]
    runs = bool(doc["runs"])
    n = c["associations"]
    limits = [f"{format_bytes(c['cache_budget_bytes'])} of {c['cache_dtype']} cache per "
              "sequence"]
    if c["params_budget"] is not None:
        limits.append(f"{format_count(c['params_budget'])} block parameters")
    if c["flops_budget"] is not None:
        limits.append(f"{format_count(c['flops_budget'])} FLOPs/token")
    ref = doc["reference"]
    matched = ("MHA with a 4 x d_model MLP, "
               f"{format_count(ref['layer_params'] * c['n_layers'])} in its layers"
               if ref["layer_params"] is not None else "(no MHA reference at these widths)")
    table = Table(
        title=f"rankzoo pick: d_model={c['d_model']}, n_heads={c['n_heads']}, "
              f"n_layers={c['n_layers']}, seq_len={c['seq_len']}, {', '.join(limits)}",
        caption="knob: sized to the largest value that fits; bound: what stops a larger one "
                "(range: the largest there is). p->f: the declared past->future rank a head "
                f"carries across the sequence at seq_len; >={n}: yes if it reaches the "
                f"{n} associations and the stack sees the whole sequence, else which falls "
                "short (a window's reach: layers x (W - 1) tokens). params: the layers' "
                "blocks and 4 x d_model MLPs "
                f"(embeddings left out); d_mlp: the MLP width that matches them to {matched}. "
                f"cache: bytes per sequence at seq_len, all layers, {c['cache_dtype']}. "
                "FLOPs of the blocks, all layers: prefill per token (averaged over seq_len) "
                "and one decode step (the seq_len-th token)."
                + (" measured: the runs' val/accuracy and realized past->future rank "
                   "(utilization of its cap) at their probe length; @X: measured at another "
                   "knob value." if runs else "")
                + " *: on the Pareto front of cache vs p->f"
                + (" vs measured accuracy." if runs else "."))
    cols = ["family", "candidate", "knob", "bound", "p->f", "inference", f">={n}", "params",
            "d_mlp", "cache", "prefill", "decode"]
    if runs:
        cols += ["accuracy", "p->f real"]
    cols.append("*")
    for col in cols:
        table.add_column(col, justify="left" if col in ("family", "candidate", "knob", "bound")
                         else "right", no_wrap=col in ("family", "knob", f">={n}"))
    family = None
    for row in doc["candidates"]:
        if family is not None and row["family"] != family:
            table.add_section()
        first = row["family"] != family
        family = row["family"]
        p = row["params"]
        cells = [row["family"] if first else "", row["label"].removeprefix(row["family"]).strip(
            " ()"), row["knob"]["shown"], ", ".join(row["limited_by"]),
            str(row["carried"]), str(row["caps"]["inference"]),
            recall_cell(row), format_count(p["layers"]),
            "-" if p["d_mlp_matched"] is None else f"{p['d_mlp_matched']:,}",
            format_bytes(row["cache_bytes"]), format_count(row["flops"]["prefill_per_token"]),
            format_count(row["flops"]["decode_step"])]
        if runs:
            cells += evidence_cells(row)
        cells.append("*" if row["front"] else "")
        table.add_row(*cells)
    tables = [table]
    if doc["infeasible"]:
        out = Table(title="families that do not fit",
                    caption="each at its smallest useful knob value (one that carries "
                            "something across the sequence)")
        for col in ("family", "smallest", "cache", "over"):
            out.add_column(col, justify="right" if col == "cache" else "left")
        for row in doc["infeasible"]:
            smallest = row["smallest"] or {"shown": "-", "cache_bytes": None}
            out.add_row(row["label"], smallest["shown"], format_bytes(smallest["cache_bytes"]),
                        row["reason"].split(": ", 1)[1])
        tables.append(out)
    shown = list(dict.fromkeys([r["family"] for r in doc["candidates"]]
                               + [r["family"] for r in doc["infeasible"]]))
    tables.append(legend_table(shown))
    return tables


def evidence_cells(row: dict[str, Any]) -> list[str]:
    if not row["evidence"]:
        return ["-", "-"]
    e = row["evidence"][0]
    at = "" if e["exact"] else f" @{row['knob']['symbol']}={e['knob_value']}"
    acc = "-" if e.get("accuracy") is None else f"{e['accuracy']:.3f}"
    real, util = e["realized"].get("mixing"), e["utilization"].get("mixing")
    rank = "-" if real is None else f"{real:.1f}" + ("" if util is None else f" ({util:.0%})")
    return [acc + at, rank]


def legend_table(families: Sequence[str]) -> Table:
    table = Table(title="knobs")
    table.add_column("family")
    table.add_column("meaning")
    for name in families:
        if name in FAMILIES:
            table.add_row(name, FAMILIES[name].legend)
    return table


# ---------------------------------------------------------------- --emit

EMIT_SHORTLISTS = ("front", "all")


def shortlist(doc: dict[str, Any], which: str = "front") -> list[dict[str, Any]]:
    """The candidates an emitted experiment trains: the Pareto front, or all of them."""
    if which not in EMIT_SHORTLISTS:
        raise ValueError(f"--shortlist {which}: expected one of {list(EMIT_SHORTLISTS)}")
    return [r for r in doc["candidates"] if which == "all" or r["front"]]


def variant_name(row: dict[str, Any], taken: set[str]) -> str:
    """`sliding_window_mqa_w42`: block, tag and knob, fit for a directory name."""
    knob = row["knob"]
    tag = "" if row["block"] in ("ssm", "mla", "moe") else row["label"].removeprefix(
        row["block"]).strip(" ()").lower().replace("gqa g=", "gqa").replace("+", "")
    text = f"{row['block']} {tag} {knob['symbol']}{knob['value']}".lower()
    name = re.sub(r"[^a-z0-9.]+", "_", text).strip("_.")
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name}_{i}", i + 1
    taken.add(unique)
    return unique


def emitted_experiment(doc: dict[str, Any], name: str, which: str = "front") -> dict[str, Any]:
    """The experiment of the shortlisted candidates: matched in parameters (the one with
    the most parameters first, so that every other one's MLP widens to it), on MQAR with
    the constraints' associations at the target length."""
    c = doc["constraints"]
    D, T, n = c["d_model"], c["seq_len"], c["associations"]
    if 4 * n > T:
        raise ValueError(f"--associations {n}: MQAR needs 4 x associations <= seq_len, so "
                         f"at most {T // 4} at --seq-len {T}")
    rows = sorted(shortlist(doc, which), key=lambda r: -r["params"]["layers"])
    taken: set[str] = set()
    variants = {variant_name(r, taken): {"block": r["block"], **{
        k: v for k, v in r["kwargs"].items() if k != "n_heads"}} for r in rows}
    batch = min(64, max(1, 2 ** 16 // T))  # about 64k tokens a step
    steps = 2000
    pairs = sorted({max(1, n // 4), max(1, n // 2), n})
    data = {"task": "mqar", "vocab_size": max(128, 2 ** math.ceil(math.log2(4 * n))),
            "seq_len": T, "num_kv_pairs": n,
            "train_size": min(20000, max(1024, 2 ** 24 // T)),
            "val_size": min(256, max(len(pairs) * 8, 2 ** 20 // T)), "batch_size": batch}
    if len(pairs) > 1:
        data["val_kv_pairs"] = pairs
    return {
        "name": name, "seed": 0, "data": data,
        "model": {"d_model": D, "n_layers": c["n_layers"], "mlp_ratio": MLP_RATIO},
        "match": {"params": True, "tolerance": MATCH_TOLERANCE},
        "block_defaults": {"n_heads": c["n_heads"]},
        "variants": variants,
        "train": {"max_steps": steps, "lr": 3.0e-3 if D <= 128 else 1.0e-3 if D <= 512
                  else 5.0e-4, "warmup_steps": steps // 20, "accelerator": "auto",
                  "precision": "bf16-mixed" if D >= 512 else "32-true",
                  "val_every_n_steps": steps // 10, "checkpoint_every_n_steps": steps // 4,
                  "log_every_n_steps": 10},
        "monitor": {"every_n_steps": steps // 10, "probe_len": min(256, T)},
    }


def pick_command(c: dict[str, Any], runs: Sequence[str] = ()) -> str:
    """The `rankzoo pick` command line of these constraints."""
    parts = ["rankzoo pick", f"--d-model {c['d_model']}", f"--n-heads {c['n_heads']}",
             f"--n-layers {c['n_layers']}", f"--seq-len {c['seq_len']}",
             f"--cache-budget {byte_flag(c['cache_budget_bytes'])}",
             f"--cache-dtype {c['cache_dtype']}", f"--associations {c['associations']}"]
    if c["params_budget"] is not None:
        parts.append(f"--params-budget {c['params_budget']}")
    if c["flops_budget"] is not None:
        parts.append(f"--flops-budget {c['flops_budget']}")
    if runs:
        parts.append("--runs " + " ".join(runs))
    return " ".join(parts)


def experiment_yaml(raw: dict[str, Any], doc: dict[str, Any], path: Path, which: str) -> str:
    """The experiment as YAML in configs/quick.yaml's layout, with a header saying where it
    came from and what to run next, and each variant's knob and cache beside it."""
    c = doc["constraints"]
    runs_dir = f"runs/{raw['name']}"
    header = [
        f"# Written by rankzoo pick: {len(raw['variants'])} candidates "
        f"({'the Pareto front' if which == 'front' else 'all that fit'}) for d_model="
        f"{c['d_model']}, n_heads={c['n_heads']}, n_layers={c['n_layers']},",
        f"# {format_bytes(c['cache_budget_bytes'])} of {c['cache_dtype']} cache per sequence "
        f"at {c['seq_len']} tokens, matched in parameters, on MQAR with "
        f"{c['associations']} key-value pairs",
        "# at the target length (so that these runs are evidence for the pick). The train "
        "settings are a start:",
        "# sweep the lr (configs/sweep.yaml shows how) before reading much into one run.",
        f"#   rankzoo train {path}",
        f"#   rankzoo report {runs_dir}",
        f"#   {pick_command(c, [runs_dir])}",
    ]
    by_name = {}
    rows = sorted(shortlist(doc, which), key=lambda r: -r["params"]["layers"])
    for name, row in zip(raw["variants"], rows, strict=True):
        by_name[name] = (f"# {row['knob']['shown']}: {format_bytes(row['cache_bytes'])} per "
                         f"sequence, p->f {row['carried']} per head")

    def section(key: str) -> str:
        return yaml.safe_dump({key: raw[key]}, sort_keys=False, default_flow_style=False)

    lines = ["\n".join(header), f"name: {raw['name']}", f"seed: {raw['seed']}"]
    lines += [section("data").rstrip(), section("model").rstrip(), section("match").rstrip(),
              section("block_defaults").rstrip(), "variants:"]
    width = max(len(n) for n in raw["variants"])
    for name, kwargs in raw["variants"].items():
        flow = yaml.safe_dump(kwargs, default_flow_style=True, sort_keys=False,
                              width=10 ** 6).strip()
        lines.append(f"  {name + ':':<{width + 1}} {flow}   {by_name[name]}")
    lines += [section("train").rstrip(), section("monitor").rstrip()]
    return "\n".join(lines) + "\n"


def emit(doc: dict[str, Any], path: str | Path, force: bool = False,
         which: str = "front") -> dict[str, Any]:
    """Write the shortlist's experiment to `path` (a .yaml file) and return it. It is
    loaded back before writing (the same parse `rankzoo train` does), and an existing file
    is kept unless `force`."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"--emit {path}: expected a .yaml file")
    if path.is_dir():
        raise IsADirectoryError(f"--emit {path}: is a directory")
    if path.exists() and not force:
        raise FileExistsError(f"--emit {path}: exists; pass --force to overwrite it "
                              "(nothing was written)")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"--emit {path}: the directory {path.parent} does not exist")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem).lstrip("_.-") or "pick"
    raw = emitted_experiment(doc, name, which)
    text = experiment_yaml(raw, doc, path, which)
    try:
        parse_experiment(yaml.safe_load(text), source=str(path))
    except ValueError as e:
        raise ValueError(f"--emit {path}: the experiment would not load, so it was not "
                         f"written: {e}") from None
    write_new(path, text, force)
    return raw


def write_new(path: Path, text: str, force: bool) -> None:
    """`text` into `path`: created exclusively (a file that appeared meanwhile is kept),
    or with `force` replaced atomically through a temporary file beside it."""
    if not force:
        try:
            with open(path, "x") as f:
                f.write(text)
        except FileExistsError:
            raise FileExistsError(f"--emit {path}: exists; pass --force to overwrite it "
                                  "(nothing was written)") from None
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
