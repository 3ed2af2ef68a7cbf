"""Reports for people: rich renderables for the terminal, Markdown for report.md.

    out.print(render_table(report)); out.print(render_advice(report))
    Path("report.md").write_text(to_markdown(report))

Everything here reads a report built by budgets (build_report, build_hf_report) and
computes nothing new: the figures, verdicts, head classes and advice are the report's own.
The order is the order a reader needs: the status of every variant first (a run that
stopped, diverged or did not learn is read differently), then the budget by part
(pretrain: mixing, logits, value path, out = W_O; adapter; inference), the declared totals
per layer and per model, the heads, the residual stream, the advice with its conditions.
Reports written before a section existed render without it (each key read here is
optional unless build_report always wrote it). The columns are explained in
docs/METRICS.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

import budgets

PARTS = ("pretrain", "adapter", "inference")
# The part of the budget each report axis belongs to, for reports written before rows
# carried their "part" ("out", W_O's structural cap, is a report row axis only).
PART_OF_AXIS = {"mixing": "pretrain", "logits": "pretrain", "value_path": "pretrain",
                "out": "pretrain", "adapter": "adapter", "inference": "inference"}
PART_TITLES = {"pretrain": "pretrain: mixing, logits, value path, out = W_O",
               "adapter": "adapter: low-rank updates attached after pretraining (LoRA)",
               "inference": "inference: caches and states"}
HEAD_CLASSES = ("dead", "sink", "local", "rank-1", "broad")

COLUMNS = ("variant", "layer", "block", "axis", "quantity", "declared",
           "realized", "max", "max sample", "util", "erank Pc/Hc", "verdict")
# narrower headers for the 80-column terminal table
TABLE_HEADERS = {"declared": "cap", "realized": "mean", "max sample": "smp",
                 "erank Pc/Hc": "Pc/Hc"}
# narrow tables: one space between columns (the box's divider), title and caption left
COMPACT = {"box": box.SIMPLE_HEAD, "pad_edge": False, "padding": 0,
           "title_justify": "left", "caption_justify": "left"}
NAME_HEADERS = {("inference", "axis"): "state", ("adapter", "axis"): "adapter"}
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
TOTALS_LEGEND = ("declared caps summed: per layer (pretrain + adapter + inference of one "
                 "layer) and per model (model total, sum over layers)")
RESIDUAL_LEGEND = ("resid Hc = centered erank of the residual stream entering the layer "
                   "(before its pre-norm), input Hc = of the normed input the block reads, "
                   "both pooled over the probe batch; massive = tokens whose norm exceeds "
                   "{ratio} the layer's median token norm (position: ratio to the median)")


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def part_of(row: dict) -> str:
    """The budget part of an axis row: its own "part", else the part of its axis."""
    if row.get("part") is not None:
        return row["part"]
    if row["axis"] not in PART_OF_AXIS:
        raise ValueError(f"axis row {row.get('quantity')!r}: unknown axis {row['axis']!r}; "
                         f"expected one of {sorted(PART_OF_AXIS)}")
    return PART_OF_AXIS[row["axis"]]


def _is_hf(report: dict) -> bool:
    return "source" in report  # build_hf_report: a pretrained model, probed as loaded


# ---------------------------------------------------------------- status

def _baseline(b: dict | None) -> str:
    """'chance accuracy 0.016' or 'entropy floor 1.234, unigram loss 2.345'."""
    b = b or {}
    parts = [f"{label} {b[key]:.3g}" for key, label in (
        ("chance_accuracy", "chance accuracy"), ("entropy_floor", "entropy floor"),
        ("unigram_loss", "unigram loss")) if b.get(key) is not None]
    return ", ".join(parts)


def _state(s: dict) -> str:
    step, n = s.get("step"), s.get("max_steps")
    of = f" of {n}" if n is not None else ""
    state = s.get("state")
    if state == "diverged":
        return f"diverged at step {step}" + (f" (of {n})" if n is not None else "")
    if state in ("finished", "stopped"):
        return f"{state} at step {step}{of}"
    return f"{state} at step {step}{of}"  # a state this reader does not know: said as is


def status_text(variant: dict, report: dict | None = None) -> str:
    """One line: how the variant's run ended and whether it learned, against its baseline
    (an HF report's model was not trained: its probe instead)."""
    s = variant.get("status")
    if s is None and report is not None and _is_hf(report):
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


def render_status(report: dict) -> Table:
    """Status first: one line per variant."""
    table = Table.grid(padding=(0, 1))
    table.add_column("variant", style="bold", overflow="fold")
    table.add_column("status", overflow="fold")
    for v in report["variants"]:
        table.add_row(v["variant"] + ":", Text(status_text(v, report),
                                               style=_status_style(v)))
    return table


def status_markdown(report: dict) -> str:
    lines = [f"- **{v['variant']}**: {status_text(v, report)}"
             for v in report["variants"]]
    return "\n".join(["## Status", "", *lines]) + "\n"


# ---------------------------------------------------------------- axis rows by part

def _eranks(layer: dict) -> str:
    """'3.5/21.4': the layer's centered mixing erank, then its normed input's (if probed);
    'n/a' where no head holds enough centered energy, '*' where only some do."""
    hc = layer.get("input_centered_erank", layer.get("hidden_centered_erank"))
    pc = layer.get("mixing_centered_erank")
    ok = (layer.get("heads") or {}).get("centered_ok")
    if pc is None and (layer.get("centered_na") or (ok is not None and not any(ok))):
        erank = "n/a"
    else:
        erank = _fmt(pc, ".2f" if hc is None else ".1f")
        if ok is not None and not all(ok) and pc is not None:
            erank += "*"
    if hc is not None:
        erank += "/" + _fmt(hc, ".1f")
    return erank + (" collapsed" if layer.get("collapsed") else "")


def _rows(report: dict, part: str | None = None):
    """The cells of the human-readable tables, one row per (variant, layer, capped
    quantity) of the given part (all parts: None), in the order of PARTS."""
    for v in report["variants"]:
        for layer in v["layers"]:
            axes = [a for a in layer["axes"] if part in (None, part_of(a))]
            axes.sort(key=lambda a: PARTS.index(part_of(a)))  # stable: the report's order
            for i, a in enumerate(axes):
                util = "-" if a["utilization"] is None else f"{100 * a['utilization']:.0f}%"
                # The centered erank belongs to the layer: print it once, on its pretrain row.
                erank = _eranks(layer) if i == 0 and part_of(a) == "pretrain" else ""
                yield (v["variant"], str(layer["layer"]), layer["block"], a["axis"],
                       a["quantity"], str(a["declared"]), _fmt(a["realized_mean"]),
                       _fmt(a["realized_max"]), _fmt(a.get("realized_max_sample"), ".0f"),
                       util, erank, a.get("verdict") or "-")


def _legend(report: dict) -> str:
    eps = ", ".join(str(e) for e in sorted({v["eps"] for v in report["variants"]}))
    th = report.get("thresholds") or asdict(budgets.VerdictThresholds())
    return LEGEND.format(eps=eps, collapsed=th["collapsed_erank"], saturated=th["saturated"],
                         over=th["over_provisioned"])


def _part_table(report: dict, part: str) -> Table | None:
    """The rows of one part, one section per variant; a variant, layer and block are named
    once, on their first row. Narrower than the Markdown so it fits 80 columns: the
    quantity folds into the axis (inference: the state's name, adapter: the module's),
    Pc/Hc only for pretrain."""
    rows = list(_rows(report, part))
    if not rows:
        return None
    table = Table(title=PART_TITLES[part], **COMPACT)
    for col in COLUMNS:
        if col == "quantity" or (col == "erank Pc/Hc" and part != "pretrain"):
            continue
        col = TABLE_HEADERS.get(col, col)
        if col in ("variant", "block", "axis"):  # names fold onto a second line ...
            table.add_column(NAME_HEADERS.get((part, col), col), overflow="fold")
        else:  # ... so that numbers never get cut on a narrow terminal
            table.add_column(col, justify="right", min_width=len(col), no_wrap=True)
    last = (None, None)
    for variant, layer, block, axis, quantity, *numbers in rows:
        if last[0] is not None and variant != last[0]:
            table.add_section()
        shown = (variant if variant != last[0] else "",
                 *((layer, block) if (variant, layer) != last else ("", "")))
        if part == "inference":
            axis = quantity.removeprefix("inference.")
        elif part == "adapter":
            axis = quantity.removeprefix("adapter.")
        *numbers, erank, verdict = numbers
        erank = [erank.replace(" collapsed", " !")] if part == "pretrain" else []
        table.add_row(*shown, axis, *numbers, *erank, SHORT_VERDICT.get(verdict, verdict))
        last = (variant, layer)
    return table


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


# ---------------------------------------------------------------- totals

def budget_totals(variant: dict) -> tuple[list[dict], dict]:
    """(per layer [{layer, pretrain, adapter, inference, total}], per model {...}): the
    report's variant["budget"], or, in a report written before it, the caps of the layer
    rows (one cap per axis, each adapter its own) with the model total = budget_total."""
    if variant.get("budget"):
        return variant["budget"]["per_layer"], variant["budget"]["model"]
    per_layer = []
    for layer in variant["layers"]:
        caps: dict[str, int] = {}
        for a in layer["axes"]:
            if a["axis"] == "adapter":  # each LoRA pair is capped by its own r
                caps["adapter"] = caps.get("adapter", 0) + a["declared"]
            elif a["axis"] != "out":  # W_O's cap is reported, not part of RankBudget.total
                caps[a["axis"]] = max(caps.get(a["axis"], 0), a["declared"])
        row = {p: sum(c for axis, c in caps.items() if PART_OF_AXIS[axis] == p) for p in PARTS}
        per_layer.append({"layer": layer["layer"], **row, "total": sum(row.values())})
    model = {p: sum(r[p] for r in per_layer) for p in PARTS}
    return per_layer, {**model, "total": variant["budget_total"]}


def _layer_runs(per_layer: list[dict]):
    """Consecutive layers with the same caps, as ('0-29', row): a uniform stack is one line."""
    runs: list[tuple[list, dict]] = []
    for r in per_layer:
        key = {p: r[p] for p in (*PARTS, "total")}
        if runs and runs[-1][1] == key and runs[-1][0][-1] + 1 == r["layer"]:
            runs[-1][0].append(r["layer"])
        else:
            runs.append(([r["layer"]], key))
    for layers, key in runs:
        name = str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"
        yield name, key


TOTAL_COLUMNS = ("variant", "layers", *PARTS, "total")


def _total_rows(report: dict):
    """(variant, layers, pretrain, adapter, inference, total, is_model_row)."""
    for v in report["variants"]:
        per_layer, model = budget_totals(v)
        for name, key in _layer_runs(per_layer):
            each = "each of " if "-" in name else ""
            yield (v["variant"], f"{each}{name}", *(str(key[p]) for p in (*PARTS, "total")),
                   False)
        yield (v["variant"], "model total, sum over layers",
               *(str(model.get(p, "-")) for p in (*PARTS, "total")), True)


def render_totals(report: dict) -> Table:
    table = Table(title="declared caps: per layer and per model", caption=TOTALS_LEGEND,
                  **COMPACT)
    for col in TOTAL_COLUMNS:
        if col in ("variant", "layers"):
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="right", no_wrap=True)
    last = None
    for variant, *cells, model in _total_rows(report):
        if last is not None and variant != last:
            table.add_section()
        table.add_row(variant if variant != last else "", *cells,
                      style="bold" if model else None)
        last = variant
    return table


