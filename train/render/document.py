"""The whole report, in the order a reader needs: the status of every variant first, then
the budget by part, the declared totals, the heads, the residual stream, the advice.

    out.print(render_table(report)); out.print(render_advice(report))
    Path("report.md").write_text(report_markdown(report))

The terminal shows the sections as rich renderables (every table fits 80 columns: names
fold, numbers never get cut); the Markdown document holds the same sections, whole. The
sections are the modules beside this one; a section a report does not have (a report
written before it existed) is left out.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from budgets.report.document import PARTS

from .advice import advice_markdown
from .answer import answer_markdown
from .evals import evals_spec
from .heads import heads_markdown, render_heads
from .hf import hf_markdown
from .kinds import variant_kinds_specs
from .parts import adapter_notes, budget_legend, parts_markdown, render_part
from .recall import recall_markdown, recall_view
from .residual import render_residual, residual_markdown
from .status import render_status, status_markdown
from .summary import summary_markdown
from .table import BOXED, to_rich
from .table import to_markdown as spec_markdown
from .totals import render_totals, totals_markdown


def render_table(report: dict) -> Group:
    """The report for people, in reading order: status, the budget by part, the legend,
    the totals, heads, residual stream. `console.print(render_table(report))`."""
    title = Text(f"rank budget: {report.get('experiment') or '(unnamed)'}", style="bold")
    parts: list = [title, render_status(report)]
    for part in PARTS:
        table = render_part(report, part)
        if table is not None:
            parts.append(table)
        if part == "adapter":
            parts += [Text(f"adapter: {line}") for line in adapter_notes(report)]
    parts.append(Text(budget_legend(report), style="dim"))
    parts.append(render_totals(report))
    parts += [to_rich(spec, **BOXED) for spec in variant_kinds_specs(report)]
    parts += [t for t in (render_heads(report), render_residual(report)) if t is not None]
    evals = evals_spec(report)
    if evals is not None:
        parts.append(to_rich(evals, **BOXED))
    spaced = [parts[0]]
    for p in parts[1:]:  # a blank line before every section (not inside the status block)
        spaced += [p] if p is parts[1] else [Text(""), p]
    return Group(*spaced)


def to_markdown(report: dict) -> str:
    """The report as a Markdown document: its sections, a blank line between them."""
    sections = [f"# Rank-budget report: {report.get('experiment') or '(unnamed)'}\n",
                answer_markdown(report), status_markdown(report), budget_legend(report) + ".\n",
                parts_markdown(report), totals_markdown(report), heads_markdown(report),
                residual_markdown(report), advice_markdown(report), evals_markdown(report)]
    return "\n".join(s for s in sections if s)


def evals_markdown(report: dict) -> str:
    spec = evals_spec(report)
    return "" if spec is None else spec_markdown(spec)


def report_markdown(report: dict) -> str:
    """report.md of a run: the report, the variant summary, and for MQAR runs the recall
    against the state each variant carries."""
    view = recall_view(report)
    tail = "" if view is None else "\n" + recall_markdown(view)
    return to_markdown(report) + "\n" + summary_markdown(report) + tail


def hf_report_markdown(report: dict) -> str:
    """The whole Markdown document of an HF report: the report, then the probe's section.
    Unlike report_markdown it has no variant summary (its training columns are all empty
    for a model that was only probed)."""
    return to_markdown(report) + "\n" + hf_markdown(report)
