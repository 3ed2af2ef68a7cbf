"""The report's declared totals: the caps of each part summed per layer and per model.

    out.print(render_totals(report)); Path("report.md").write_text(totals_markdown(report))
"""

from __future__ import annotations

from rich.table import Table

from budgets.advice.rows import mixer_of, row_text
from budgets.report.document import PART_OF_AXIS, PARTS

from .table import Column, TableSpec, to_markdown, to_rich

TOTALS_LEGEND = ("declared caps summed: per layer (pretrain + adapter + inference of one "
                 "layer) and per model (model total, sum over layers)")


def budget_totals(variant: dict) -> tuple[list[dict], dict]:
    """(per layer [{layer, pretrain, adapter, inference, total}], per model {...}): the
    report's variant["budget"], or, in a report written before it, the caps of the layer
    rows (one cap per axis, each adapter its own) with the model total = budget_total."""
    if variant.get("budget"):
        return variant["budget"]["per_layer"], variant["budget"]["model"]
    per_layer = []
    for layer in variant["layers"]:
        caps: dict[str, int] = {}
        for a in layer["axes"]:
            if a["axis"] == "adapter":  # each LoRA pair is capped by its own r
                caps["adapter"] = caps.get("adapter", 0) + a["declared"]
            elif a["axis"] != "out":  # W_O's cap is reported, not part of RankBudget.total
                caps[a["axis"]] = max(caps.get(a["axis"], 0), a["declared"])
        row = {p: sum(c for axis, c in caps.items() if PART_OF_AXIS[axis] == p) for p in PARTS}
        per_layer.append({"layer": layer["layer"], **mixer_of(layer), **row,
                          "total": sum(row.values())})
    model = {p: sum(r[p] for r in per_layer) for p in PARTS}
    return per_layer, {**model, "total": variant["budget_total"]}


def _layer_runs(per_layer: list[dict]):
    """Consecutive layers with the same caps, as ('0-29', row): a uniform stack is one line.
    One of several mixers in a layer is a line of its own ('0 self_attn')."""
    runs: list[tuple[list, dict]] = []
    for r in per_layer:
        key = {p: r[p] for p in (*PARTS, "total")}
        alone = "mixer" in r or (runs and "mixer" in runs[-1][0][-1])
        if runs and not alone and runs[-1][1] == key and \
                runs[-1][0][-1]["layer"] + 1 == r["layer"]:
            runs[-1][0].append(r)
        else:
            runs.append(([r], key))
    for rows, key in runs:
        first, last = row_text(rows[0]), rows[-1]["layer"]
        yield (first if len(rows) == 1 else f"{first}-{last}"), key


def _total_rows(report: dict):
    """(variant, layers, pretrain, adapter, inference, total, is_model_row)."""
    for v in report["variants"]:
        per_layer, model = budget_totals(v)
        for name, key in _layer_runs(per_layer):
            each = "each of " if "-" in name else ""
            yield (v["variant"], f"{each}{name}", *(str(key[p]) for p in (*PARTS, "total")),
                   False)
        yield (v["variant"], "model total, sum over layers",
               *(str(model.get(p, "-")) for p in (*PARTS, "total")), True)


def totals_spec(report: dict) -> TableSpec:
    """Per variant: a row per run of identical layers, then the model's row in bold."""
    rows = list(_total_rows(report))
    return TableSpec(
        title="declared caps: per layer and per model",
        heading="Declared caps: per layer and per model",
        columns=(Column("variant"), Column("layers"),
                 *(Column(c, numeric=True) for c in (*PARTS, "total"))),
        rows=[r[:-1] for r in rows], legend=TOTALS_LEGEND, grouped=1, sections=True,
        bold=[i for i, r in enumerate(rows) if r[-1]], grouped_in_markdown=False)


def render_totals(report: dict) -> Table:
    return to_rich(totals_spec(report))


def totals_markdown(report: dict) -> str:
    return to_markdown(totals_spec(report))