# ---------------------------------------------------------------- heads and residual

def _class_counts(heads: dict) -> Counter:
    return Counter(c for c in heads.get("class") or [] if c is not None)


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
                counts = _class_counts(layer["heads"])
                yield (v["variant"], str(layer["layer"]),
                       *(str(counts.get(c, 0)) for c in HEAD_CLASSES), _heads_note(layer))


def head_legend(report: dict) -> str:
    rules = report.get("head_rules")
    return ("head classes: " + rules if rules else
            "head classes: the rules were not recorded in this report")


def render_heads(report: dict) -> Table | None:
    rows = list(_head_rows(report))
    if not rows:
        return None
    table = Table(title="heads per layer: class counts and summary", caption=head_legend(report),
                  **COMPACT)
    table.add_column("variant", overflow="fold")
    table.add_column("layer", justify="right", no_wrap=True)
    for c in HEAD_CLASSES:
        table.add_column(c, justify="right", no_wrap=True)
    table.add_column("summary", overflow="fold", ratio=1)
    return add_grouped_rows(table, rows)


def add_grouped_rows(table: Table, rows) -> Table:
    """Rows (variant, *cells), the variant named on its first row only."""
    last = None
    for variant, *cells in rows:
        table.add_row(variant if variant != last else "", *cells)
        last = variant
    return table


