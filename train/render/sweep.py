"""The sweep table: per variant and optimizer, the best learning rate on the selection
metric (mean over seeds), its score beside every other lr's, and the ranks it realized.

    out.print(sweep_table(summary)); Path("report.md").write_text(sweep_markdown(summary))

`summary` is the sweep's summary document (train/experiment/sweep.py, `summarize`). The
terminal shows the spread over seeds and only the rank columns some group measured; the
Markdown keeps its fixed columns (mixing, value_path, inference).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .table import BOXED, Column, TableSpec, fmt, to_markdown, to_rich

RANK_COLUMNS = ("mixing", "value_path", "inference", "adapter")
MARKDOWN_RANKS = RANK_COLUMNS[:3]


def _lr_cell(lrs: list[dict], best: float | None) -> str:
    """'0.001 2.31 · 0.003 2.05* · 0.01 failed': the score at each lr, the winner starred."""
    cells = []
    for entry in lrs:
        score = "failed" if entry["mean"] is None else f"{entry['mean']:.4g}"
        cells.append(f"{entry['lr']:g} {score}{'*' if entry['lr'] == best else ''}")
    return " · ".join(cells)


def _row(g: dict, select: str) -> list[str]:
    best, realized, metrics = g["best_lr"], g.get("realized", {}), g.get("metrics", {})
    return [g["variant"], g["optimizer"], fmt(best, "g"), fmt(best, ".3g"),
            fmt(metrics.get(select), ".3g"), fmt(g.get("std"), ".3g"),
            fmt(metrics.get("val/accuracy"), ".3g"),
            *(fmt(realized.get(axis), ".3g") for axis in RANK_COLUMNS),
            fmt(realized.get("mixing_centered_erank"), ".3g"), _lr_cell(g["lrs"], best)]


def sweep_spec(summary: dict[str, Any]) -> TableSpec:
    """One row per variant and optimizer: the best lr, its scores and realized ranks."""
    select = summary["select"]
    measured = {a for g in summary["groups"] for a in g.get("realized", {})}

    def number(name: str, header: str | None = None, **shown) -> Column:
        return Column(name, header, numeric=True, wrap=True, **shown)

    return TableSpec(
        title=f"sweep: best lr per variant and optimizer on {select} "
              f"({'lower' if summary['mode'] == 'min' else 'higher'} is better, "
              "mean over seeds)",
        heading=f"Sweep: best lr per variant and optimizer on {select}",
        # the best lr: whole in the terminal, to 3 digits in report.md (as it always was)
        columns=(Column("variant"), Column("optimizer"), number("best lr", markdown=False),
                 number("best lr", terminal=False), number(select, "score"),
                 number("± std", markdown=False), number("val/accuracy"),
                 *(number(a, terminal=a in measured, markdown=a in MARKDOWN_RANKS)
                   for a in RANK_COLUMNS),
                 number("erank Pc"), Column("score by lr")),
        rows=[_row(g, select) for g in summary["groups"]],
        legend="ranks: realized rank_eps per axis and centered mixing erank (erank Pc), mean "
               "over layers and over the best lr's seeds; failed: a seed diverged or left "
               "no result", markdown_legend="")


def sweep_table(summary: dict[str, Any]) -> Table:
    return to_rich(sweep_spec(summary), **BOXED)


def sweep_markdown(summary: dict[str, Any]) -> str:
    """The sweep table as Markdown, for report.md."""
    return to_markdown(sweep_spec(summary))
