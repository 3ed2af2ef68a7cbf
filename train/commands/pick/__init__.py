"""`rankzoo pick`: from a model's constraints to the blocks that fit them, each sized.

    c = Constraints(d_model=1024, n_heads=16, n_layers=24, seq_len=8192,
                    cache_budget=256 * 1024, cache_dtype="bf16")
    doc = pick_document(c)                     # candidates, the families that do not fit
    doc = pick_document(c, runs=["runs/pick"])  # ... with what finished runs measured
    doc = pick_document(c, hybrids=Hybrids(every=(6,), keep="all"))  # every 5:1 that fits

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

Beside them pick proposes hybrids (hybrids.py): a global layer (full softmax attention, or
MLA) every N layers, the layers between them of a cheap shape whose knob is sized to what
the global layers leave of the budgets; they sit on the same front. By default the
document keeps the hybrids no other hybrid outdoes (`Hybrids(keep="all")`: every one that
fits).

Every figure comes from the blocks themselves (train/sizing/costs.py): each setting is
built on the meta device and its `budget(seq_len)` gives the caps, the parameters, the
cached elements and the FLOPs per token. Parameters are matched the way
`match: {params: true}` matches them (train/sizing/match.py).

The modules: constraints.py (Constraints, and a knob sized to them), hybrids.py (the
hybrids proposed and sized), rows.py (a candidate's row, and a shape's that does not fit),
front.py (order, the Pareto front, why nothing fits), evidence.py (`--runs`), emit.py
(`--emit pick.yaml`: the shortlist as an experiment `rankzoo train` runs as is, whose runs
come back as evidence); the tables are train/render/pick.py's. This module builds the
document.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...config.layers import HYBRID
from ...sizing.costs import MLP_RATIO, reference_layer
from ...sizing.families import shapes
from ...sizing.match import default_d_mlp
from .constraints import Constraints, Sized, size
from .emit import EMIT_SHORTLISTS, emit
from .evidence import join_evidence, read_runs
from .front import family_order, mark_front, nothing_fits, undominated
from .hybrids import KEEP, Hybrid, Hybrids, global_kinds, size_hybrids
from .rows import candidate_row, hybrid_infeasible_rows, hybrid_row, infeasible_row

__all__ = ["EMIT_SHORTLISTS", "KEEP", "Constraints", "Hybrids", "emit", "pick_document"]


def pick_document(c: Constraints, runs: Sequence[str | Path] = (),
                  hybrids: Hybrids | None = None) -> dict[str, Any]:
    """Candidates (one per shape whose knob fits, then the hybrids kept), the uniform ones
    grouped by family and ordered by cache; the shapes that do not fit and why; with
    `runs`, what they measured, joined to the candidates. A ValueError when nothing fits,
    naming the smallest cache there is. `hybrids`: which are proposed (None: the
    defaults, Hybrids())."""
    hybrids = hybrids or Hybrids()
    hybrids.check(c)  # a bad flag is named before any work
    sized, unbuilt = size_all(c)
    proposed = size_hybrids(c, hybrids)
    fitting = [s for s in sized if s.fits]
    fitting_hybrids = [h for h in proposed if h.fits]
    if not fitting and not fitting_hybrids:
        raise ValueError(nothing_fits(c, sized))
    try:
        ref_layer = reference_layer(c.d_model, c.n_heads, c.seq_len)
    except ValueError:
        ref_layer = None
    pairs: list[tuple[Sized | Hybrid, dict[str, Any]]] = [
        *((s, candidate_row(s, c, ref_layer)) for s in fitting),
        *((h, hybrid_row(h, c, ref_layer)) for h in fitting_hybrids)]
    notes: list[str] = []
    if runs:
        join_evidence(pairs, read_runs(runs, c, notes), c, notes)
    rows = [row for _, row in pairs]
    mark_front(rows)
    return {
        "constraints": c.to_dict(),
        "reference": {"block": "softmax", "label": "MHA", "d_mlp": default_d_mlp(
            c.d_model, MLP_RATIO, None), "layer_params": ref_layer},
        "candidates": ordered(rows, hybrids),
        "infeasible": [infeasible_row(s, c) for s in sized if not s.fits] + unbuilt
                      + hybrid_infeasible_rows(proposed, c),
        "hybrids": hybrids_summary(c, hybrids, rows),
        "runs": [str(r) for r in runs],
        "notes": notes,
    }


def ordered(rows: list[dict[str, Any]], hybrids: Hybrids) -> list[dict[str, Any]]:
    """The uniform candidates by family (a family's place: its smallest cache), then by
    cache; then the hybrids kept (unless all are: those no other hybrid outdoes, and
    those a run measured), the fewest global layers first."""
    uniform = [r for r in rows if r["family"] != HYBRID]
    order = family_order([(r["family"], r["cache_bytes"]) for r in uniform])
    uniform.sort(key=lambda r: (order[r["family"]], r["cache_bytes"], r["label"]))
    hybrid = [r for r in rows if r["family"] == HYBRID]
    best = {id(r) for r in undominated(hybrid, hybrid)}
    kept = [r for r in hybrid if hybrids.keep == "all" or id(r) in best or r["evidence"]]
    kept.sort(key=lambda r: (-r["unit"]["every"], r["cache_bytes"], r["label"]))
    return uniform + kept


def hybrids_summary(c: Constraints, hybrids: Hybrids,
                    rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What was proposed: the unit lengths, the global kinds, how many fit and how many
    are shown."""
    if hybrids.keep == "none":
        return {"keep": "none"}
    fit = [r for r in rows if r["family"] == HYBRID]
    return {**hybrids.to_dict(c),
            "globals": [{"block": g.block, **g.kwargs} for g in global_kinds(c, hybrids)],
            "fit": len(fit), "shown": len(ordered(fit, hybrids))}


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
