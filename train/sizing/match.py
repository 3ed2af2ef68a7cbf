"""Matching variants: MLP widths that equal the reference's parameters (match.params), and
state knobs that equal its cache (match.state). Read by config loading, the dry-run plan,
preflight, pick and blocks.

    matched_widths(exp_raw, {"mha": ("softmax", {...}), "mqa": ("softmax", {...})}, 0.05)
    matched_states(variants, d_model=64, n_layers=2, seq_len=32, tolerance=0.05)

Models and blocks are built on the meta device: shapes, parameter counts and declared
budgets without allocating or initializing weights, so matching stays instant at any model
size.

Matching order (both relative to the first variant, the reference):
  1. state (match.state): each variant's state knob (state_knob) is set to the value whose
     cached elements per sequence at seq_len come nearest the reference's. The matched
     value overrides one written in the variant: with match.state on, equal cache is the
     comparison asked for, and a pinned knob would silently break it. The dry-run table
     shows the value that was written beside the one used.
  2. params (match.params): then each MLP width is sized so total parameters match. A
     variant's parameters are linear in its MLP width, at `mlp_matrices` d_model x d_mlp
     matrices per layer: two for GELU, three for SwiGLU (gate, up, down), so a SwiGLU
     variant matched to a GELU reference gets about 2/3 of its width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

import zoo
from zoo.facts import Values

from ..lm.decoder import DecoderLM, mlp_matrices, mlp_width


def count_params(vocab_size: int, d_model: int, n_layers: int, block: str | None,
                 block_kwargs: dict[str, Any] | None, d_mlp: int, seq_len: int, norm: str,
                 tie_embeddings: bool, layers: list[tuple[str, dict]] | None = None,
                 mlp: str = "gelu") -> int:
    """The parameters of a DecoderLM of these sizes, embeddings included (meta device):
    one block in every layer, or `layers`, one (block, kwargs) per layer (a hybrid); its
    MLPs of kind `mlp` (model.mlp)."""
    with torch.device("meta"):
        model = DecoderLM(vocab_size, d_model, n_layers, block, block_kwargs, d_mlp=d_mlp,
                          max_len=seq_len, norm=norm, tie_embeddings=tie_embeddings,
                          layers=layers, mlp=mlp)
    return model.param_count()


def default_d_mlp(d_model: int, mlp_ratio: float, d_mlp: int | None, mlp: str = "gelu") -> int:
    """The MLP width DecoderLM uses when the config does not match it (SwiGLU: 2/3 of
    GELU's at the same ratio, train/lm/decoder.py mlp_width)."""
    return mlp_width(d_model, mlp_ratio, d_mlp, mlp)


# A matched MLP narrower than this share of d_model is an error, not a width: at d_mlp = 1
# the MLP is effectively removed, and a comparison of "matched" variants would then be
# one of blocks with and without an MLP.
MLP_FLOOR_RATIO = 0.25


def mlp_floor(d_model: int) -> int:
    return max(1, round(MLP_FLOOR_RATIO * d_model))


def match_d_mlp(target: int, base: int, per_unit: int, tolerance: float, variant: str,
                floor: int = 1, ref_width: int | None = None,
                ref_per_unit: int | None = None) -> int:
    """The MLP width that brings `base + per_unit * d_mlp` parameters closest to `target`.

    The MLP's parameters are exactly linear in its width (two bias-free projections per
    layer, three for SwiGLU: `per_unit` counts them), so one division solves it. A width
    below `floor` is an error naming the reference width (`ref_width`) that would lift it
    to the floor; a target missed by more than `tolerance` names the counts.
    `ref_per_unit`: the reference's parameters per unit of its width, where its MLP kind
    differs (GELU against a SwiGLU variant).
    """
    d_mlp = round((target - base) / per_unit)
    if d_mlp < floor:
        # a unit of the reference's width moves this variant's by this much
        step = (ref_per_unit or per_unit) / per_unit
        raise ValueError(below_floor(target, base, tolerance, variant, d_mlp, floor, ref_width,
                                     step))
    total = base + per_unit * d_mlp
    if abs(total - target) > tolerance * target:
        raise ValueError(
            f"match.params: variant {variant!r} cannot be matched to {target:,} parameters "
            f"within {tolerance:.1%}: without its MLP it already has {base:,}, and the "
            f"narrowest MLP (d_mlp={floor}) gives {base + per_unit * floor:,}; at "
            f"d_mlp={d_mlp} it has {total:,}")
    return d_mlp


def below_floor(target: int, base: int, tolerance: float, variant: str, d_mlp: int,
                floor: int, ref_width: int | None, step: float = 1.0) -> str:
    """The error of a matched width under the floor, with the nearest feasible setting:
    every matched width moves with the reference's, `step` units per unit of it (one for
    one between MLPs of one kind), so raising that by (floor - d_mlp) / step lifts this
    variant to the floor."""
    fix = ("match.params: false" if ref_width is None else
           f"model.d_mlp={ref_width + math.ceil((floor - d_mlp) / step)} (the reference's "
           f"MLP width, now "
           f"{ref_width}; every matched width moves with it), or match.params: false")
    return (f"match.params: variant {variant!r} cannot be matched to {target:,} parameters "
            f"within {tolerance:.1%} with an MLP of at least d_mlp={floor} (the floor, "
            f"{MLP_FLOOR_RATIO:g} x d_model): without its MLP it already has {base:,}, so "
            f"matching would give it d_mlp={d_mlp}; nearest feasible setting: {fix}")


def _spec_args(spec: tuple[str, dict] | list[tuple[str, dict]]) -> dict[str, Any]:
    """count_params' block arguments of a variant: (block, kwargs), or a list of one
    (block, kwargs) per layer for a hybrid."""
    if isinstance(spec, list):
        return {"block": None, "block_kwargs": None, "layers": spec}
    return {"block": spec[0], "block_kwargs": spec[1]}


def matched_widths(exp_raw: dict[str, Any],
                   variants: dict[str, tuple[str, dict] | list[tuple[str, dict]]],
                   tolerance: float, mlps: dict[str, str] | None = None) -> dict[str, int]:
    """d_mlp per variant so that every total is within `tolerance` of the first variant's;
    a variant is (block, kwargs), or for a hybrid one (block, kwargs) per layer.

    `exp_raw` holds vocab_size, d_model, n_layers, mlp_ratio, d_mlp, seq_len, norm,
    tie_embeddings and optionally mlp (the MLP kind, "gelu" when absent); `mlps` a
    variant's own MLP kind where it differs. The first variant (the reference) keeps the
    configured width, which under SwiGLU mlp_ratio sizes at 2/3 (mlp_width).
    """
    e = exp_raw
    common = dict(vocab_size=e["vocab_size"], d_model=e["d_model"], n_layers=e["n_layers"],
                  seq_len=e["seq_len"], norm=e["norm"], tie_embeddings=e["tie_embeddings"])
    widths, target = {}, None
    for name, spec in variants.items():
        mlp = (mlps or {}).get(name, e.get("mlp", "gelu"))
        # the MLP's matrices (2 or 3) of d_model x d_mlp, every layer
        per_unit = mlp_matrices(mlp) * e["d_model"] * e["n_layers"]
        base = count_params(**_spec_args(spec), d_mlp=1, mlp=mlp, **common) - per_unit
        if target is None:
            ref_width = default_d_mlp(e["d_model"], e["mlp_ratio"], e["d_mlp"], mlp)
            target, widths[name], ref_unit = base + per_unit * ref_width, ref_width, per_unit
            continue
        widths[name] = match_d_mlp(target, base, per_unit, tolerance, name,
                                   floor=mlp_floor(e["d_model"]), ref_width=ref_width,
                                   ref_per_unit=ref_unit)
    return widths


def state_knob(block: str) -> tuple[str, Values]:
    """The config knob that sizes `block`'s cached state, and the values to try, ascending
    (the block's own sizing, zoo/facts.py). Cache size never decreases along them, which
    is what lets nearest_state() stop early. Values the block's config rejects (e.g. an
    odd MoE head_dim under RoPE, kv_lora_rank > d_model) are skipped."""
    return zoo.facts_of(block).sizing.state_knob


def cache_elements(block: str, kwargs: dict[str, Any], d_model: int, seq_len: int) -> int:
    """Cached elements per sequence at seq_len of one layer of `block`."""
    with torch.device("meta"):
        return zoo.build(block, d_model=d_model, **kwargs).budget(seq_len).cache_elements


def nearest_state(variant: str, block: str, kwargs: dict[str, Any], target: int,
                  d_model: int, n_layers: int, seq_len: int,
                  tolerance: float) -> tuple[int, int]:
    """(knob value, cache elements per sequence, all layers) nearest `target`; raises naming
    the nearest achievable count when it is not within `tolerance` of the target."""
    knob, candidates = state_knob(block)
    values = candidates(kwargs, d_model, seq_len)  # a range or a list: indexable

    def cache_at(i: int) -> int:
        """Cache of all layers at values[i]; a ValueError when the block rejects it."""
        return n_layers * cache_elements(block, {**kwargs, knob: values[i]}, d_model, seq_len)

    best = nearest_cache(len(values), cache_at, target)  # (distance, index, cache)
    best = None if best is None else (best[0], values[best[1]], best[2])
    if best is None or best[0] > tolerance * target:
        nearest = "none" if best is None else f"{best[2]:,} at {knob}={best[1]}"
        raise ValueError(
            f"match.state: variant {variant!r} ({block}) cannot be matched to the reference's "
            f"{target:,} cached elements per sequence within {tolerance:.1%} by its {knob}; "
            f"nearest achievable: {nearest}")
    return best[1], best[2]


Measured = TypeVar("Measured")  # what a knob value costs: cached elements, or pick's Cost


def accepted(cache_at: Callable[[int], Measured],
             indices: Iterable[int]) -> tuple[int, Measured] | None:
    """(index, cache) of the first index the block accepts, in the order given."""
    for i in indices:
        try:
            return i, cache_at(i)
        except ValueError:
            continue  # a value the block's config rejects
    return None


def nearest_cache(n: int, cache_at: Callable[[int], int],
                  target: int) -> tuple[int, int, int] | None:
    """(distance, index, cache) of the index in range(n) whose cache is nearest `target`,
    the earliest of equals; None when the block accepts none. Caches never decrease with
    the index, so two bisections find it in O(log n) builds: the knob may range over
    seq_len or 4 x d_model values, and a scan of them all would not come back."""
    def first_reaching(level: int, hi: int) -> int:  # first index below hi with cache >= level
        lo = 0
        while lo < hi:
            found = accepted(cache_at, range((lo + hi) // 2, hi))
            if found is None or found[1] >= level:
                hi = (lo + hi) // 2
            else:
                lo = found[0] + 1
        return lo

    above = accepted(cache_at, range(first_reaching(target, n), n))
    below = accepted(cache_at, range(first_reaching(target, n) - 1, -1, -1))
    if below is not None:  # the earliest index with that same cache
        below = accepted(cache_at, range(first_reaching(below[1], below[0] + 1), n))
    found = [(abs(c - target), i, c) for i, c in (x for x in (below, above) if x is not None)]
    return min(found, key=lambda f: (f[0], f[1])) if found else None


def matched_states(variants: dict[str, tuple[str, dict]], d_model: int, n_layers: int,
                   seq_len: int, tolerance: float) -> dict[str, dict[str, int]]:
    """{variant: {knob: value}} so every variant's cache per sequence at seq_len (summed
    over layers) is within `tolerance` of the first variant's. The reference keeps its own
    configuration (it sets the target) and gets no entry."""
    (_, (ref_block, ref_kwargs)), *rest = variants.items()
    target = n_layers * cache_elements(ref_block, ref_kwargs, d_model, seq_len)
    out = {}
    for name, (block, kwargs) in rest:
        value, _ = nearest_state(name, block, kwargs, target, d_model, n_layers, seq_len,
                                 tolerance)
        out[name] = {state_knob(block)[0]: value}
    return out