def massive_text(residual: dict, limit: int = 3) -> str:
    """'pos 0: 177x median; pos 5: 31x median (2 samples)': the largest ratio per position."""
    by_pos: dict[int, list[float]] = {}
    for m in residual.get("massive") or []:
        by_pos.setdefault(m["position"], []).append(m["ratio"])
    items = sorted(by_pos.items(), key=lambda kv: -max(kv[1]))
    parts = [f"pos {pos}: {max(rs):.0f}x median" + (f" ({len(rs)} samples)" if len(rs) > 1
                                                      else "") for pos, rs in items[:limit]]
    if len(items) > limit:
        parts.append(f"+{len(items) - limit} more positions")
    return "; ".join(parts) or "none"


def _residual_rows(report: dict):
    for v in report["variants"]:
        for layer in v["layers"]:
            res = layer.get("residual")
            if res is not None:
                hc = layer.get("input_centered_erank", layer.get("hidden_centered_erank"))
                yield (v["variant"], str(layer["layer"]), _fmt(res.get("centered_erank")),
                       _fmt(hc), _fmt(res.get("norm_median"), ".3g"), massive_text(res))


def _massive_ratio(report: dict) -> str:
    """'20x': the multiple of the median the probe flagged at (where the report states it)."""
    ratios = {(ly.get("residual") or {}).get("massive_ratio") for v in report["variants"]
              for ly in v["layers"]} - {None}
    ratio = (report.get("thresholds") or {}).get("massive_ratio")
    if ratio is None and len(ratios) == 1:
        ratio = ratios.pop()
    return f"{ratio:g}x" if ratio is not None else "the probe's stated multiple of"


