"""The per-kind section of a Hugging Face report: its layers grouped by kind (sliding
window W, global, NoPE, experts after them), realized against their kind's caps, beside
the zoo block that declares the same caps (budgets/report/kinds.py builds the rows).

    spec = kinds_spec(report)        # None for a report without kinds
"""

from __future__ import annotations

from .table import Column, TableSpec, fmt

KIND_QUANTITIES = (("past_future", "past->future"), ("qk", "qk"),
                   ("inference.k", "cache K"), ("inference.v", "cache V"))


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


def kinds_spec(report: dict) -> TableSpec | None:
    """Per kind: its layers, the zoo block with the same caps, realized / cap per row."""
    kinds = report.get("kinds")
    if not kinds:
        return None
    rows = [(k["kind"] + (" + MoE" if k["moe"] else ""), _ranges(k["layers"]), k["zoo_block"],
             *(_cell(k["rows"], q) for q, _ in KIND_QUANTITIES)) for k in kinds]
    return TableSpec(
        title="per kind of layer: realized rank_eps (mean) / cap",
        heading="Per kind of layer",
        columns=(Column("kind"), Column("layers"), Column("zoo block"),
                 *(Column(name, numeric=True) for _, name in KIND_QUANTITIES)),
        rows=rows,
        legend="cap = what the kind declares (a window's past->future cap is W - 1, as zoo's "
               "sliding_window block declares; a global layer's T / 2, as softmax's)")
