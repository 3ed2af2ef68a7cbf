"""The report's heads section: per layer, how many heads fall in each class, and why.

    out.print(render_heads(report)); Path("report.md").write_text(heads_markdown(report))

The classes and the rules that assign them are budgets/advice/head_classes.py's; the report carries
each head's class and the rules in words (`head_rules`), and this section only counts.
"""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from budgets.advice.head_classes import HEAD_CLASSES as RULE_ORDER
from budgets.advice.rows import row_text

from .table import Column, TableSpec, to_markdown, to_rich

# budgets' classes in the order a reader scans them: the heads that do nothing (dead)
# first, then the rule order (sink, local, rank-1, broad)
HEAD_CLASSES = ("dead", *(c for c in RULE_ORDER if c != "dead"))


def class_counts(heads: dict) -> Counter:
    """How many heads of the layer's `heads` findings fall in each class."""
    return Counter(c for c in heads.get("class") or [] if c is not None)


def head_legend(report: dict) -> str:
    rules = report.get("head_rules")
    return ("head classes: " + rules if rules else
            "head classes: the rules were not recorded in this report")


def _heads_note(layer: dict) -> str:
    """The layer's head summary, then where its centered metrics do not apply."""
    heads = layer.get("heads") or {}
    note = heads.get("summary") or ""
    if layer.get("centered_na"):
        note += ("; " if note else "") + f"centered n/a: {layer['centered_na']}"
    return note


def _head_rows(report: dict):
    for v in report["variants"]:
        for layer in v["layers"]:
            if layer.get("heads"):
                counts = class_counts(layer["heads"])
                yield (v["variant"], row_text(layer),
                       *(str(counts.get(c, 0)) for c in HEAD_CLASSES), _heads_note(layer))


def heads_spec(report: dict) -> TableSpec | None:
    """One row per layer with head findings (None: a report written before them)."""
    rows = list(_head_rows(report))
    if not rows:
        return None
    return TableSpec(
        title="heads per layer: class counts and summary", heading="Heads",
        columns=(Column("variant"), Column("layer", numeric=True),
                 *(Column(c, numeric=True) for c in HEAD_CLASSES), Column("summary")),
        rows=rows, legend=head_legend(report), grouped=1, grouped_in_markdown=False)


def render_heads(report: dict) -> Table | None:
    spec = heads_spec(report)
    return None if spec is None else to_rich(spec)


def heads_markdown(report: dict) -> str:
    spec = heads_spec(report)
    return "" if spec is None else to_markdown(spec)
