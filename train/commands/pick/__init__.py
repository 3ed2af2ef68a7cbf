"""`rankzoo pick`: from a model's constraints to the blocks that fit them, each sized.

    c = Constraints(d_model=1024, n_heads=16, n_layers=24, seq_len=8192,
                    cache_budget=256 * 1024, cache_dtype="bf16")
    doc = pick_document(c)                     # candidates, the families that do not fit
    doc = pick_document(c, runs=["runs/pick"])  # ... with what finished runs measured

For every block family pick sizes the knob that sets what the family caches (the sizing
the family declares, zoo/facts.py, read through train/sizing/families.py: the KV heads G
of softmax attention, the window W, the feature width K of linear attention, the SSM
state N, the MLA latent R; for MoE the number of active heads k, which sets its FLOPs) to
the largest value whose cache per sequence at the target length, over all layers and at
the cache dtype, fits the budget (and, when given, whose parameters and FLOPs fit
theirs). A value whose layer carries nothing across the sequence (a window of one key)
is no candidate. Each candidate is shown with its declared caps, its costs and, from
`--runs`, what the runs measured for it; the Pareto front of cache bytes against the
past->future rank it can carry (and measured accuracy, where there is one) is marked.

Every figure comes from the blocks themselves (train/sizing/costs.py): each setting is
built on the meta device and its `budget(seq_len)` gives the caps, the parameters, the
cached elements and the FLOPs per token. Parameters are matched the way
`match: {params: true}` matches them (train/sizing/match.py).

The modules: constraints.py (Constraints, and a knob sized to them), front.py (order, the
Pareto front, why nothing fits), evidence.py (`--runs`), emit.py (`--emit pick.yaml`: the
shortlist as an experiment `rankzoo train` runs as is, whose runs come back as evidence);
the tables are train/render/pick.py's. This module builds the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...sizing.costs import MLP_RATIO, matched_width, reference_layer
from ...sizing.families import describe, shapes
from ...sizing.match import default_d_mlp
from ...sizing.units import format_bytes, format_count
from .constraints import Constraints, Sized, reach, size
from .emit import EMIT_SHORTLISTS, emit
from .evidence import join_evidence, read_runs
from .front import family_order, mark_front, nothing_fits

__all__ = ["EMIT_SHORTLISTS", "Constraints", "emit", "pick_document"]


def pick_document(c: Constraints, runs: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Candidates (one per shape whose knob fits), grouped by family and ordered by cache;
    the shapes that do not fit and why; with `runs`, what they measured, joined to the
    candidates. A ValueError when nothing fits, naming the smallest cache there is."""
    sized, unbuilt = size_all(c)
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


def size_all(c: Constraints) -> tuple[list[Sized], list[dict[str, Any]]]:
    """Every shape sized, and a row for each shape none of whose knob values builds at
    these widths (a ValueError when that is every shape)."""
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
    return sized, unbuilt


def candidate_row(s: Sized, c: Constraints, ref_layer: int | None) -> dict[str, Any]:
    """A fitting shape's row: its knob, caps, reach, cache, parameters (raw and matched to
    the reference layer), FLOPs; evidence and the front are filled in later."""
    cost, b, D, L = s.cost, s.cost.budget, c.d_model, c.n_layers
    width, why = matched_width(cost, D, L, ref_layer, s.label)
    raw_width = default_d_mlp(D, MLP_RATIO, None)
    return {
        "family": s.shape.block, "block": s.shape.block, "label": s.label,
        "kwargs": dict(s.kwargs), "seq_len": c.seq_len,
        "knob": {"name": s.shape.knob, "symbol": s.shape.sizing.symbol, "value": s.value,
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
    """A shape that does not fit: its smallest useful value and the budgets it exceeds."""
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
