"""The dry-run plan: what each variant of an experiment costs, before any training.

    doc = plan_document(load_experiment("configs/quick.yaml"))
    out.print(plan_table(doc))      # train/render/plan.py

Per variant: its block, parameters (and their difference to the first variant's), MLP
width, the state knob (the value used and the one written, where match.state sized it),
the declared budget per layer, and the cache and FLOPs of all layers. Models and blocks are
built on the meta device, so planning stays instant at any model size. The matching
itself (match.params, match.state) is train/sizing/match.py's; its names and the table are
importable from here too while the callers move to them.
"""

from __future__ import annotations

from typing import Any

import torch

import zoo

from ..config.layers import HYBRID, LayerSpec, describe
from ..lm.decoder import block_specs
from ..sizing.match import count_params, default_d_mlp, state_knob

__all__ = ["plan_document", "plan_row"]


def plan_document(exp) -> dict[str, Any]:
    """The matched table of an Experiment: per variant its block, parameters (and relative
    difference to the first variant), MLP width, state knob, declared budget per layer and
    costs (cache relative to the first variant's too)."""
    rows: list[dict[str, Any]] = []
    # a sweep's grid points share a model: one row per configured variant
    for name, run in exp.base_variants().items():
        rows.append(plan_row(exp, name, run, rows[0] if rows else None))
    doc = {"experiment": exp.name, "seq_len": exp.data.seq_len, "d_model": exp.model.d_model,
           "n_layers": exp.model.n_layers, "match": exp.match.to_dict(),
           "data": exp.data.to_dict(), "intrinsic_rank": exp.data.intrinsic_rank,
           "variants": rows}
    if exp.sweep is not None:
        doc["sweep"] = {**exp.sweep.to_dict(), "runs": len(exp.variants)}
    return doc


def plan_row(exp, name: str, run: str, first: dict[str, Any] | None) -> dict[str, Any]:
    """The row of variant `name` (built as its run `run`), its differences relative to the
    first row (None: this is the first). A layer pattern's budget cells are the largest cap
    among its layers, its cache and FLOPs the sum over them; `layers` gives each layer's."""
    T, D, n_layers = exp.data.seq_len, exp.model.d_model, exp.model.n_layers
    config = exp.variant_config(run)
    specs = block_specs(config)
    with torch.device("meta"):
        budgets = [zoo.build(block, d_model=D, **kw).budget(T) for block, kw in specs]
    mlp = config["model"].get("mlp", "gelu")
    d_mlp = config["model"]["d_mlp"] or default_d_mlp(D, exp.model.mlp_ratio, None, mlp)
    params = count_params(exp.data.vocab_size, D, n_layers, None, None, d_mlp, T,
                          exp.model.norm, exp.model.tie_embeddings, layers=specs, mlp=mlp)
    cache = sum(b.cache_elements for b in budgets)
    ref, ref_cache = (first["params"], first["cache_elements"]) if first else (params, cache)
    row = {
        "variant": name, "block": config["block"]["name"] if "block" in config else HYBRID,
        "kwargs": specs[0][1] if "block" in config else {},
        "params": params, "rel_diff": (params - ref) / ref, "d_mlp": d_mlp,
        "state": _state_row(exp, run, specs[0][1]),
        "budget_per_layer": {k: max(_caps(b)[k] for b in budgets) for k in BUDGET_AXES},
        "cache_elements": cache,
        "cache_rel_diff": (cache - ref_cache) / ref_cache if ref_cache else 0.0,
        "flops_per_token": sum(b.flops_per_token for b in budgets),
    }
    if "layers" in config:
        row["pattern"] = describe([LayerSpec(label, b, kw) for label, (b, kw)
                                   in zip(config["pattern"], specs, strict=True)])
        row["layers"] = [{"layer": i, "label": label, "block": b, "kwargs": kw,
                          "budget": _caps(budget), "cache_elements": budget.cache_elements}
                         for i, (label, (b, kw), budget)
                         in enumerate(zip(config["pattern"], specs, budgets, strict=True))]
    return row


BUDGET_AXES = ("mixing", "logits", "value_path", "inference", "total")


def _caps(budget) -> dict[str, int]:
    return {k: getattr(budget, k) for k in BUDGET_AXES}


def _state_row(exp, variant: str, used: dict[str, Any]) -> dict[str, Any] | None:
    """The variant's state knob: the value used and the one written in the config (None
    when unset there, i.e. the block's default); None for a block with no known knob."""
    v = exp.variants[variant]
    if v.unit:  # a layer pattern: each layer's knob is its own (match.state refuses it)
        return None
    knob = state_knob(v.block)[0]
    return {"knob": knob, "value": used.get(knob), "written": v.block_kwargs.get(knob),
            "matched": knob in exp.state.get(variant, {})}
