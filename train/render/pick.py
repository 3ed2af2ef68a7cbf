"""`rankzoo pick` as tables: the candidates grouped by family, the families that do not
fit, and the knobs' legend (which `rankzoo blocks` shows too).

    for table in pick_tables(pick_document(c)): out.print(table)

The candidates' table is a rich Table rather than a train/render/table.py TableSpec: its
family and knob cells must not wrap while its figures may, which a TableSpec's columns do
the other way round. The other two are TableSpecs, boxed as the candidates' table is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from ..sizing.families import sizing_table
from ..sizing.units import format_bytes, format_count
from .table import BOXED, Column, TableSpec, columns, fmt, to_rich

LEFT = ("family", "candidate", "knob", "bound")  # the candidates' text columns


def pick_tables(doc: dict[str, Any]) -> list[Table]:
    """The candidates grouped by family (a section each), the families that do not fit,
    and the knobs' legend."""
    tables = [candidates_table(doc)]
    if doc["infeasible"]:
        tables.append(infeasible_table(doc["infeasible"]))
    shown = list(dict.fromkeys([r["family"] for r in doc["candidates"]]
                               + [k["block"] for r in doc["candidates"]
                                  for k in r.get("layers", ())]
                               + [r["family"] for r in doc["infeasible"]]))
    tables.append(legend_table(shown))
    return tables


def candidates_table(doc: dict[str, Any]) -> Table:
    """One row per candidate, its family named once, a section per family; with runs,
    what they measured."""
    c = doc["constraints"]
    runs = bool(doc["runs"])
    table = Table(title=pick_title(c), caption=pick_caption(doc))
    cols = ["family", "candidate", "knob", "bound", "p->f", "inference",
            f">={c['associations']}", "params", "d_mlp", "cache", "prefill", "decode"]
    if runs:
        cols += ["accuracy", "p->f real"]
    cols.append("*")
    for col in cols:
        table.add_column(col, justify="left" if col in LEFT else "right",
                         no_wrap=col in ("family", "knob", f">={c['associations']}"))
    group = None
    for row in doc["candidates"]:
        if group is not None and group_of(row) != group:
            table.add_section()
        first = group_of(row) != group
        group = group_of(row)
        table.add_row(*candidate_cells(row, first, runs))
    return table


def group_of(row: dict[str, Any]) -> str:
    """A section of the table: a family, or the hybrids of one ratio (`hybrid 5:1`)."""
    return f"{row['family']} {row['unit']['ratio']}" if "unit" in row else row["family"]


def candidate_cells(row: dict[str, Any], first: bool, runs: bool) -> list[str]:
    """A candidate's cells; its family only on the first row of the family. A hybrid is
    named by its pattern, its knob the cheap layers' one that was sized."""
    p, knob = row["params"], row["knob"]
    if "unit" in row:
        name, shown = row["pattern"], f"{knob['symbol']}={knob['value']}"
    else:
        name, shown = row["label"].removeprefix(row["family"]).strip(" ()"), knob["shown"]
    cells = [group_of(row) if first else "", name, shown,
             ", ".join(row["limited_by"]), str(row["carried"]), str(row["caps"]["inference"]),
             recall_cell(row), format_count(p["layers"]), fmt(p["d_mlp_matched"], ","),
             format_bytes(row["cache_bytes"]), format_count(row["flops"]["prefill_per_token"]),
             format_count(row["flops"]["decode_step"])]
    if runs:
        cells += evidence_cells(row)
    cells.append("*" if row["front"] else "")
    return cells


def pick_title(c: dict[str, Any]) -> str:
    """The sizes and every budget asked for."""
    limits = [f"{format_bytes(c['cache_budget_bytes'])} of {c['cache_dtype']} cache per "
              "sequence"]
    if c["params_budget"] is not None:
        limits.append(f"{format_count(c['params_budget'])} block parameters")
    if c["flops_budget"] is not None:
        limits.append(f"{format_count(c['flops_budget'])} FLOPs/token")
    return (f"rankzoo pick: d_model={c['d_model']}, n_heads={c['n_heads']}, "
            f"n_layers={c['n_layers']}, seq_len={c['seq_len']}, {', '.join(limits)}")


