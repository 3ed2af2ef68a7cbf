"""`rankzoo blocks`: the zoo's presets side by side, grouped by family and ordered by cache.

    doc = blocks_document(d_model=256, n_heads=8, seq_len=1024, cache_dtype="bf16")
    for table in blocks_tables(doc): console.print(table)     # train/render/blocks.py

Each preset (a block class's `variants`) is built on the meta device and read through its
`budget(seq_len)`: the declared caps, its parameters raw and matched (the MLP width that
gives its layer the parameters of a multi-head softmax layer with a 4 x d_model MLP, as
`match: {params: true}` would size it), the cache in bytes per sequence at a stated dtype,
and the FLOPs of one token, averaged over seq_len (prefill) and the seq_len-th (decode).
The knobs a preset sets are spelled out per family (`K=16, F=153`) and explained in the
legend. A preset that cannot be built at the sizes asked gets a row saying why. The cost
figures are train/sizing/costs.py's and the knobs' meaning is the sizing each family
declares (zoo/facts.py, read through train/sizing/families.py), which `rankzoo pick`
reads too to size the same knobs to a budget.
"""

from __future__ import annotations

from typing import Any

import zoo

from ..sizing.costs import BUDGET_AXES, MLP_RATIO, block_cost, matched_width, reference_layer
from ..sizing.families import describe
from ..sizing.match import default_d_mlp
from ..sizing.units import DTYPE_BYTES, dtype_name
from .pick.front import family_order

__all__ = ["BUDGET_AXES", "block_row", "blocks_document"]


def blocks_document(d_model: int, n_heads: int, seq_len: int,
                    cache_dtype: str = "bf16") -> dict[str, Any]:
    """Every block's presets at these sizes, grouped by family (families by their smallest
    cache, presets by cache); a preset that cannot be built there gets a row with its
    reason under "error" (and null figures) instead of failing the listing."""
    if d_model % n_heads:  # the sizes themselves are wrong, not one preset
        raise ValueError(f"--n-heads {n_heads} must divide --d-model {d_model}: the blocks "
                         "split d_model into heads")
    dtype = dtype_name(cache_dtype)
    try:
        ref_layer = reference_layer(d_model, n_heads, seq_len)
    except ValueError:  # e.g. RoPE with an odd head_dim: the rows say so, matching is off
        ref_layer = None
    rows = []
    for name in zoo.names():
        cls = zoo.block_class(name)
        presets = cls.variants(d_model, n_heads) if hasattr(cls, "variants") else [(name, {})]
        for label, kwargs in presets:
            rows.append(block_row(name, label, {"d_model": d_model, "n_heads": n_heads,
                                                **kwargs}, seq_len, dtype, ref_layer))
    if all(row.get("error") for row in rows):
        raise ValueError(f"no block can be built at d_model={d_model}, n_heads={n_heads}: "
                         f"e.g. {rows[0]['variant']!r}: {rows[0]['error']}")
    order = family_order([(r["family"], r["cache_bytes"]) for r in rows])
    rows.sort(key=lambda r: (order[r["family"]], r["cache_bytes"] is None,
                             r["cache_bytes"] or 0))  # stable: a family's presets in order
    return {"d_model": d_model, "n_heads": n_heads, "seq_len": seq_len, "cache_dtype": dtype,
            "dtype_bytes": DTYPE_BYTES[dtype],
            "reference": {"block": "softmax", "label": "MHA",
                          "d_mlp": default_d_mlp(d_model, MLP_RATIO, None),
                          "layer_params": ref_layer},
            "blocks": rows, "backends": zoo.backends_available()}


def block_row(name: str, label: str, kwargs: dict, seq_len: int, dtype: str = "bf16",
              ref_layer: int | None = None) -> dict:
    """One preset's row: its declared budget and costs (one layer), or why it cannot be
    built."""
    row = {"block": name, "family": name, "variant": label, "kwargs": kwargs}
    built = {k: v for k, v in kwargs.items() if k != "d_model"}
    try:
        cost = block_cost(name, built, kwargs["d_model"], seq_len, n_layers=1,
                          dtype_bytes=DTYPE_BYTES[dtype])
    except (ValueError, TypeError) as e:
        return {**row, "knobs": None, "budget": None, "params": None, "d_mlp_matched": None,
                "layer_params_matched": None, "cache_elements": None, "cache_bytes": None,
                "flops_per_token": None, "decode_flops": None, "error": str(e)}
    budget = cost.budget
    width, why = matched_width(cost, kwargs["d_model"], 1, ref_layer, label)
    return {**row, "knobs": describe(name, cost.config),
            "budget": {**{axis: getattr(budget, axis) for axis in BUDGET_AXES},
                       "total": budget.total},
            "params": cost.block_params,
            "d_mlp_matched": width,
            "layer_params_matched": (None if width is None else
                                     cost.layer_base + 2 * kwargs["d_model"] * width),
            **({"unmatched": why} if why else {}),
            "cache_elements": budget.cache_elements, "cache_bytes": cost.cache_bytes,
            "flops_per_token": budget.flops_per_token, "decode_flops": cost.decode_flops}
