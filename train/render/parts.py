"""The report's budget by part: one table per part (pretrain, adapter, inference), one row
per capped quantity of each layer, its cap beside the rank it realized, and the verdict.

    for part in PARTS: out.print(render_part(report, part))
    Path("report.md").write_text(parts_markdown(report))

The terminal tables fit 80 columns: a variant, layer and block are named once, on their
first row; the quantity folds into the axis (inference: the state's name, adapter: the
module's); verdicts and the collapsed mark are shortened. Markdown keeps every cell whole.
"""

from __future__ import annotations

from dataclasses import asdict

from rich.table import Table

from budgets.advice.rows import row_text
from budgets.advice.verdicts import VerdictThresholds
from budgets.report.document import PART_OF_AXIS, PARTS

from .table import Column, TableSpec, fmt, to_markdown, to_rich

PART_TITLES = {"pretrain": "pretrain: mixing, logits, value path, out = W_O",
               "adapter": "adapter: low-rank updates attached after pretraining (LoRA)",
               "inference": "inference: caches and states"}
SHORT_VERDICT = {"saturated": "sat", "healthy": "ok", "over-provisioned": "over"}
LEGEND = ("declared (cap) = structural upper bound; realized (mean) = rank_eps at eps = "
          "{eps}, mean over heads (each head: mean over the probe's samples); max = max "
          "over heads; max sample (smp) = max over samples and heads; util = realized / "
          "declared; "
          "Pc/Hc = erank of the centered mixing matrix (collapsed, !: <= {collapsed:g}; "
          "n/a: no head holds enough centered energy, *: mean over the heads that do) / of "
          "the centered normed input the layer's block reads (token collapse); verdict: "
          "saturated (sat: util >= {saturated:.0%}), over-provisioned (over: util < "
          "{over:.0%}), else healthy (ok)")


def part_of(row: dict) -> str:
    """The budget part of an axis row: its own "part", else the part of its axis (a report
    written before rows carried their part)."""
    if row.get("part") is not None:
        return row["part"]
    if row["axis"] not in PART_OF_AXIS:
        raise ValueError(f"axis row {row.get('quantity')!r}: unknown axis {row['axis']!r}; "
                         f"expected one of {sorted(PART_OF_AXIS)}")
    return PART_OF_AXIS[row["axis"]]


def _eranks(layer: dict) -> str:
    """'3.5/21.4': the layer's centered mixing erank, then its normed input's (if probed);
    'n/a' where no head holds enough centered energy, '*' where only some do."""
    hc = layer.get("input_centered_erank", layer.get("hidden_centered_erank"))
    pc = layer.get("mixing_centered_erank")
    ok = (layer.get("heads") or {}).get("centered_ok")
    if pc is None and (layer.get("centered_na") or (ok is not None and not any(ok))):
        erank = "n/a"
    else:
        erank = fmt(pc, ".2f" if hc is None else ".1f")
        if ok is not None and not all(ok) and pc is not None:
            erank += "*"
    if hc is not None:
        erank += "/" + fmt(hc, ".1f")
    return erank + (" collapsed" if layer.get("collapsed") else "")


def _rows(report: dict, part: str):
    """One row per (variant, layer, capped quantity) of the part, in the report's order:
    variant, layer, block, axis, quantity, declared, realized mean, max, max sample, util,
    erank Pc/Hc (pretrain only), verdict."""
    for v in report["variants"]:
        for layer in v["layers"]:
            axes = [a for a in layer["axes"] if part_of(a) == part]
            for i, a in enumerate(axes):
                util = "-" if a["utilization"] is None else f"{100 * a['utilization']:.0f}%"
                # The centered erank belongs to the layer: print it once, on its first row.
                erank = [_eranks(layer) if i == 0 else ""] if part == "pretrain" else []
                yield (v["variant"], row_text(layer), layer["block"], a["axis"],
                       a["quantity"], str(a["declared"]), fmt(a["realized_mean"]),
                       fmt(a["realized_max"]), fmt(a.get("realized_max_sample"), ".0f"),
                       util, *erank, a.get("verdict") or "-")


def _name_columns(part: str) -> tuple[Column, ...]:
    """axis and quantity; the terminal shows one of them: the axis of a pretrain row, the
    state's or module's name (the quantity, its prefix dropped) of the other parts."""
    if part == "pretrain":
        return Column("axis"), Column("quantity", terminal=False)
    prefix = f"{part}."
    return (Column("axis", terminal=False),
            Column("quantity", "state" if part == "inference" else part,
                   terse=lambda q: q.removeprefix(prefix)))


def part_spec(report: dict, part: str) -> TableSpec | None:
    """The part's table (None: no variant has rows of it); one section per variant."""
    rows = list(_rows(report, part))
    if not rows:
        return None
    erank = (Column("erank Pc/Hc", "Pc/Hc", numeric=True,
                    terse=lambda e: e.replace(" collapsed", " !")),)
    return TableSpec(
        title=PART_TITLES[part], heading="",  # parts_markdown heads the section itself
        columns=(Column("variant"), Column("layer", numeric=True), Column("block"),
                 *_name_columns(part), Column("declared", "cap", numeric=True),
                 Column("realized", "mean", numeric=True), Column("max", numeric=True),
                 Column("max sample", "smp", numeric=True), Column("util", numeric=True),
                 *(erank if part == "pretrain" else ()),
                 Column("verdict", numeric=True, terse=lambda v: SHORT_VERDICT.get(v, v))),
        rows=rows, grouped=3, sections=True, grouped_in_markdown=False)


def render_part(report: dict, part: str) -> Table | None:
    spec = part_spec(report, part)
    return None if spec is None else to_rich(spec)


def budget_legend(report: dict) -> str:
    """The columns of the part tables explained, with the report's eps and thresholds."""
    eps = ", ".join(str(e) for e in sorted({v["eps"] for v in report["variants"]}))
    th = report.get("thresholds") or asdict(VerdictThresholds())
    return LEGEND.format(eps=eps, collapsed=th["collapsed_erank"], saturated=th["saturated"],
                         over=th["over_provisioned"])


def _adapter_note(v: dict) -> str | None:
    """What the adapter part says when the variant has no adapter rows (or what a LoRA of
    the configured r would add)."""
    has_rows = any(part_of(a) == "adapter" for ly in v["layers"] for a in ly["axes"])
    if v.get("adapter_note"):
        return v["adapter_note"]
    return None if has_rows else "none attached"


def adapter_notes(report: dict) -> list[str]:
    """'none attached (every variant)' or one line per note with the variants it holds
    for: the adapter part is shown even when it is empty."""
    by_note: dict[str, list[str]] = {}
    for v in report["variants"]:
        if (note := _adapter_note(v)) is not None:
            by_note.setdefault(note, []).append(v["variant"])
    n = len(report["variants"])
    return [f"{note} ({'every variant' if len(names) == n > 1 else ', '.join(names)})"
            for note, names in by_note.items()]


def parts_markdown(report: dict) -> str:
    """A section per part, in the order of PARTS: its heading, the adapter notes (adapter),
    the table, or '- no rows' (a part other than the adapter, which its notes explain)."""
    lines = []
    for part in PARTS:
        lines += [f"## {PART_TITLES[part][0].upper()}{PART_TITLES[part][1:]}", ""]
        if part == "adapter":
            lines += [f"- {line}" for line in adapter_notes(report)] + [""]
        spec = part_spec(report, part)
        if spec is not None:
            lines += [to_markdown(spec)]
        elif part != "adapter":
            lines += ["- no rows", ""]
    return "\n".join(lines)
