"""Parameter and state matching, and the dry-run table: what each variant costs, before
any training.

Models and blocks are built on the meta device: shapes, parameter counts and declared
budgets without allocating or initializing weights, so sizing and planning stay instant at
any model size.

Matching order (both relative to the first variant, the reference):
  1. state (match.state): each variant's state knob (STATE_KNOBS) is set to the value whose
     cached elements per sequence at seq_len come nearest the reference's. The matched
     value overrides one written in the variant: with match.state on, equal cache is the
     comparison asked for, and a pinned knob would silently break it. The dry-run table
     shows the value that was written beside the one used.
  2. params (match.params): then each MLP width is sized so total parameters match.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from rich.table import Table

import zoo

from ..lm.decoder import DecoderLM


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


# A matched MLP narrower than this share of d_model is an error, not a width: at d_mlp = 1
# the MLP is effectively removed, and a comparison of "matched" variants would then be
# one of blocks with and without an MLP.
MLP_FLOOR_RATIO = 0.25


def mlp_floor(d_model: int) -> int:
    return max(1, round(MLP_FLOOR_RATIO * d_model))


def match_d_mlp(target: int, base: int, per_unit: int, tolerance: float, variant: str,
                floor: int = 1, ref_width: int | None = None) -> int:
    """The MLP width that brings `base + per_unit * d_mlp` parameters closest to `target`.

    The MLP's parameters are exactly linear in its width (two bias-free projections per
    layer), so one division solves it. A width below `floor` is an error naming the
    reference width (`ref_width`) that would lift it to the floor; a target missed by more
    than `tolerance` names the counts.
    """
    d_mlp = round((target - base) / per_unit)
    if d_mlp < floor:
        raise ValueError(below_floor(target, base, tolerance, variant, d_mlp, floor, ref_width))
    total = base + per_unit * d_mlp
    if abs(total - target) > tolerance * target:
        raise ValueError(
            f"match.params: variant {variant!r} cannot be matched to {target:,} parameters "
            f"within {tolerance:.1%}: without its MLP it already has {base:,}, and the "
            f"narrowest MLP (d_mlp={floor}) gives {base + per_unit * floor:,}; at "
            f"d_mlp={d_mlp} it has {total:,}")
    return d_mlp


def below_floor(target: int, base: int, tolerance: float, variant: str, d_mlp: int,
                floor: int, ref_width: int | None) -> str:
    """The error of a matched width under the floor, with the nearest feasible setting:
    every matched width moves one for one with the reference's, so raising that by
    (floor - d_mlp) lifts this variant to the floor."""
    fix = ("match.params: false" if ref_width is None else
           f"model.d_mlp={ref_width + floor - d_mlp} (the reference's MLP width, now "
           f"{ref_width}; every matched width moves with it), or match.params: false")
    return (f"match.params: variant {variant!r} cannot be matched to {target:,} parameters "
            f"within {tolerance:.1%} with an MLP of at least d_mlp={floor} (the floor, "
            f"{MLP_FLOOR_RATIO:g} x d_model): without its MLP it already has {base:,}, so "
            f"matching would give it d_mlp={d_mlp}; nearest feasible setting: {fix}")


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
        widths[name] = match_d_mlp(target, base, per_unit, tolerance, name,
                                   floor=mlp_floor(e["d_model"]), ref_width=ref_width)
    return widths


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt n): n_heads may be as large as d_model."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# Per block: the config knob that sizes its cached state, and the values to try, ascending,
# as a function of (block kwargs, d_model, seq_len). Cache size never decreases along the
# list, which is what lets nearest_state() stop early. Values the block's config rejects
# (e.g. an odd MoE head_dim under RoPE, kv_lora_rank > d_model) are skipped.
STATE_KNOBS: dict[str, tuple[str, Callable[[dict, int, int], Iterable[int]]]] = {
    "softmax": ("n_kv_heads", lambda kw, D, T: _divisors(kw["n_heads"])),  # G: whole groups
    "sliding_window": ("window", lambda kw, D, T: range(1, T + 1)),  # W > T caches no more
    "linear": ("feature_dim", lambda kw, D, T: range(1, 4 * D + 1)),
    "ssm": ("d_state", lambda kw, D, T: range(1, 4 * D + 1)),
    "mla": ("kv_lora_rank", lambda kw, D, T: range(1, D + 1)),  # R <= d_model
    "moe": ("head_dim", lambda kw, D, T: range(1, 4 * D + 1)),  # K = V of every expert head
}


def cache_elements(block: str, kwargs: dict[str, Any], d_model: int, seq_len: int) -> int:
    """Cached elements per sequence at seq_len of one layer of `block`."""
    with torch.device("meta"):
        return zoo.build(block, d_model=d_model, **kwargs).budget(seq_len).cache_elements


def nearest_state(variant: str, block: str, kwargs: dict[str, Any], target: int,
                  d_model: int, n_layers: int, seq_len: int,
                  tolerance: float) -> tuple[int, int]:
    """(knob value, cache elements per sequence, all layers) nearest `target`; raises naming
    the nearest achievable count when it is not within `tolerance` of the target."""
    if block not in STATE_KNOBS:
        raise ValueError(f"match.state: variant {variant!r} ({block}) cannot be state-matched: "
                         f"no state knob is known for it (known: {sorted(STATE_KNOBS)})")
    knob, candidates = STATE_KNOBS[block]
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


def accepted(cache_at: Callable[[int], int], indices: Iterable[int]) -> tuple[int, int] | None:
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
        out[name] = {STATE_KNOBS[block][0]: value}
    return out


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


def _sweep_note(sweep: dict[str, Any] | None) -> str:
    """'; sweep: 24 runs, each variant at optimizer [adamw, muon] x lr [...] x seed [...]'."""
    if sweep is None:
        return ""
    axes = " x ".join(f"{a} {sweep[a]}" for a in ("optimizer", "lr", "seed")
                      if sweep.get(a) is not None)
    return f"; sweep: {sweep['runs']} runs, each variant at {axes}"


def _state_row(exp, variant: str, used: dict[str, Any]) -> dict[str, Any] | None:
    """The variant's state knob: the value used and the one written in the config (None
    when unset there, i.e. the block's default); None for a block with no known knob."""
    v = exp.variants[variant]
    if v.block not in STATE_KNOBS:
        return None
    knob = STATE_KNOBS[v.block][0]
    return {"knob": knob, "value": used.get(knob), "written": v.block_kwargs.get(knob),
            "matched": knob in exp.state.get(variant, {})}