def pick_caption(doc: dict[str, Any]) -> str:
    """What each column of the candidates' table means."""
    c, ref, runs = doc["constraints"], doc["reference"], bool(doc["runs"])
    n = c["associations"]
    matched = ("MHA with a 4 x d_model MLP, "
               f"{format_count(ref['layer_params'] * c['n_layers'])} in its layers"
               if ref["layer_params"] is not None else "(no MHA reference at these widths)")
    return ("knob: sized to the largest value that fits; bound: what stops a larger one "
            "(range: the largest there is). p->f: the declared past->future rank a head "
            f"carries across the sequence at seq_len; >={n}: yes if it reaches the "
            f"{n} associations and the stack sees the whole sequence, else which falls "
            "short (a window's reach: layers x (W - 1) tokens). params: the layers' "
            "blocks and 4 x d_model MLPs "
            f"(embeddings left out); d_mlp: the MLP width that matches them to {matched}. "
            f"cache: bytes per sequence at seq_len, all layers, {c['cache_dtype']}. "
            "FLOPs of the blocks, all layers: prefill per token (averaged over seq_len) "
            "and one decode step (the seq_len-th token)."
            + (" measured: the runs' val/accuracy and realized past->future rank "
               "(utilization of its cap) at their probe length; @X: measured at another "
               "knob value." if runs else "")
            + " *: on the Pareto front of cache vs p->f"
            + (" vs measured accuracy." if runs else ".") + hybrids_caption(doc))


def hybrids_caption(doc: dict[str, Any]) -> str:
    """What the hybrid rows are, and how many of those that fit are shown."""
    h = doc.get("hybrids") or {}
    if h.get("keep", "none") == "none":
        return ""
    text = (" hybrid N:1: N cheap layers (knob sized to what the global ones leave), then "
            "one global, repeating; p->f: the largest over its layers; the front compares "
            "the layers' p->f one by one.")
    if not h["every"]:
        return text + (" No hybrid: no unit of 2, 4, 6 or 8 layers divides n_layers "
                       "(--global-every N sets one).")
    if not h["fit"]:
        return text + " No hybrid fits."
    if h["shown"] < h["fit"]:
        text += (f" Shown: the {h['shown']} of the {h['fit']} hybrids that fit that no other "
                 "hybrid outdoes (--hybrids all: every one).")
    return text


def recall_cell(row: dict[str, Any]) -> str:
    """yes; or why not: `reach 984` (the stack sees only that far back), `p->f 5` (the
    past->future cap is under the associations)."""
    if row["holds_associations"]:
        return "yes"
    if row["reach_tokens"] < row["seq_len"] - 1:
        return f"reach {row['reach_tokens']:,}"
    return f"p->f {row['carried']}"


def evidence_cells(row: dict[str, Any]) -> list[str]:
    """The best run's accuracy (`@k=2`: measured at another knob value) and realized
    past->future rank with its utilization; `-` without a run."""
    if not row["evidence"]:
        return ["-", "-"]
    e = row["evidence"][0]
    at = "" if e["exact"] else f" @{row['knob']['symbol']}={e['knob_value']}"
    real, util = e["realized"].get("mixing"), e["utilization"].get("mixing")
    rank = "-" if real is None else f"{real:.1f}" + ("" if util is None else f" ({util:.0%})")
    return [fmt(e.get("accuracy"), ".3f") + at, rank]


def infeasible_table(rows: list[dict[str, Any]]) -> Table:
    """Each family that does not fit at its smallest useful knob value, and why."""
    cells = []
    for row in rows:
        smallest = row["smallest"] or {"shown": "-", "cache_bytes": None}
        cells.append((row["label"], smallest["shown"], format_bytes(smallest["cache_bytes"]),
                      row["reason"].split(": ", 1)[1]))
    spec = TableSpec(
        columns=(Column("family"), Column("smallest"), Column("cache", numeric=True, wrap=True),
                 Column("over")),
        rows=cells, title="families that do not fit",
        legend="each at its smallest useful knob value (one that carries something across "
               "the sequence)")
    return to_rich(spec, **BOXED)


def legend_table(families: Sequence[str]) -> Table:
    """What each family's knob symbols mean, for the families given."""
    table = sizing_table()
    spec = TableSpec(columns=columns("family", "meaning"), title="knobs",
                     rows=[(name, table[name].legend) for name in families if name in table])
    return to_rich(spec, **BOXED)
