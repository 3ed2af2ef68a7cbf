"""`rankzoo blocks` as tables: the presets by family, the presets that cannot be built and
why, the knobs' legend (train/render/pick.py's), the kernel backends.

    for table in blocks_tables(blocks_document(256, 8, 1024)): out.print(table)

The presets' table and the failures' are rich Tables rather than train/render/table.py
TableSpecs: their preset names must not wrap while their figures may, which a TableSpec's
columns do the other way round. The kernel backends are a TableSpec.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..sizing.costs import BUDGET_AXES
from ..sizing.units import format_bytes, format_count
from .pick import legend_table
from .table import BOXED, TableSpec, columns, fmt, to_rich

PRESET_COLUMNS = ("preset", "knobs", *BUDGET_AXES, "total", "params", "d_mlp", "cache",
                  "prefill", "decode")


def blocks_tables(doc: dict[str, Any]) -> list[Table]:
    """The presets by family (a section each), the presets that cannot be built and why,
    the knobs' legend, the kernel backends."""
    tables = [presets_table(doc)]
    failed = [row for row in doc["blocks"] if row.get("error")]
    if failed:  # why a preset is missing
        why = Table(title="presets that cannot be built at these sizes")
        why.add_column("preset", no_wrap=True)
        why.add_column("why")
        for row in failed:
            why.add_row(row["variant"], row["error"])
        tables.append(why)
    legend = legend_table(list(dict.fromkeys(r["family"] for r in doc["blocks"])))
    return [*tables, legend, backends_table(doc["backends"])]


def presets_table(doc: dict[str, Any]) -> Table:
    """One row per preset, a section per family (the preset names its block)."""
    ref = doc["reference"]
    matched = (f"an MHA layer with a {ref['d_mlp']}-wide MLP ({ref['layer_params']:,} "
               "parameters)" if ref["layer_params"] is not None else
               "(nothing: MHA cannot be built at these sizes)")
    table = Table(title=f"rankzoo blocks at d_model={doc['d_model']}, n_heads={doc['n_heads']}, "
                        f"seq_len={doc['seq_len']}",
                  caption="declared rank caps per layer (total = value_path + adapter + "
                          "inference); params: the block's own; d_mlp: the MLP width that "
                          f"gives its layer the parameters of {matched}; cache: bytes per "
                          f"sequence at seq_len, one layer, at {doc['cache_dtype']}; FLOPs of "
                          "one layer per token: averaged over seq_len (prefill) and the "
                          "seq_len-th token (decode); knobs: see the legend")
    for col in PRESET_COLUMNS:
        table.add_column(col, justify="left" if col in ("preset", "knobs") else "right",
                         no_wrap=col in ("preset", "knobs"))
    family = None
    for row in doc["blocks"]:
        if family is not None and row["family"] != family:
            table.add_section()
        family = row["family"]
        table.add_row(*preset_cells(row))
    return table


def preset_cells(row: dict[str, Any]) -> list[str]:
    """A preset's cells; `-` for every figure of one that cannot be built."""
    preset = row["variant"]
    if row.get("error"):
        return [preset, *("-" for _ in PRESET_COLUMNS[1:])]
    b = row["budget"]
    return [preset, row["knobs"], *(str(b[a]) for a in BUDGET_AXES), str(b["total"]),
            f"{row['params']:,}", fmt(row["d_mlp_matched"], ","),
            format_bytes(row["cache_bytes"]), format_count(row["flops_per_token"]),
            format_count(row["decode_flops"])]


def backends_table(backends: dict[str, dict[str, str | None]]) -> Table:
    """Each kernel op's backends, and why one is not available here."""
    rows = [(op, backend, "yes" if reason is None else f"no: {reason}")
            for op, by_backend in backends.items() for backend, reason in by_backend.items()]
    spec = TableSpec(columns=columns("op", "backend", "available"), rows=rows,
                     title="kernel backends on this machine")
    return to_rich(spec, **BOXED)
