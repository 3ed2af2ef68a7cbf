"""The variant summary of a run: one row per variant, its size, declared total, final
hidden-state erank and headline metrics (report.md's "Variants", the terminal's last
table before the sweep and recall).

    out.print(summary_table(report)); Path("report.md").write_text(summary_markdown(report))
"""

from __future__ import annotations

from rich.table import Table

from .table import BOXED, Column, TableSpec, fmt, to_markdown, to_rich

SUMMARY_METRICS = ("val/accuracy", "val/loss", "train/loss")
SUMMARY_COLUMNS = ("variant", "step", "params", "budget total", "final Hc", *SUMMARY_METRICS,
                   "tokens/s")


def _summary_cells(v: dict) -> list[str]:
    """variant, step, parameters, declared total, the final hidden states' centered erank
    (pooled over the probe batch), then the headline metrics and the training's tokens
    per second."""
    m = v.get("metrics", {})
    return [v["variant"], str(v["step"]), f"{v['params']:,}", str(v["budget_total"]),
            fmt(v.get("final_hidden_centered_erank"), ".2f"),
            *(fmt(m.get(k), ".4g") for k in SUMMARY_METRICS),
            fmt(m.get("tokens_per_second"), ",.0f")]


def summary_spec(report: dict) -> TableSpec:
    """One row per variant (see _summary_cells)."""
    return TableSpec(
        title=f"variants: {report.get('experiment') or '(unnamed)'}", heading="Variants",
        columns=(Column(SUMMARY_COLUMNS[0]),
                 *(Column(c, numeric=True, wrap=True) for c in SUMMARY_COLUMNS[1:])),
        rows=[_summary_cells(v) for v in report["variants"]],
        legend="final Hc: centered erank of the hidden states the output head reads, pooled "
               "over the probe batch; tokens/s: training tokens over the fit's wall time",
        markdown_legend="")


def summary_table(report: dict) -> Table:
    return to_rich(summary_spec(report), **BOXED)


def summary_markdown(report: dict) -> str:
    return to_markdown(summary_spec(report))
