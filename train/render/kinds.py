"""The per-kind table: layers grouped by kind, realized against their kind's caps, beside
the zoo block that declares the same caps (budgets/report/kinds.py builds the rows). One
renderer for both sources: a Hugging Face report (sliding window W, global, NoPE, SSD
state N, experts after them) and a hybrid run's variant (its pattern's sub-blocks).

    spec = kinds_spec(report)              # an HF report's; None for a report without kinds
    spec = variant_kinds_spec(variant)     # a hybrid variant's; None for a uniform one
"""

from __future__ import annotations

from .table import Column, TableSpec, fmt

KIND_QUANTITIES = (("past_future", "past->future"), ("qk", "qk"),
                   ("inference.k", "cache K"), ("inference.v", "cache V"),
                   ("inference.state", "state"), ("inference.latent", "latent"))
LEGEND = ("cap = what the kind declares (a window's past->future cap is W - 1, as zoo's "
          "sliding_window block declares; a global layer's T / 2, as softmax's; chunks of C "
          "what of one chunk crosses T / 2, 0 at a chunk boundary; an SSM's state N)")


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _cell(rows: dict, quantity: str) -> str:
    row = rows.get(quantity)
    if row is None:
        return "-"
    return f"{fmt(row['realized_mean'], '.1f')} / {row['declared']}"


def _spec(kinds: list[dict], title: str, heading: str, legend: bool = True) -> TableSpec:
    """Per kind: its layers, the zoo block with the same caps, realized / cap per row;
    the columns no kind has are left out."""
    shown = [(q, name) for q, name in KIND_QUANTITIES if any(q in k["rows"] for k in kinds)]
    rows = [(k["kind"] + (" + MoE" if k["moe"] else ""), _ranges(k["layers"]),
             k["zoo_block"] or "-", *(_cell(k["rows"], q) for q, _ in shown)) for k in kinds]
    return TableSpec(
        title=title, heading=heading,
        columns=(Column("kind"), Column("layers"), Column("zoo block"),
                 *(Column(name, numeric=True) for _, name in shown)),
        rows=rows, legend=LEGEND if legend else "")


def kinds_spec(report: dict) -> TableSpec | None:
    """An HF report's per-kind table."""
    kinds = report.get("kinds")
    if not kinds:
        return None
    return _spec(kinds, "per kind of layer: realized rank_eps (mean) / cap", "Per kind of layer")


def variant_kinds_spec(variant: dict, legend: bool = True) -> TableSpec | None:
    """A hybrid variant's per-kind table (its pattern's sub-blocks); `legend`: False for
    all but the last of several tables, which says it once for all."""
    kinds = variant.get("kinds")
    if not kinds:
        return None
    name = variant["variant"]
    return _spec(kinds, f"{name}: per kind of layer, realized rank_eps (mean) / cap",
                 f"{name}: per kind of layer", legend)


def variant_kinds_specs(report: dict) -> list[TableSpec]:
    """The per-kind table of each hybrid variant of a report, the legend under the last."""
    hybrids = [v for v in report["variants"] if v.get("kinds")]
    return [variant_kinds_spec(v, legend=v is hybrids[-1]) for v in hybrids]
