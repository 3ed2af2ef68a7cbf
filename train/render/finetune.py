"""The LoRA stage's summary table (finetune.json): r against the adapter rank realized.

    out.print(finetune_table(summary))   # summary: train/experiment/finetune.py summarize()
"""

from __future__ import annotations

from rich.table import Table

from .table import BOXED, Column, TableSpec, fmt, to_rich

NUMBERS = ("r", "modules", "numerical rank", "max", "erank", "rank_eps", "zero-shot acc",
           "val/accuracy", "val/loss")


def finetune_spec(summary: dict) -> TableSpec:
    """One row per (base variant, r); ranks are means over the adapted modules."""
    rows = []
    for variant, runs in summary["variants"].items():
        for row in runs:
            m = row["metrics"]
            rows.append((variant, str(row["r"]), str(row["adapted"]),
                         fmt(row["numerical_rank_mean"], ".3g"),
                         fmt(row["numerical_rank_max"], "g"),
                         fmt(row["erank_mean"], ".3g"), fmt(row["rank_eps_mean"], ".3g"),
                         fmt(row["zero_shot"].get("val/accuracy"), ".3g"),
                         fmt(m.get("val/accuracy"), ".3g"), fmt(m.get("val/loss"), ".3g")))
    return TableSpec(
        title=f"LoRA fine-tunes: {summary['experiment']} (adapter rank: mean over adapted "
              f"modules; rank_eps at eps {summary['eps']:g})",
        columns=(Column("variant"), *(Column(n, numeric=True, wrap=True) for n in NUMBERS)),
        rows=rows)


def finetune_table(summary: dict) -> Table:
    return to_rich(finetune_spec(summary), **BOXED)
