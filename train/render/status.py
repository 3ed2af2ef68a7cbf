"""The report's status section, read first: how each variant's run ended and whether it
learned, against its task's baseline (a run that stopped, diverged or did not learn is
read differently).

    out.print(render_status(report)); Path("report.md").write_text(status_markdown(report))

A list, not a table: one line per variant, its name then what happened (in the terminal a
grid, the line coloured by how the run ended; in Markdown a bullet list).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from .hf import is_hf, probe_source_text


def _baseline(b: dict | None) -> str:
    """'chance accuracy 0.016' or 'entropy floor 1.234, unigram loss 2.345'."""
    b = b or {}
    parts = [f"{label} {b[key]:.3g}" for key, label in (
        ("chance_accuracy", "chance accuracy"), ("entropy_floor", "entropy floor"),
        ("unigram_loss", "unigram loss")) if b.get(key) is not None]
    return ", ".join(parts)


def _state(s: dict) -> str:
    step, n = s.get("step"), s.get("max_steps")
    if s.get("state") == "diverged":
        return f"diverged at step {step}" + (f" (of {n})" if n is not None else "")
    # finished, stopped, or a state this reader does not know: said as is
    return f"{s.get('state')} at step {step}" + (f" of {n}" if n is not None else "")


def status_text(variant: dict, report: dict | None = None) -> str:
    """One line: how the variant's run ended and whether it learned, against its baseline
    (an HF report's model was not trained: its probe instead)."""
    s = variant.get("status")
    if s is None and report is not None and is_hf(report):
        return f"pretrained model, probed as loaded (no training run); {probe_source_text(report)}"
    if s is None:
        return (f"step {variant['step']}; run status not recorded (a report written before "
                "run statuses)")
    line, reason, base = _state(s), s.get("reason"), _baseline(s.get("baseline"))
    learned = s.get("learned")
    if learned is False:
        line += "; did not learn" + (f": {reason}" if reason else "")
    elif learned is True:
        line += "; learned" + (f" ({reason})" if reason else "")
    elif reason:
        line += f"; {reason}"
    return line + (f" [baseline: {base}]" if base else "")


def _status_style(variant: dict) -> str:
    s = variant.get("status") or {}
    if s.get("state") == "diverged":
        return "bold red"
    return "yellow" if s.get("state") == "stopped" or s.get("learned") is False else ""


def status_lines(report: dict) -> list[tuple[str, str, str]]:
    """(variant, status line, terminal style) per variant, in the report's order."""
    return [(v["variant"], status_text(v, report), _status_style(v))
            for v in report["variants"]]


def render_status(report: dict) -> Table:
    """Status first: one line per variant."""
    table = Table.grid(padding=(0, 1))
    table.add_column("variant", style="bold", overflow="fold")
    table.add_column("status", overflow="fold")
    for variant, line, style in status_lines(report):
        table.add_row(variant + ":", Text(line, style=style))
    return table


def status_markdown(report: dict) -> str:
    lines = [f"- **{variant}**: {line}" for variant, line, _ in status_lines(report)]
    return "\n".join(["## Status", "", *lines]) + "\n"