def render_residual(report: dict) -> Table | None:
    rows = list(_residual_rows(report))
    if not rows:
        return None
    table = Table(title="residual stream beside the normed input",
                  caption=RESIDUAL_LEGEND.format(ratio=_massive_ratio(report)),
                  **COMPACT)
    table.add_column("variant", overflow="fold")
    for col in ("layer", "resid Hc", "input Hc", "median"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("massive tokens", overflow="fold", ratio=1)
    return add_grouped_rows(table, rows)


# ---------------------------------------------------------------- the whole report

def render_table(report: dict) -> Group:
    """The report for people, in reading order: status, the budget by part, the totals,
    heads, residual stream, legend. Every table fits 80 columns (names fold, numbers never
    get cut). A rich renderable: `console.print(render_table(report))`."""
    title = Text(f"rank budget: {report.get('experiment') or '(unnamed)'}", style="bold")
    parts: list = [title, render_status(report)]
    for part in PARTS:
        table = _part_table(report, part)
        if table is not None:
            parts.append(table)
        if part == "adapter":
            parts += [Text(f"adapter: {line}") for line in adapter_notes(report)]
    parts.append(Text(_legend(report), style="dim"))
    parts.append(render_totals(report))
    parts += [t for t in (render_heads(report), render_residual(report)) if t is not None]
    spaced = [parts[0]]
    for p in parts[1:]:  # a blank line before every section (not inside the status block)
        spaced += [p] if p is parts[1] else [Text(""), p]
    return Group(*spaced)


# ---------------------------------------------------------------- advice

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
    return item["text"] + (f" [{cond}]" if cond else "")


def render_advice(report: dict) -> Table:
    """The suggestions computed from the figures (budgets/verdicts.py), one per row, each
    with the conditions it was checked under."""
    table = Table(title="advice", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("advice", overflow="fold")
    for item in report.get("advice", []):
        table.add_row(Text(advice_text(item),
                           style="yellow" if item.get("kind") == "no_advice" else ""))
    if not report.get("advice"):
        table.add_row("no suggestions: every axis is used and no layer collapsed")
    return table


def advice_markdown(report: dict) -> str:
    items = [f"- {advice_text(a)}" for a in report.get("advice", [])]
    return "\n".join(["## Advice", "", *(items or ["- no suggestions"])]) + "\n"


# ---------------------------------------------------------------- Markdown

def _md_table(columns, rows) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _md_parts(report: dict) -> list[str]:
    lines = []
    for part in PARTS:
        lines += [f"## {PART_TITLES[part][0].upper()}{PART_TITLES[part][1:]}", ""]
        if part == "adapter":
            lines += [f"- {line}" for line in adapter_notes(report)] + [""]
        rows = list(_rows(report, part))
        if rows and part != "pretrain":  # the layer's eranks ride on its pretrain rows
            rows = [(*r[:-2], r[-1]) for r in rows]
        if rows:
            lines += _md_table(COLUMNS if part == "pretrain" else
                               [c for c in COLUMNS if c != "erank Pc/Hc"], rows) + [""]
        elif part != "adapter":
            lines += ["- no rows", ""]
    return lines


def _md_totals(report: dict) -> list[str]:
    rows = [(f"**{v}**", f"**{n}**", *(f"**{c}**" for c in cells)) if model else (v, n, *cells)
            for v, n, *cells, model in _total_rows(report)]
    return ["## Declared caps: per layer and per model", "", TOTALS_LEGEND + ".", "",
            *_md_table(TOTAL_COLUMNS, rows), ""]


def _md_heads(report: dict) -> list[str]:
    rows = list(_head_rows(report))
    if not rows:
        return []
    return ["## Heads", "", head_legend(report) + ".", "",
            *_md_table(("variant", "layer", *HEAD_CLASSES, "summary"), rows), ""]


def _md_residual(report: dict) -> list[str]:
    rows = list(_residual_rows(report))
    if not rows:
        return []
    return ["## Residual stream beside the normed input", "",
            RESIDUAL_LEGEND.format(ratio=_massive_ratio(report)) + ".", "",
            *_md_table(("variant", "layer", "resid Hc", "input Hc", "median norm",
                        "massive tokens"), rows), ""]


def to_markdown(report: dict) -> str:
    lines = [f"# Rank-budget report: {report.get('experiment') or '(unnamed)'}", "",
             status_markdown(report), _legend(report) + ".", ""]
    lines += _md_parts(report) + _md_totals(report) + _md_heads(report) + _md_residual(report)
    return "\n".join(lines) + "\n" + advice_markdown(report)


# ---------------------------------------------------------------- Hugging Face reports

def _head_mean(xs) -> float | None:
    """The mean over heads; None where the matrix-free mode measured no head (erank is
    given only where the top singular values hold the whole spectrum)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


HF_COLUMNS = ("layer", "hidden erank Hc", "mixing erank P", "erank Pc", "past->future erank",
              "head classes")


def _class_cell(layer: dict) -> str:
    """'7 sink, 2 broad' (the layer's head classes), '-' without head findings."""
    counts = _class_counts(layer.get("heads") or {})
    return ", ".join(f"{counts[c]} {c}" for c in HEAD_CLASSES if counts.get(c)) or "-"


def _hf_rows(report: dict):
    for layer in report["variants"][0]["layers"]:
        e = layer["erank"]
        pc = _head_mean(e["mixing_centered"])
        yield (str(layer["layer"]), _fmt(layer["hidden_centered_erank"], ".2f"),
               _fmt(_head_mean(e["mixing"]), ".2f"),
               "n/a" if layer.get("centered_na") and layer.get("mixing_centered_erank") is None
               else _fmt(pc, ".2f"),
               _fmt(_head_mean(e["past_future"]), ".2f"), _class_cell(layer))


def probe_source_text(report: dict) -> str:
    """'probe: 4 x 128 tokens of book.txt (tokenizer); next-token loss 2.345'."""
    v, src = report["variants"][0], report["source"]
    loss = v["metrics"].get("probe/loss")
    return (f"probe: {src['probe_size']} x {src['seq_len']} tokens of {src['text']} "
            f"({src['tokens']}); next-token loss {_fmt(loss, '.3f')}")


def render_hf_table(report: dict) -> Table:
    """Per layer: erank of the centered hidden states, raw/centered mixing eranks, and the
    head classes."""
    v = report["variants"][0]
    table = Table(title=f"{v['variant']}: effective ranks per layer (means over heads)",
                  caption=f"{probe_source_text(report)}; Hc = hidden states the attention "
                          f"reads, centered over tokens; Pc = centered attention; "
                          f"{head_legend(report)}",
                  box=box.SIMPLE_HEAD, caption_justify="left")
    for col in HF_COLUMNS:
        table.add_column(col, justify="left" if col == "head classes" else "right",
                         overflow="fold")
    for row in _hf_rows(report):
        table.add_row(*row)
    return table


def hf_markdown(report: dict) -> str:
    """The HF model's section: the probe (text, tokens, loss) and per-layer eranks with
    head classes; no training columns (nothing was trained)."""
    src = report["source"]
    model = f"{src.get('hf', report['variants'][0]['variant'])} ({src.get('model_type', '?')})"
    lines = ["## Probe", "", f"- model: {model}", f"- {probe_source_text(report)}",
             *([f"- device {src['device']}, dtype {src['dtype']}"]
               if "device" in src and "dtype" in src else []), "",
             "## Effective ranks per layer (means over heads)", "", head_legend(report) + ".",
             "", *_md_table(HF_COLUMNS, _hf_rows(report))]
    return "\n".join(lines) + "\n"


def hf_report_markdown(report: dict) -> str:
    """The whole Markdown document of an HF report: the report, then the probe's section.
    Unlike results.report_markdown it has no variant summary (its training columns are
    all empty for a model that was only probed)."""
    return to_markdown(report) + "\n" + hf_markdown(report)
