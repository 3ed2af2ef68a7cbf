"""The rank-budget report: each block's declared caps beside the ranks it realized.

    report = build_report({"softmax": {"probe": probe_model(...), "step": 1000,
                                       "params": 1_234_567, "metrics": {"loss": 2.1}}},
                          experiment="quick")
    Path("report.json").write_text(to_json(report))

The realized figure is rank_eps (energy-threshold rank at the probe's eps), the headline
metric of docs/METRICS.md; utilization = mean over heads / declared cap. The centered
mixing erank rides along per layer: raw softmax ranks read ~1 whenever attention is
near-uniform (see docs/METRICS.md), so the report keeps the centered view next to them.
The report is data (a JSON-serializable dict); tables and Markdown for people are drawn
from it on the CLI side (train/render.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from .budget import AXES, AXIS_OF_QUANTITY, RankBudget
from .schema import ANY, Choice, Int, ListOf, MapOf, Maybe, Number, Record, check, read_json
from .verdicts import VerdictThresholds, annotate

REPORT_SCHEMA = "rankzoo.report"
# Version 1 still: verdicts, "collapsed", "advice" and "thresholds" were *added* keys, so a
# reader of the first version-1 reports keeps working, and older report.json files (without
# them) are annotated on load (train/results.py). Bump the version only when an existing
# key changes meaning or goes away.
REPORT_SCHEMA_VERSION = 1


def axis_of(quantity: str) -> str | None:
    """The declared axis that caps a probed quantity, or None for info-only quantities."""
    if quantity.startswith("inference."):
        return "inference"
    return AXIS_OF_QUANTITY.get(quantity)


def _mean(xs) -> float | None:
    """The mean of the measured values (None: a head the matrix-free mode left out)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _axis_row(axis: str, quantity: str, declared: int, per_head: list[float],
              bound: list | None = None) -> dict:
    mean = _mean(per_head)
    row = {
        "axis": axis, "quantity": quantity, "declared": declared,
        "realized_mean": mean, "realized_max": max(per_head, default=None),
        # A zero cap (e.g. no adapter) has no meaningful ratio; None, never inf.
        "utilization": mean / declared if declared and mean is not None else None,
        "per_head": per_head,
    }
    if bound and any(bound):  # matrix-free: some heads' rank_eps only known from below
        row["lower_bound"] = True
    return row


def _axis_rows(layer: dict) -> list[dict]:
    """One row per capped quantity of a probed layer, in AXES order."""
    budget, rows = layer["budget"], []
    for quantity, metrics in layer["quantities"].items():
        axis = axis_of(quantity)
        if axis is not None:
            per_head = [float(r) for r in metrics["rank_eps"]]
            rows.append(_axis_row(axis, quantity, int(budget[axis]), per_head,
                                  metrics.get("rank_eps_bound")))
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


def to_json(report: dict) -> str:
    # allow_nan=False: NaN is not JSON, and a NaN here means a bug upstream.
    return json.dumps(report, indent=2, allow_nan=False)


# ---------------------------------------------------------------- reading back

# The shapes the readers rely on (budgets/schema.py): what build_report writes, what the
# probe records of ranks.jsonl hold. Keys added later are optional, so older files load.
BUDGET = Record({"block": str, **{k: Int(0) for k in ("seq_len", "n_heads", *AXES[:3],
                                                       "inference")}},
                {k: Int(0) for k in ("adapter", "params", "cache_elements", "flops_per_token")},
                closed=True)  # RankBudget.from_dict takes exactly these
AXIS_ROW = Record({"axis": Choice(AXES), "quantity": str, "declared": Int(0),
                   "realized_mean": Maybe(float), "realized_max": Maybe(float),
                   "utilization": Maybe(float), "per_head": ListOf(Maybe(float))},
                  {"lower_bound": bool, "verdict": Maybe(str)})
REPORT_LAYER = Record({"layer": Int(0), "block": str, "axes": ListOf(AXIS_ROW),
                       "mixing_centered_erank": Maybe(float)},
                      {"name": str, "hidden_centered_erank": Maybe(float), "collapsed": bool})
REPORT_VARIANT = Record({"variant": str, "step": Int(0), "params": Int(0),
                         "metrics": MapOf(float), "seq_len": Int(1), "eps": float,
                         "budget_total": Int(0), "layers": ListOf(REPORT_LAYER)},
                        {"final_hidden_centered_erank": Maybe(float)})
REPORT = Record({"schema": str, "version": int, "variants": ListOf(REPORT_VARIANT, min_len=1)},
                {"experiment": str, "advice": list, "thresholds": dict})

# One probe record: a line of ranks.jsonl ({"step": ..., **probe_model(...)}). Only the
# metrics the report and the figures read are checked; rank_eps counts are finite, an
# erank is null where the matrix-free probe could not decide it.
ADAPTER_ROW = Record({"module": str, "adapter": str, "declared": Int(0),
                      "metrics": Record({"rank_eps": float},
                                        {"erank": float, "numerical_rank": float})})
QUANTITY = Record({}, {"rank_eps": ListOf(float), "erank": ListOf(Maybe(float))})
PROBE_LAYER = Record({"layer": Int(0), "block": str, "budget": BUDGET,
                      "quantities": MapOf(QUANTITY)},
                     {"name": str, "adapters": ListOf(ADAPTER_ROW),
                      "spectra": MapOf(ListOf(ListOf(Number(finite=False)), min_len=1))})
RANK_RECORD = Record({"step": Int(0), "seq_len": Int(1), "eps": float,
                      "layers": ListOf(PROBE_LAYER)},
                     {"final_hidden": Record({}, {"erank": Maybe(float)}), "matfree": ANY})


def load_report(path) -> dict:
    """Read a report written by to_json, checking its schema, version and every field the
    readers use; a bad file is a ValueError naming it (and the line, for bad JSON)."""
    path = Path(path)
    report = read_json(path)
    schema = report.get("schema") if isinstance(report, dict) else None
    if schema != REPORT_SCHEMA:
        raise ValueError(f"{path}: expected schema {REPORT_SCHEMA!r}, got {schema!r}")
    if report.get("version") != REPORT_SCHEMA_VERSION:
        raise ValueError(f"{path}: report version {report.get('version')!r} is not supported "
                         f"(this rankzoo reads version {REPORT_SCHEMA_VERSION})")
    return check(report, REPORT, str(path))