def _state_cell(state: dict[str, Any] | None) -> str:
    if state is None:
        return "-"
    def shown(value):
        return "default" if value is None else str(value)

    cell = f"{state['knob']}={shown(state['value'])}"
    if state["matched"] and state["written"] != state["value"]:
        written = "unset" if state["written"] is None else state["written"]
        cell += f" (was {written})"  # overridden by match.state
    return cell


def plan_table(doc: dict[str, Any]) -> Table:
    match = doc["match"]
    matched = [what for what, on in (("parameters", match["params"]),
                                     ("cache", match.get("state", False))) if on]
    matched = (f"{' and '.join(matched)} matched within {match['tolerance']:.0%}" if matched
               else "not matched")
    table = Table(title=f"{doc['experiment']}: {len(doc['variants'])} variants, "
                        f"d_model={doc['d_model']}, n_layers={doc['n_layers']}, "
                        f"seq_len={doc['seq_len']} ({matched})"
                        + (f"; data's intrinsic rank {doc['intrinsic_rank']}"
                           if doc["intrinsic_rank"] is not None else "")
                        + _sweep_note(doc.get("sweep")),
                  caption="budget: declared rank caps per layer; cache (elements per sequence at "
                          "seq_len) and FLOPs/token of the blocks, all layers"
                          + ("; state: the knob that sizes the cache, (was X): the config's "
                             "value, overridden by match.state; Δcache: vs the first variant"
                             if match.get("state") else ""))
    # the state knob, and the cache against the first variant's, when match.state sized them
    state = match.get("state", False)
    cols = ("variant", "block", "params", "vs first", "d_mlp", *(("state",) if state else ()),
            "mixing", "logits", "value_path", "inference", "total", "cache",
            *(("Δcache",) if state else ()), "FLOPs/token")
    for col in cols:
        # the state cell is read as one "knob=value (was X)", so it does not wrap
        table.add_column(col, justify="left" if col in ("variant", "block", "state")
                         else "right", no_wrap=col == "state")
    for r in doc["variants"]:
        b = r["budget_per_layer"]
        table.add_row(r["variant"], r["block"], f"{r['params']:,}", f"{r['rel_diff']:+.1%}",
                      str(r["d_mlp"]), *((_state_cell(r["state"]),) if state else ()),
                      *(str(b[k]) for k in ("mixing", "logits", "value_path", "inference",
                                            "total")),
                      f"{r['cache_elements']:,}",
                      *((f"{r['cache_rel_diff']:+.1%}",) if state else ()),
                      f"{r['flops_per_token']:,}")
    return table
