"""The report's advice and findings: what budgets concluded from the figures
(budgets/advice/annotate.py), each advised bound with the conditions it was checked under.

    out.print(render_advice(report)); Path("report.md").write_text(advice_markdown(report))

Lists, not tables: one item per suggestion (in the terminal a titled table of one column,
a no-advice item in yellow; in Markdown a bullet list). Findings (what the figures show
but advises nothing: no saving at this length, directions under-used by a run that did
not solve its task, growth within a block's own state) follow the advice. A KV item that
`rankzoo compress` measured ("measured", train/commands/check/measured.py) says the loss
change at its ratio and the verdict; the verdicts of a check experiment's run
("advice_checks", train/commands/check/outcome.py: a whole-model cheaper block, or a
hybrid with both variants' declared caches) come last.
"""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def conditions_text(item: dict) -> str:
    """'eps 0.1, probe 4 x T 128, checked on every sample and head: max observed 9'."""
    c = item.get("conditions")
    if not c:
        return ""
    probe = (f"probe {c.get('batch_size', '?')} x T {c.get('seq_len', '?')}"
             if c.get("batch_size") is not None or c.get("seq_len") is not None else "")
    checked = ("checked on every sample and head" if c.get("checked") else "NOT checked")
    if c.get("max_observed") is not None:
        checked += f": max observed {c['max_observed']:g}"
    return ", ".join(x for x in (f"eps {c['eps']:g}" if c.get("eps") is not None else "",
                                 probe, checked) if x)


def advice_text(item: dict) -> str:
    """An advice item for people: its text, with the conditions it rests on."""
    if item.get("kind") == "no_advice":  # its text may say so itself ("v: no advice: ...")
        if "advice" in item["text"]:
            return item["text"]
        who = f" for {item['variant']}" if item.get("variant") else ""
        return f"no advice{who}: {item['text']}"
    cond = conditions_text(item)
    eps = (item.get("conditions") or {}).get("eps")
    if eps is not None and f"eps {eps:g}" in item["text"]:
        cond = ""  # the text already states what it rests on
    text = item["text"] + (f" [{cond}]" if cond else "")
    return text + (f". {measured_text(item['measured'])}" if item.get("measured") else "")


def measured_text(m: dict) -> str:
    """What `rankzoo compress` measured at an item's advised ranks, at the ratio compress
    counts ('... +0.0123 nats per token at its ratio of 1.53x: verified (tolerance 0.02)')."""
    return (f"Measured by rankzoo compress with every advised layer compressed: "
            f"{m['delta_loss']:+.4f} nats per token at its ratio of {m['ratio']:.2f}x: "
            f"{m['verdict']} (tolerance {m['tolerance']:g})")


def check_style(item: dict) -> str:
    return {"verified": "green", "refuted": "red"}.get(item["verdict"], "yellow")


def render_advice(report: dict) -> Table | Group:
    """The suggestions, one per row, each with the conditions it was checked under; then
    the findings, if any."""
    table = Table(title="advice", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("advice", overflow="fold")
    for item in report.get("advice", []):
        table.add_row(Text(advice_text(item),
                           style="yellow" if item.get("kind") == "no_advice" else ""))
    if not report.get("advice"):
        table.add_row("no suggestions: every axis is used and no layer collapsed")
    parts = [table]
    if report.get("findings"):
        findings = Table(title="findings (no advice)", box=box.SIMPLE_HEAD, show_header=False)
        findings.add_column("finding", overflow="fold")
        for item in report["findings"]:
            findings.add_row(advice_text(item))
        parts.append(findings)
    if report.get("advice_checks"):
        checks = Table(title="advice checked by training", box=box.SIMPLE_HEAD,
                       show_header=False)
        checks.add_column("check", overflow="fold")
        for item in report["advice_checks"]:
            checks.add_row(Text(item["text"], style=check_style(item)))
        parts.append(checks)
    return parts[0] if len(parts) == 1 else Group(*parts)


def advice_markdown(report: dict) -> str:
    items = [f"- {advice_text(a)}" for a in report.get("advice", [])]
    lines = ["## Advice", "", *(items or ["- no suggestions"])]
    if report.get("findings"):
        lines += ["", "## Findings", "", *(f"- {advice_text(a)}" for a in report["findings"])]
    if report.get("advice_checks"):
        lines += ["", "## Advice checked by training", "",
                  *(f"- {a['text']}" for a in report["advice_checks"])]
    return "\n".join(lines) + "\n"
