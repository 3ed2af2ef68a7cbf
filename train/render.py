"""Reports for people: rich tables for the terminal, Markdown for report.md.

    out.print(render_table(report)); out.print(render_advice(report))
    Path("report.md").write_text(to_markdown(report))

Everything here reads a report built by budgets (build_report, build_hf_report) and
computes nothing new: the figures, verdicts and advice are the report's own. The columns
are explained in docs/METRICS.md.
"""

from __future__ import annotations

from dataclasses import asdict

from rich import box
from rich.table import Table

import budgets

COLUMNS = ("variant", "layer", "block", "axis", "quantity", "declared",
           "realized", "max", "util", "erank Pc/Hc", "verdict")
# narrower headers for the 80-column terminal table
TABLE_HEADERS = {"declared": "cap", "erank Pc/Hc": "Pc/Hc"}
SHORT_VERDICT = {"saturated": "sat", "healthy": "ok", "over-provisioned": "over"}
LEGEND = ("declared (cap) = structural upper bound; realized = rank_eps at eps = {eps}, mean "
          "over heads; max = max over heads; util = realized / declared; Pc/Hc = erank of "
          "the centered mixing matrix (collapsed, !: <= {collapsed:g}) / of the centered "
          "hidden states the layer's block reads (token collapse); verdict: saturated "
          "(sat: util >= {saturated:.0%}), over-provisioned (over: util < {over:.0%}), "
          "else healthy (ok)")


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _rows(report: dict):
    """The cells of the human-readable table, one row per (variant, layer, capped quantity)."""
    for v in report["variants"]:
        for layer in v["layers"]:
            for i, a in enumerate(layer["axes"]):
                util = "-" if a["utilization"] is None else f"{100 * a['utilization']:.0f}%"
                # The centered erank belongs to the layer: print it once, on its first row.
                erank = _eranks(layer) if i == 0 else ""
                yield (v["variant"], str(layer["layer"]), layer["block"], a["axis"],
                       a["quantity"], str(a["declared"]), _fmt(a["realized_mean"]),
                       _fmt(a["realized_max"]), util, erank, a.get("verdict") or "-")


def _eranks(layer: dict) -> str:
    """'3.5/21.4': the layer's centered mixing erank, then its hidden states' (if probed)."""
    erank = _fmt(layer["mixing_centered_erank"], ".2f" if layer.get(
        "hidden_centered_erank") is None else ".1f")
    if layer.get("hidden_centered_erank") is not None:
        erank += "/" + _fmt(layer["hidden_centered_erank"], ".1f")
    return erank + (" collapsed" if layer.get("collapsed") else "")


def _add_columns(table: Table) -> None:
    for col in COLUMNS:
        if col == "quantity":
            continue  # folded into "axis" (see render_table)
        col = TABLE_HEADERS.get(col, col)
        if col in ("variant", "block", "axis"):
            table.add_column(col, overflow="fold")  # names fold onto a second line ...
        else:  # ... so that numbers never get cut on a narrow terminal
            table.add_column(col, justify="right", min_width=len(col), no_wrap=True)


def _legend(report: dict) -> str:
    eps = ", ".join(str(e) for e in sorted({v["eps"] for v in report["variants"]}))
    th = report.get("thresholds") or asdict(budgets.VerdictThresholds())
    return LEGEND.format(eps=eps, collapsed=th["collapsed_erank"], saturated=th["saturated"],
                         over=th["over_provisioned"])


def render_table(report: dict) -> Table:
    """The report for people: one row per (variant, layer, capped quantity).

    Narrower than the Markdown so it fits 80 columns: the quantity column folds into the
    axis (only the inference axis has more than one quantity), and a variant, layer and
    block are named once, on their first row.
    """
    title = f"rank budget: {report.get('experiment') or '(unnamed)'}"
    table = Table(title=title, caption=_legend(report), box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    _add_columns(table)
    last = (None, None)
    for variant, layer, block, axis, quantity, *numbers in _rows(report):
        if last[0] is not None and variant != last[0]:
            table.add_section()
        shown = (variant if variant != last[0] else "",
                 *((layer, block) if (variant, layer) != last else ("", "")))
        axis = quantity if quantity.startswith("inference.") else axis
        *numbers, erank, verdict = numbers  # short forms: the table must fit 80 columns
        erank = erank.replace(" collapsed", " !")
        table.add_row(*shown, axis, *numbers, erank, SHORT_VERDICT.get(verdict, verdict))
        last = (variant, layer)
    return table


def render_advice(report: dict) -> Table:
    """The suggestions computed from the figures (budgets/verdicts.py), one per row."""
    table = Table(title="advice", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("advice", overflow="fold")
    for item in report.get("advice", []):
        table.add_row(item["text"])
    if not report.get("advice"):
        table.add_row("no suggestions: every axis is used and no layer collapsed")
    return table


def advice_markdown(report: dict) -> str:
    items = [f"- {a['text']}" for a in report.get("advice", [])]
    return "\n".join(["## Advice", "", *(items or ["- no suggestions"])]) + "\n"


def to_markdown(report: dict) -> str:
    lines = [f"# Rank-budget report: {report.get('experiment') or '(unnamed)'}", "",
             _legend(report) + ".", "",
             "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    return "\n".join(lines) + "\n\n" + advice_markdown(report)


# ---------------------------------------------------------------- Hugging Face reports

def _head_mean(xs) -> float | None:
    """The mean over heads; None where the matrix-free mode measured no head (erank is
    given only where the top singular values hold the whole spectrum)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


HF_COLUMNS = ("layer", "hidden erank Hc", "mixing erank P", "erank Pc", "past->future erank")


def _hf_rows(report: dict):
    for layer in report["variants"][0]["layers"]:
        e = layer["erank"]
        yield (str(layer["layer"]), _fmt(layer["hidden_centered_erank"], ".2f"),
               _fmt(_head_mean(e["mixing"]), ".2f"), _fmt(_head_mean(e["mixing_centered"]), ".2f"),
               _fmt(_head_mean(e["past_future"]), ".2f"))


def render_hf_table(report: dict) -> Table:
    """Per layer: erank of the centered hidden states, and raw/centered mixing eranks."""
    v, src = report["variants"][0], report["source"]
    table = Table(title=f"{v['variant']}: effective ranks per layer (means over heads)",
                  caption=f"probe: {src['probe_size']} x {src['seq_len']} tokens of "
                          f"{src['text']} ({src['tokens']}); next-token loss "
                          f"{v['metrics']['probe/loss']:.3f}; Hc = hidden states the "
                          f"attention reads, centered over tokens; Pc = centered attention",
                  box=box.SIMPLE_HEAD)
    for col in HF_COLUMNS:
        table.add_column(col, justify="right")
    for row in _hf_rows(report):
        table.add_row(*row)
    return table


def hf_markdown(report: dict) -> str:
    lines = ["## Effective ranks per layer (means over heads)", "",
             "| " + " | ".join(HF_COLUMNS) + " |", "|" + "|".join("---" for _ in HF_COLUMNS) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _hf_rows(report)]
    return "\n".join(lines) + "\n"
