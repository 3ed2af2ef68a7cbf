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
from pathlib import Path

from rich import box
from rich.table import Table

from .budget import AXES, AXIS_OF_QUANTITY, RankBudget

REPORT_SCHEMA = "rankzoo.report"
REPORT_SCHEMA_VERSION = 1
COLUMNS = ("variant", "layer", "block", "axis", "quantity", "declared",
           "realized", "max", "util", "erank Pc")
LEGEND = ("realized = rank_eps at eps = {eps}, mean over heads; max = max over heads; "
          "util = realized / declared; erank Pc = erank of the centered mixing matrix")


def axis_of(quantity: str) -> str | None:
    """The declared axis that caps a probed quantity, or None for info-only quantities."""
    if quantity.startswith("inference."):
        return "inference"
    return AXIS_OF_QUANTITY.get(quantity)


def _mean(xs) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _axis_rows(layer: dict) -> list[dict]:
    """One row per capped quantity of a probed layer, in AXES order."""
    budget, rows = layer["budget"], []
    for quantity, metrics in layer["quantities"].items():
        axis = axis_of(quantity)
        if axis is None:
            continue
        per_head = [float(r) for r in metrics["rank_eps"]]
        declared, mean = int(budget[axis]), _mean(per_head)
        rows.append({
            "axis": axis, "quantity": quantity, "declared": declared,
            "realized_mean": mean, "realized_max": max(per_head, default=None),
            # A zero cap (e.g. no adapter) has no meaningful ratio; None, never inf.
            "utilization": mean / declared if declared and mean is not None else None,
            "per_head": per_head,
        })
    # sorted() is stable, so quantities on one axis keep the probe's order.
    return sorted(rows, key=lambda r: AXES.index(r["axis"]))


def _report_layer(layer: dict) -> dict:
    centered = layer["quantities"].get("mixing_centered", {})
    return {
        "layer": layer["layer"], "name": layer.get("name", ""), "block": layer["block"],
        "axes": _axis_rows(layer),
        "mixing_centered_erank": _mean(centered.get("erank", [])),
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
    }


def build_report(variants: dict[str, dict], experiment: str = "") -> dict:
    """Declared vs realized for each variant; `variants` maps name -> {probe, step, params,
    metrics}. Returns a JSON-serializable dict (schema "rankzoo.report", version 1)."""
    if not variants:
        raise ValueError("build_report needs at least one variant, got none")
    return {
        "schema": REPORT_SCHEMA, "version": REPORT_SCHEMA_VERSION, "experiment": experiment,
        "variants": [_report_variant(name, entry) for name, entry in variants.items()],
    }


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _rows(report: dict):
    """The cells of the human-readable table, one row per (variant, layer, capped quantity)."""
    for v in report["variants"]:
        for layer in v["layers"]:
            for i, a in enumerate(layer["axes"]):
                util = "-" if a["utilization"] is None else f"{100 * a['utilization']:.0f}%"
                # The centered erank belongs to the layer: print it once, on its first row.
                erank = _fmt(layer["mixing_centered_erank"], ".2f") if i == 0 else ""
                yield (v["variant"], str(layer["layer"]), layer["block"], a["axis"],
                       a["quantity"], str(a["declared"]), _fmt(a["realized_mean"]),
                       _fmt(a["realized_max"]), util, erank)


def _add_columns(table: Table) -> None:
    for col in COLUMNS:
        if col == "quantity":
            continue  # folded into "axis" (see render_table)
        if col in ("variant", "block", "axis"):
            table.add_column(col, overflow="fold")  # names fold onto a second line ...
        else:  # ... so that numbers never get cut on a narrow terminal
            table.add_column(col, justify="right", min_width=len(col), no_wrap=True)


def render_table(report: dict) -> Table:
    """The report for people: one row per (variant, layer, capped quantity).

    Narrower than the Markdown so it fits 80 columns: the quantity column folds into the
    axis (only the inference axis has more than one quantity), and a variant, layer and
    block are named once, on their first row.
    """
    eps = ", ".join(str(e) for e in sorted({v["eps"] for v in report["variants"]}))
    title = f"rank budget: {report.get('experiment') or '(unnamed)'}"
    table = Table(title=title, caption=LEGEND.format(eps=eps), box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    _add_columns(table)
    last = (None, None)
    for variant, layer, block, axis, quantity, *numbers in _rows(report):
        if last[0] is not None and variant != last[0]:
            table.add_section()
        shown = (variant if variant != last[0] else "",
                 *((layer, block) if (variant, layer) != last else ("", "")))
        axis = quantity if quantity.startswith("inference.") else axis
        table.add_row(*shown, axis, *numbers)
        last = (variant, layer)
    return table


def to_markdown(report: dict) -> str:
    eps = ", ".join(str(e) for e in sorted({v["eps"] for v in report["variants"]}))
    lines = [f"# Rank-budget report: {report.get('experiment') or '(unnamed)'}", "",
             LEGEND.format(eps=eps) + ".", "",
             "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    return "\n".join(lines) + "\n"


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
