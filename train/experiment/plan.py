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

from ..sizing.match import STATE_KNOBS, count_params, default_d_mlp

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
    first row (None: this is the first)."""
    T, D, n_layers = exp.data.seq_len, exp.model.d_model, exp.model.n_layers
    config = exp.variant_config(run)
    block_kwargs = {k: v for k, v in config["block"].items() if k != "name"}
    with torch.device("meta"):
        block = zoo.build(config["block"]["name"], d_model=D, **block_kwargs)
    budget = block.budget(T)
    d_mlp = config["model"]["d_mlp"] or default_d_mlp(D, exp.model.mlp_ratio, None)
    params = count_params(exp.data.vocab_size, D, n_layers, config["block"]["name"],
                          block_kwargs, d_mlp, T, exp.model.norm, exp.model.tie_embeddings)
    cache = budget.cache_elements * n_layers
    ref, ref_cache = (first["params"], first["cache_elements"]) if first else (params, cache)
    return {
        "variant": name, "block": config["block"]["name"], "kwargs": block_kwargs,
        "params": params, "rel_diff": (params - ref) / ref, "d_mlp": d_mlp,
        "state": _state_row(exp, run, block_kwargs),
        "budget_per_layer": {"mixing": budget.mixing, "logits": budget.logits,
                             "value_path": budget.value_path,
                             "inference": budget.inference, "total": budget.total},
        "cache_elements": cache,
        "cache_rel_diff": (cache - ref_cache) / ref_cache if ref_cache else 0.0,
        "flops_per_token": budget.flops_per_token * n_layers,
    }


def _state_row(exp, variant: str, used: dict[str, Any]) -> dict[str, Any] | None:
    """The variant's state knob: the value used and the one written in the config (None
    when unset there, i.e. the block's default); None for a block with no known knob."""
    v = exp.variants[variant]
    if v.block not in STATE_KNOBS:
        return None
    knob = STATE_KNOBS[v.block][0]
    return {"knob": knob, "value": used.get(knob), "written": v.block_kwargs.get(knob),
            "matched": knob in exp.state.get(variant, {})}
