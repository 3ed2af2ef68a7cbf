"""The dry-run plan as a table: per variant its parameters, MLP width, state knob, declared
budget per layer, cache and FLOPs, from train/experiment/plan.py's document.

    out.print(plan_table(plan_document(exp)))

A rich Table rather than a train/render/table.py TableSpec: the state cell is read as one
`knob=value (was X)` and must not wrap, which a TableSpec's text columns do.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

BUDGET_KEYS = ("mixing", "logits", "value_path", "inference", "total")  # per layer


def plan_table(doc: dict[str, Any]) -> Table:
    """One row per variant; the state knob and the cache against the first variant's are
    shown when match.state sized them."""
    state = doc["match"].get("state", False)
    table = Table(title=plan_title(doc),
                  caption="budget: declared rank caps per layer (a layer pattern: the largest "
                          "among its layers, each layer's in --format json); cache (elements per "
                          "sequence at seq_len) and FLOPs/token of the blocks, all layers"
                          + ("; state: the knob that sizes the cache, (was X): the config's "
                             "value, overridden by match.state; Δcache: vs the first variant"
                             if state else ""))
    cols = ("variant", "block", "params", "vs first", "d_mlp", *(("state",) if state else ()),
            *BUDGET_KEYS, "cache", *(("Δcache",) if state else ()), "FLOPs/token")
    for col in cols:
        table.add_column(col, justify="left" if col in ("variant", "block", "state")
                         else "right", no_wrap=col == "state")
    for r in doc["variants"]:
        b = r["budget_per_layer"]
        block = f"{r['block']}: {r['pattern']}" if "pattern" in r else r["block"]
        table.add_row(r["variant"], block, f"{r['params']:,}", f"{r['rel_diff']:+.1%}",
                      str(r["d_mlp"]), *((state_cell(r["state"]),) if state else ()),
                      *(str(b[k]) for k in BUDGET_KEYS), f"{r['cache_elements']:,}",
                      *((f"{r['cache_rel_diff']:+.1%}",) if state else ()),
                      f"{r['flops_per_token']:,}")
    return table


def plan_title(doc: dict[str, Any]) -> str:
    """`quick: 8 variants, d_model=64, n_layers=2, seq_len=32 (parameters matched within
    5%)`, with the data's intrinsic rank and the sweep where there are."""
    match = doc["match"]
    matched = [what for what, on in (("parameters", match["params"]),
                                     ("cache", match.get("state", False))) if on]
    matched = (f"{' and '.join(matched)} matched within {match['tolerance']:.0%}" if matched
               else "not matched")
    return (f"{doc['experiment']}: {len(doc['variants'])} variants, "
            f"d_model={doc['d_model']}, n_layers={doc['n_layers']}, "
            f"seq_len={doc['seq_len']} ({matched})"
            + (f"; data's intrinsic rank {doc['intrinsic_rank']}"
               if doc["intrinsic_rank"] is not None else "")
            + sweep_note(doc.get("sweep")))


def sweep_note(sweep: dict[str, Any] | None) -> str:
    """'; sweep: 24 runs, each variant at optimizer [adamw, muon] x lr [...] x seed [...]'."""
    if sweep is None:
        return ""
    axes = " x ".join(f"{a} {sweep[a]}" for a in ("optimizer", "lr", "seed")
                      if sweep.get(a) is not None)
    return f"; sweep: {sweep['runs']} runs, each variant at {axes}"


def state_cell(state: dict[str, Any] | None) -> str:
    """`window=16 (was 8)`: the knob's value used, and the one written where match.state
    overrode it; `default` for a knob left to the block."""
    if state is None:
        return "-"
    value = "default" if state["value"] is None else str(state["value"])
    cell = f"{state['knob']}={value}"
    if state["matched"] and state["written"] != state["value"]:
        written = "unset" if state["written"] is None else state["written"]
        cell += f" (was {written})"
    return cell
