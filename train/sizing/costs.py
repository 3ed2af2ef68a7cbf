"""What one block setting costs at a target: its declared budget per layer, and the
parameters, cache and FLOPs over all layers; the reference layer every setting is matched
to, and the MLP width that matches it. Read by pick and blocks.

    cost = block_cost("sliding_window", {"n_heads": 16, "window": 42}, d_model=1024,
                      seq_len=8192, n_layers=24, dtype_bytes=2)
    ref = reference_layer(1024, 16, 8192)          # MHA with a 4 x d_model MLP
    d_mlp, why = matched_width(cost, 1024, 24, ref, "sliding_window (MQA)")

Every figure comes from the block itself: it is built on the meta device (shapes, no
weights) and its `budget(seq_len)` gives the caps, the parameters, the cached elements and
the FLOPs per token; the layers and the dtype's bytes multiply them and nothing else. One
decode step is the cost of the seq_len-th token, T * flops(T) - (T - 1) * flops(T - 1)
from the budget's average FLOPs per token (exact up to the budget's integer rounding,
under T FLOPs). Parameters are matched the way `match: {params: true}` matches them
(train/sizing/match.py): the MLP width that gives a layer the parameters of a multi-head
softmax layer with a 4 x d_model MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import zoo
from budgets import RankBudget

from ..lm.decoder import Layer
from .match import default_d_mlp, match_d_mlp, mlp_floor

MLP_RATIO = 4.0  # the reference layer's MLP: 4 x d_model, as model.mlp_ratio's default
MATCH_TOLERANCE = 0.05
NORM = "rmsnorm"  # model.norm's default
# a budget's caps in the order `rankzoo blocks` lists them, in its document and its table
BUDGET_AXES = ("mixing", "logits", "value_path", "inference", "adapter")


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
    parameters within 5% (train/sizing/match.py match_d_mlp); (None, why) when none does."""
    return matched_base_width(n_layers * cost.layer_base, d_model, n_layers, ref_layer, label)


def matched_base_width(base: int, d_model: int, n_layers: int, ref_layer: int | None,
                       label: str) -> tuple[int | None, str | None]:
    """matched_width of layers whose parameters without their MLPs add up to `base` (a
    layer pattern's differ from layer to layer)."""
    if ref_layer is None:
        return None, "no reference: multi-head softmax attention cannot be built here"
    L = n_layers
    try:
        width = match_d_mlp(L * ref_layer, base, 2 * d_model * L,
                            MATCH_TOLERANCE, label, floor=mlp_floor(d_model),
                            ref_width=default_d_mlp(d_model, MLP_RATIO, None))
    except ValueError as e:
        return None, str(e)
    return width, None
