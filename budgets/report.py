"""The rank-budget report: each block's declared caps beside the ranks it realized.

    report = build_report({"softmax": {"probe": probe_model(...), "step": 1000,
                                       "params": 1_234_567, "metrics": {"loss": 2.1}}},
                          experiment="quick")
    rich.print(render_table(report)); Path("report.md").write_text(to_markdown(report))

The realized figure is rank_eps (energy-threshold rank at the probe's eps), the headline
metric of DESIGN.md; utilization = mean over heads / declared cap. The centered mixing
erank rides along per layer: raw softmax ranks read ~1 whenever attention is near-uniform
(see notes/rank-science.md), so the report keeps the centered view next to them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich import box
from rich.table import Table

from .budget import AXES, AXIS_OF_QUANTITY, RankBudget
from .verdicts import VerdictThresholds, annotate

REPORT_SCHEMA = "rankzoo.report"
# Version 1 still: verdicts, "collapsed", "advice" and "thresholds" were *added* keys, so a
# reader of the first version-1 reports keeps working, and older report.json files (without
# them) are annotated on load (train/results.py). Bump the version only when an existing
# key changes meaning or goes away.
REPORT_SCHEMA_VERSION = 1
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


def axis_of(quantity: str) -> str | None:
    """The declared axis that caps a probed quantity, or None for info-only quantities."""
    if quantity.startswith("inference."):
        return "inference"
    return AXIS_OF_QUANTITY.get(quantity)


def _mean(xs) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _axis_row(axis: str, quantity: str, declared: int, per_head: list[float]) -> dict:
    mean = _mean(per_head)
    return {
        "axis": axis, "quantity": quantity, "declared": declared,
        "realized_mean": mean, "realized_max": max(per_head, default=None),
        # A zero cap (e.g. no adapter) has no meaningful ratio; None, never inf.
        "utilization": mean / declared if declared and mean is not None else None,
        "per_head": per_head,
    }


def _axis_rows(layer: dict) -> list[dict]:
    """One row per capped quantity of a probed layer, in AXES order."""
    budget, rows = layer["budget"], []
    for quantity, metrics in layer["quantities"].items():
        axis = axis_of(quantity)
        if axis is not None:
            per_head = [float(r) for r in metrics["rank_eps"]]
            rows.append(_axis_row(axis, quantity, int(budget[axis]), per_head))
    # Each LoRA pair is capped by its own r (the block's adapter cap is their sum).
    for a in layer.get("adapters", []):
        rows.append(_axis_row("adapter", f"adapter.{a['module']}.{a['adapter']}",
                              int(a["declared"]), [float(a["metrics"]["rank_eps"])]))
    # sorted() is stable, so quantities on one axis keep the probe's order.
    return sorted(rows, key=lambda r: AXES.index(r["axis"]))


def _report_layer(layer: dict) -> dict:
    centered = layer["quantities"].get("mixing_centered", {})
    return {
        "layer": layer["layer"], "name": layer.get("name", ""), "block": layer["block"],
        "axes": _axis_rows(layer),
        "mixing_centered_erank": _mean(centered.get("erank", [])),
        # erank of the centered hidden states the block reads (token collapse)
        "hidden_centered_erank": _mean(
            layer["quantities"].get("hidden_centered", {}).get("erank", [])),
    }


def _report_variant(name: str, entry: dict) -> dict:
    missing = [k for k in ("probe", "step", "params") if k not in entry]
    if missing:
        raise ValueError(f"variant {name!r} lacks {missing}; expected keys "
                         f"'probe', 'step', 'params' and optionally 'metrics'")
    probe = entry["probe"]
    return {
        "variant": name, "step": int(entry["step"]), "params": int(entry["params"]),
        "metrics": {k: float(v) for k, v in entry.get("metrics", {}).items()},
        "seq_len": probe["seq_len"], "eps": probe["eps"],
        # Sum over layers of pretrain + adapter + inference caps (RankBudget.total);
        # from_dict also rejects a malformed budget here rather than in a table cell.
        "budget_total": sum(RankBudget.from_dict(ly["budget"]).total for ly in probe["layers"]),
        "layers": [_report_layer(ly) for ly in probe["layers"]],
        # centered erank of the states the output head reads, pooled over the probe batch
        "final_hidden_centered_erank": probe.get("final_hidden", {}).get("erank"),
    }


def build_report(variants: dict[str, dict], experiment: str = "",
                 thresholds: VerdictThresholds | None = None) -> dict:
    """Declared vs realized for each variant; `variants` maps name -> {probe, step, params,
    metrics}. Returns a JSON-serializable dict (schema "rankzoo.report", version 1) with
    verdicts and advice (budgets/verdicts.py) under the given thresholds."""
    if not variants:
        raise ValueError("build_report needs at least one variant, got none")
    report = {
        "schema": REPORT_SCHEMA, "version": REPORT_SCHEMA_VERSION, "experiment": experiment,
        "variants": [_report_variant(name, entry) for name, entry in variants.items()],
    }
    return annotate(report, thresholds)


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
    th = report.get("thresholds") or asdict(VerdictThresholds())
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


def to_json(report: dict) -> str:
    # allow_nan=False: NaN is not JSON, and a NaN here means a bug upstream.
    return json.dumps(report, indent=2, allow_nan=False)


def load_report(path) -> dict:
    """Read a report written by to_json, checking its schema and version."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON document ({e})") from e
    schema = report.get("schema") if isinstance(report, dict) else None
    if schema != REPORT_SCHEMA:
        raise ValueError(f"{path}: expected schema {REPORT_SCHEMA!r}, got {schema!r}")
    if report.get("version") != REPORT_SCHEMA_VERSION:
        raise ValueError(f"{path}: report version {report.get('version')!r} is not supported "
                         f"(this rankzoo reads version {REPORT_SCHEMA_VERSION})")
    return report
