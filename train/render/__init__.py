"""Reports for people: rich renderables for the terminal, Markdown for report.md.

    out.print(render_table(report)); out.print(render_advice(report))
    Path("report.md").write_text(to_markdown(report))

Everything here reads a report built by budgets (build_report, build_hf_report) and
computes nothing new: the figures, verdicts, head classes and advice are the report's own.
One module per section, each describing its table once (train/render/table.py) for both
media: train/render/status.py, train/render/parts.py (the budget by part: pretrain, adapter,
inference), train/render/totals.py, train/render/heads.py, train/render/residual.py,
train/render/advice.py, train/render/hf.py (a Hugging Face model, probed as loaded); the
whole document in reading order is train/render/document.py. Beside the report:
train/render/summary.py (the variants of a run), train/render/sweep.py, train/render/recall.py
and the figures, train/render/plots.py. Reports written before a section existed render
without it. The columns are explained in docs/METRICS.md.
"""

from __future__ import annotations

from budgets.report.document import PART_OF_AXIS, PARTS

from .advice import advice_markdown, advice_text, conditions_text, render_advice
from .document import hf_report_markdown, render_table, report_markdown, to_markdown
from .heads import HEAD_CLASSES, head_legend, heads_markdown, render_heads
from .hf import HF_COLUMNS, hf_markdown, probe_source_text, render_hf_table
from .parts import (
    LEGEND,
    PART_TITLES,
    SHORT_VERDICT,
    adapter_notes,
    budget_legend,
    part_of,
    parts_markdown,
    render_part,
)
from .residual import RESIDUAL_LEGEND, massive_text, render_residual, residual_markdown
from .status import render_status, status_markdown, status_text
from .table import COMPACT
from .totals import TOTALS_LEGEND, budget_totals, render_totals, totals_markdown

__all__ = [
    "COMPACT", "HEAD_CLASSES", "HF_COLUMNS", "LEGEND", "PARTS", "PART_OF_AXIS", "PART_TITLES",
    "RESIDUAL_LEGEND", "SHORT_VERDICT", "TOTALS_LEGEND", "adapter_notes", "advice_markdown",
    "advice_text", "budget_legend", "budget_totals", "conditions_text", "head_legend",
    "heads_markdown", "hf_markdown", "hf_report_markdown", "massive_text", "part_of",
    "parts_markdown", "probe_source_text", "render_advice", "render_heads", "render_hf_table",
    "render_part", "render_residual", "render_status", "render_table", "render_totals",
    "report_markdown", "residual_markdown", "status_markdown", "status_text", "to_markdown",
    "totals_markdown",
]
