"""Parameter matching and the dry-run table: what each variant costs, before any training.

Models are built on the meta device: shapes and parameter counts without allocating or
initializing weights, so sizing and planning stay instant at any model size.
"""

from __future__ import annotations

from typing import Any

import torch

from .model import DecoderLM


def count_params(vocab_size: int, d_model: int, n_layers: int, block: str,
                 block_kwargs: dict[str, Any], d_mlp: int, seq_len: int, norm: str,
                 tie_embeddings: bool) -> int:
    with torch.device("meta"):
        model = DecoderLM(vocab_size, d_model, n_layers, block, block_kwargs, d_mlp=d_mlp,
                          max_len=seq_len, norm=norm, tie_embeddings=tie_embeddings)
    return model.param_count()


def default_d_mlp(d_model: int, mlp_ratio: float, d_mlp: int | None) -> int:
    """The MLP width DecoderLM uses when the config does not match it."""
    return d_mlp if d_mlp is not None else max(1, round(mlp_ratio * d_model))


def match_d_mlp(target: int, base: int, per_unit: int, tolerance: float,
                variant: str) -> int:
    """The MLP width that brings `base + per_unit * d_mlp` parameters closest to `target`.

    The MLP's parameters are exactly linear in its width (two bias-free projections per
    layer), so one division solves it; an impossible target names the counts.
    """
    d_mlp = max(1, round((target - base) / per_unit))
    total = base + per_unit * d_mlp
    if abs(total - target) > tolerance * target:
        raise ValueError(
            f"match.params: variant {variant!r} cannot be matched to {target:,} parameters "
            f"within {tolerance:.1%}: without its MLP it already has {base:,}, and the "
            f"narrowest MLP (d_mlp=1) gives {base + per_unit:,}; at d_mlp={d_mlp} it has "
            f"{total:,}")
    return d_mlp


def matched_widths(exp_raw: dict[str, Any], variants: dict[str, tuple[str, dict]],
                   tolerance: float) -> dict[str, int]:
    """d_mlp per variant so that every total is within `tolerance` of the first variant's.

    `exp_raw` holds vocab_size, d_model, n_layers, mlp_ratio, d_mlp, seq_len, norm,
    tie_embeddings; the first variant (the reference) keeps the configured width.
    """
    e = exp_raw
    common = dict(vocab_size=e["vocab_size"], d_model=e["d_model"], n_layers=e["n_layers"],
                  seq_len=e["seq_len"], norm=e["norm"], tie_embeddings=e["tie_embeddings"])
    per_unit = 2 * e["d_model"] * e["n_layers"]  # up and down projection, every layer
    ref_width = default_d_mlp(e["d_model"], e["mlp_ratio"], e["d_mlp"])
    widths, target = {}, None
    for name, (block, kwargs) in variants.items():
        base = count_params(block=block, block_kwargs=kwargs, d_mlp=1, **common) - per_unit
        if target is None:
            target, widths[name] = base + per_unit * ref_width, ref_width
            continue
        widths[name] = match_d_mlp(target, base, per_unit, tolerance, name)
    return widths


def plan_document(exp) -> dict[str, Any]:
    """The matched table of an Experiment: per variant its block, parameters (and relative
    difference to the first variant), MLP width, declared budget per layer and costs."""
    import zoo

    rows, ref = [], None
    T, D, n_layers = exp.data.seq_len, exp.model.d_model, exp.model.n_layers
    for name in exp.variants:
        config = exp.variant_config(name)
        block_kwargs = {k: v for k, v in config["block"].items() if k != "name"}
        with torch.device("meta"):
            block = zoo.build(config["block"]["name"], d_model=D, **block_kwargs)
        budget = block.budget(T)
        d_mlp = config["model"]["d_mlp"] or default_d_mlp(D, exp.model.mlp_ratio, None)
        params = count_params(exp.data.vocab_size, D, n_layers, config["block"]["name"],
                              block_kwargs, d_mlp, T, exp.model.norm, exp.model.tie_embeddings)
        ref = ref if ref is not None else params
        rows.append({
            "variant": name, "block": config["block"]["name"], "kwargs": block_kwargs,
            "params": params, "rel_diff": (params - ref) / ref, "d_mlp": d_mlp,
            "budget_per_layer": {"mixing": budget.mixing, "logits": budget.logits,
                                 "value_path": budget.value_path,
                                 "inference": budget.inference, "total": budget.total},
            "cache_elements": budget.cache_elements * n_layers,
            "flops_per_token": budget.flops_per_token * n_layers,
        })
    return {"experiment": exp.name, "seq_len": T, "d_model": D, "n_layers": n_layers,
            "match": exp.match.to_dict(), "data": exp.data.to_dict(),
            "intrinsic_rank": exp.data.intrinsic_rank, "variants": rows}


def plan_table(doc: dict[str, Any]):
    from rich.table import Table

    match = doc["match"]
    matched = f"matched within {match['tolerance']:.0%}" if match["params"] else "not matched"
    table = Table(title=f"{doc['experiment']}: {len(doc['variants'])} variants, "
                        f"d_model={doc['d_model']}, n_layers={doc['n_layers']}, "
                        f"seq_len={doc['seq_len']} (parameters {matched})"
                        + (f"; data's intrinsic rank {doc['intrinsic_rank']}"
                           if doc["intrinsic_rank"] is not None else ""),
                  caption="budget: declared rank caps per layer; cache (elements per sequence at "
                          "seq_len) and FLOPs/token of the blocks, all layers")
    cols = ("variant", "block", "params", "vs first", "d_mlp", "mixing", "logits",
            "value_path", "inference", "total", "cache", "FLOPs/token")
    for col in cols:
        table.add_column(col, justify="left" if col in ("variant", "block") else "right")
    for r in doc["variants"]:
        b = r["budget_per_layer"]
        table.add_row(r["variant"], r["block"], f"{r['params']:,}", f"{r['rel_diff']:+.1%}",
                      str(r["d_mlp"]), *(str(b[k]) for k in ("mixing", "logits", "value_path",
                                                             "inference", "total")),
                      f"{r['cache_elements']:,}", f"{r['flops_per_token']:,}")
    return table
