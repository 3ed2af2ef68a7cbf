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
from it on the CLI side (train/render/__init__.py).

The budget has three parts (RankBudget): pretrain (rows of the mixing, logits, value_path
and out axes), adapter (LoRA rows) and inference (caches and states); every row says its
"part", and `variant["budget"]` gives each part per layer and summed per model
(`budget_total` = the model total, for older readers). `realized_max_sample` is the max over
samples and heads of the probe's rank_eps_max (None for probes that lack it): the figure an
advised bound must hold. W_O (`out`, a weight) is a row capped by min(shape), its structural
rank. Per layer the report copies the probe's per-head figures (`heads`, classified by
budgets/advice/head_classes.py under annotate), the residual stream (`residual`), the
past->future rank at several lengths and the KV heads' ranks, which the advice reads
(budgets/advice/annotate.py).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from ..advice.annotate import annotate
from ..advice.verdicts import VerdictThresholds
from ..budget import AXES, AXIS_OF_QUANTITY, RankBudget
from ..schema import ANY, Choice, Int, ListOf, MapOf, Maybe, Number, Record, check, read_json
from .kinds import kind_summary

REPORT_SCHEMA = "rankzoo.report"
# Version 1 still: verdicts, "collapsed", "advice" and "thresholds" were *added* keys, so a
# reader of the first version-1 reports keeps working, and older report.json files (without
# them) are annotated on load (train/rundir/read.py). Bump the version only when an existing
# key changes meaning or goes away.
REPORT_SCHEMA_VERSION = 1

PARTS = ("pretrain", "adapter", "inference")
# The row axes: RankBudget's caps plus "out" (W_O, capped by its own shape; no budget field).
ROW_AXES = ("mixing", "logits", "value_path", "out", "adapter", "inference")
PART_OF_AXIS = {"mixing": "pretrain", "logits": "pretrain", "value_path": "pretrain",
                "out": "pretrain", "adapter": "adapter", "inference": "inference"}
OUT = "out"  # the weight_matrices() name of the output projection W_O [D, H*V]


def axis_of(quantity: str) -> str | None:
    """The declared axis that caps a probed quantity, or None for info-only quantities."""
    if quantity.startswith("inference."):
        return "inference"
    if quantity == OUT:
        return OUT
    return AXIS_OF_QUANTITY.get(quantity)


def _mean(xs) -> float | None:
    """The mean of the measured values (None: a head the matrix-free mode left out)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _max_sample(metrics: dict) -> float | None:
    """Max over samples and heads of rank_eps (None: a probe without rank_eps_max)."""
    xs = [float(x) for x in metrics.get("rank_eps_max") or [] if x is not None]
    return max(xs) if xs else None


def _axis_row(axis: str, quantity: str, declared: int, per_head: list[float],
              bound: list | None = None, max_sample: float | None = None) -> dict:
    mean = _mean(per_head)
    row = {
        "axis": axis, "part": PART_OF_AXIS[axis], "quantity": quantity, "declared": declared,
        "realized_mean": mean, "realized_max": max(per_head, default=None),
        "realized_max_sample": max_sample,
        # A zero cap (e.g. no adapter) has no meaningful ratio; None, never inf.
        "utilization": mean / declared if declared and mean is not None else None,
        "per_head": per_head,
    }
    if bound and any(bound):  # matrix-free: some heads' rank_eps only known from below
        row["lower_bound"] = True
    return row


def _out_cap(layer: dict, metrics: dict) -> int | None:
    """W_O's structural cap min(m, n): from the probe's shape, else from the length of its
    spectrum (min(m, n) values), else unknown (None: no row)."""
    if metrics.get("shape"):
        return int(min(metrics["shape"]))
    spectrum = layer.get("spectra", {}).get(OUT)
    if spectrum is not None and len(spectrum) and len(spectrum[0]):
        return len(spectrum[0])
    return None


def _axis_rows(layer: dict) -> list[dict]:
    """One row per capped quantity of a probed layer, in ROW_AXES order."""
    budget, rows = layer["budget"], []
    for quantity, metrics in layer["quantities"].items():
        axis = axis_of(quantity)
        declared = _out_cap(layer, metrics) if axis == OUT else (
            None if axis is None else int(budget[axis]))
        if declared is not None:
            per_head = [float(r) for r in metrics["rank_eps"]]
            rows.append(_axis_row(axis, quantity, declared, per_head,
                                  metrics.get("rank_eps_bound"), _max_sample(metrics)))
    # Each LoRA pair is capped by its own r (the block's adapter cap is their sum); a
    # weight has no samples, so its exact rank_eps is its max over samples too.
    for a in layer.get("adapters", []):
        rank = float(a["metrics"]["rank_eps"])
        rows.append(_axis_row("adapter", f"adapter.{a['module']}.{a['adapter']}",
                              int(a["declared"]), [rank], max_sample=rank))
    # sorted() is stable, so quantities on one axis keep the probe's order.
    return sorted(rows, key=lambda r: ROW_AXES.index(r["axis"]))


def _floats(xs, n: int) -> list:
    """Per-head figures as floats (None kept: not measured); n Nones when absent."""
    if xs is None:
        return [None] * n
    return [None if x is None or not math.isfinite(x) else float(x) for x in xs]


def _heads(layer: dict) -> dict | None:
    """The per-head figures of a layer (classified later, by annotate), or None when the
    probe has none."""
    probed, q = layer.get("heads"), layer["quantities"]
    figures = [probed.get(k) or [] for k in ("first_token_mass", "diagonal_mass",
                                             "centered_energy")] if probed else []
    if not any(x is not None for fig in figures for x in fig):
        return None  # no per-head figures (e.g. mixing known only by its factors)
    n = len(probed["first_token_mass"])
    raw = probed.get("raw_erank")
    return {
        "first_token_mass": _floats(probed["first_token_mass"], n),
        "diagonal_mass": _floats(probed.get("diagonal_mass"), n),
        "centered_energy": _floats(probed.get("centered_energy"), n),
        "raw_erank": _floats(raw if raw is not None else q.get("mixing", {}).get("erank"), n),
        "past_future_max": _floats(q.get("past_future", {}).get("rank_eps_max"), n),
        "centered_erank": _floats(q.get("mixing_centered", {}).get("erank"), n),
    }


def _report_layer(layer: dict) -> dict:
    centered = layer["quantities"].get("mixing_centered", {})
    hidden = _mean(layer["quantities"].get("hidden_centered", {}).get("erank", []))
    out = {
        "layer": layer["layer"],
        # one of several mixers in the layer (falcon_h1's SSM beside its attention)
        **({"mixer": layer["mixer"]} if "mixer" in layer else {}),
        "name": layer.get("name", ""), "block": layer["block"],
        "axes": _axis_rows(layer),
        # all heads here; annotate keeps only the heads whose centered figures are valid
        "mixing_centered_erank": _mean(centered.get("erank", [])),
        # erank of the centered hidden states the block reads (token collapse)
        "hidden_centered_erank": hidden,
        "input_centered_erank": hidden,  # the same, named beside the residual stream's
    }
    heads = _heads(layer)
    if heads is not None:
        out["heads"] = heads
    for key in ("residual", "past_future_lengths", "kv_heads", "shared"):
        if layer.get(key) is not None:
            out[key] = copy.deepcopy(layer[key])
    if "kv_heads" in out:
        _add_v_head_dim(out["kv_heads"], layer["quantities"])
    return out


def _add_v_head_dim(kv: dict, quantities: dict) -> None:
    """The value head dim V the KV bytes need, where the probe did not state it: from the
    joined value cache inference.v [T, G*V] (one matrix per sample, not one per head) when
    its width splits over the G heads; else the advice takes V = K."""
    v = quantities.get("inference.v", {})
    shape, G = v.get("shape"), kv.get("n_kv_heads")
    joined = len(v.get("rank_eps") or []) == 1
    if "v_head_dim" not in kv and joined and shape and G and shape[-1] % G == 0:
        kv["v_head_dim"] = shape[-1] // G


def _budget_parts(layers: list[dict]) -> dict:
    """The three parts of the declared budget (RankBudget), per layer and per model."""
    per_layer = []
    for ly in layers:
        b = RankBudget.from_dict(ly["budget"])  # rejects a malformed budget here
        per_layer.append({"layer": ly["layer"], **({"mixer": ly["mixer"]} if "mixer" in ly else {}),
                          "pretrain": b.pretrain, "adapter": b.adapter,
                          "inference": b.inference, "total": b.total,
                          # elements a sequence's cache holds at seq_len (the cost side)
                          "cache_elements": b.cache_elements})
    model = {k: sum(p[k] for p in per_layer) for k in (*PARTS, "total", "cache_elements")}
    return {"per_layer": per_layer, "model": model}


def _adapter_note(name: str, entry: dict, budget: dict) -> str:
    """What the adapter part holds: the LoRA pairs found, or "none attached" (with what a
    LoRA of the experiment's configured r would add, when it configures one)."""
    attached, n_layers = budget["model"]["adapter"], len(budget["per_layer"])
    if attached:
        return (f"attached: rank {attached} per model (the cap min(r, out, in) of every LoRA "
                f"pair found, summed)")
    lora = entry.get("lora")
    if not lora:
        return "none attached"
    r, targets = lora.get("r"), list(lora.get("targets") or [])
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ValueError(f"variant {name!r}: lora.r must be a positive int, got {r!r}")
    if not targets:
        return f"none attached; a LoRA of r = {r} would add {r} per target module and layer"
    per_layer = r * len(targets)
    return (f"none attached; a LoRA of r = {r} on {', '.join(targets)} would add "
            f"{per_layer} per layer ({r} per target), {per_layer * n_layers} per model")


def _report_variant(name: str, entry: dict) -> dict:
    missing = [k for k in ("probe", "step", "params") if k not in entry]
    if missing:
        raise ValueError(f"variant {name!r} lacks {missing}; expected keys "
                         f"'probe', 'step', 'params' and optionally 'metrics', 'status', "
                         f"'lora'")
    probe = entry["probe"]
    budget = _budget_parts(probe["layers"])
    variant = {
        "variant": name, "step": int(entry["step"]), "params": int(entry["params"]),
        "metrics": {k: float(v) for k, v in entry.get("metrics", {}).items()},
        "seq_len": probe["seq_len"], "eps": probe["eps"],
        "batch_size": probe.get("batch_size"),
        "budget": budget,
        # the model total of budget (sum over layers of pretrain + adapter + inference)
        "budget_total": budget["model"]["total"],
        "adapter_note": _adapter_note(name, entry, budget),
        "layers": [_report_layer(ly) for ly in probe["layers"]],
        # centered erank of the states the output head reads, pooled over the probe batch
        "final_hidden_centered_erank": probe.get("final_hidden", {}).get("erank"),
    }
    if entry.get("pattern"):  # a layer pattern (a hybrid): its layers grouped by label
        add_kinds(variant, [str(label) for label in entry["pattern"]])
    if entry.get("status") is not None:  # how the run ended (train); advice depends on it
        variant["status"] = copy.deepcopy(entry["status"])
    source = entry.get("source") or {}
    if source.get("hf"):  # a Hugging Face model: the advice names commands on it
        variant["probed_from"] = {"hf": str(source["hf"]), "text": str(source.get("text"))}
    return variant


def add_kinds(variant: dict, pattern: list[str]) -> None:
    """A hybrid's layers labelled by the pattern (one label per layer, its sub-block's
    name) and grouped per label: each kind realized against its caps, as a Hugging Face
    report's kinds are (budgets/report/kinds.py)."""
    if len(pattern) != len(variant["layers"]):
        raise ValueError(f"variant {variant['variant']!r}: a pattern of {len(pattern)} "
                         f"labels for {len(variant['layers'])} probed layers")
    variant["pattern"] = pattern
    for layer, label in zip(variant["layers"], pattern, strict=True):
        layer["kind"] = {"label": label, "zoo_block": layer["block"],
                         "moe": layer["block"] == "moe"}
    variant["kinds"] = kind_summary(variant["layers"])


def build_report(variants: dict[str, dict], experiment: str = "",
                 thresholds: VerdictThresholds | None = None) -> dict:
    """Declared vs realized for each variant; `variants` maps name -> {probe, step, params,
    metrics, and optionally status (train's run status: no advice unless finished and
    learned), lora ({"r", "targets"}: the adapter the experiment configures) and pattern
    (a hybrid's label per layer: its layers are then grouped by kind)}.
    Returns a JSON-serializable dict (schema "rankzoo.report", version 1) with verdicts
    and advice (budgets/advice/verdicts.py, budgets/advice/annotate.py) under the given
    thresholds."""
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
AXIS_ROW = Record({"axis": Choice(ROW_AXES), "quantity": str, "declared": Int(0),
                   "realized_mean": Maybe(float), "realized_max": Maybe(float),
                   "utilization": Maybe(float), "per_head": ListOf(Maybe(float))},
                  {"lower_bound": bool, "verdict": Maybe(str), "part": Choice(PARTS),
                   "realized_max_sample": Maybe(float)})
PER_HEAD = ListOf(Maybe(float))
HEADS = Record({"first_token_mass": PER_HEAD},
               {k: PER_HEAD for k in ("diagonal_mass", "centered_energy", "raw_erank",
                                      "past_future_max", "centered_erank")}
               | {"class": ListOf(str), "centered_ok": ListOf(bool), "summary": str})
MASSIVE = Record({"sample": Int(0), "position": Int(0), "norm": float, "ratio": float})
RESIDUAL = Record({}, {"centered_erank": Maybe(float), "norm_median": Maybe(float),
                       "massive_ratio": float, "n_massive": Int(0),
                       "massive": ListOf(MASSIVE)})
LENGTH = Record({"seq_len": Int(1), "rank_eps": PER_HEAD},
                {"rank_eps_max": PER_HEAD, "lower_bound": bool})
KV_RANKS = Record({"rank_eps_max": PER_HEAD}, {"rank_eps": PER_HEAD, "erank": PER_HEAD,
                                               "rank_eps_pooled": PER_HEAD})
KV_HEADS = Record({"n_kv_heads": Int(1), "head_dim": Int(1), "k": KV_RANKS, "v": KV_RANKS},
                  {"rope": bool, "k_pre_rope": KV_RANKS, "v_head_dim": Int(1)})
LAYER_EXTRAS = {"heads": HEADS, "residual": RESIDUAL, "past_future_lengths": ListOf(LENGTH),
                "kv_heads": KV_HEADS}
REPORT_LAYER = Record({"layer": Int(0), "block": str, "axes": ListOf(AXIS_ROW),
                       "mixing_centered_erank": Maybe(float)},
                      {"name": str, "hidden_centered_erank": Maybe(float), "collapsed": bool,
                       "kind": dict, "shared": Record({"module": str, "mixers": ListOf(int)}),
                       "input_centered_erank": Maybe(float), "centered_na": str,
                       **LAYER_EXTRAS})
PARTS_TOTAL = {k: Int(0) for k in (*PARTS, "total")}
CACHE = {"cache_elements": Int(0)}  # added later: optional
BUDGET_PARTS = Record({"per_layer": ListOf(Record({"layer": Int(0), **PARTS_TOTAL}, CACHE)),
                       "model": Record(PARTS_TOTAL, CACHE)})
STATUS = Record({"state": str},
                {"step": Int(0), "max_steps": Maybe(Int(0)), "learned": Maybe(bool),
                 "reason": Maybe(str), "baseline": Maybe(dict)})
REPORT_VARIANT = Record({"variant": str, "step": Int(0), "params": Int(0),
                         "metrics": MapOf(float), "seq_len": Int(1), "eps": float,
                         "budget_total": Int(0), "layers": ListOf(REPORT_LAYER)},
                        {"final_hidden_centered_erank": Maybe(float), "batch_size": Maybe(Int(1)),
                         "budget": BUDGET_PARTS, "adapter_note": str, "status": STATUS,
                         "probed_from": Record({"hf": str, "text": str}),
                         "pattern": ListOf(str), "kinds": ListOf(dict)})
CONDITIONS = Record({"eps": float, "seq_len": Int(1), "checked": bool},
                    {"batch_size": Maybe(Int(1)), "max_observed": ANY})
ADVICE = Record({"kind": str, "text": str},
                {"variant": str, "layer": Int(0), "conditions": CONDITIONS})
REPORT = Record({"schema": str, "version": int, "variants": ListOf(REPORT_VARIANT, min_len=1)},
                {"experiment": str, "advice": ListOf(ADVICE), "findings": ListOf(ADVICE),
                 "thresholds": dict, "head_rules": str})

# One probe record: a line of ranks.jsonl ({"step": ..., **probe_model(...)}). Only the
# metrics the report and the figures read are checked; rank_eps counts are finite, an
# erank is null where the matrix-free probe could not decide it.
ADAPTER_ROW = Record({"module": str, "adapter": str, "declared": Int(0),
                      "metrics": Record({"rank_eps": float},
                                        {"erank": float, "numerical_rank": float})})
QUANTITY = Record({}, {"rank_eps": ListOf(float), "erank": ListOf(Maybe(float)),
                       "rank_eps_max": PER_HEAD, "shape": ListOf(Int(0))})
PROBE_HEADS = Record({"first_token_mass": PER_HEAD},
                     {k: Maybe(PER_HEAD) for k in ("diagonal_mass", "centered_energy",
                                                   "raw_erank")})
PROBE_LAYER = Record({"layer": Int(0), "block": str, "budget": BUDGET,
                      "quantities": MapOf(QUANTITY)},
                     {"name": str, "adapters": ListOf(ADAPTER_ROW),
                      "spectra": MapOf(ListOf(ListOf(Number(finite=False)), min_len=1)),
                      **LAYER_EXTRAS, "heads": PROBE_HEADS})
RANK_RECORD = Record({"step": Int(0), "seq_len": Int(1), "eps": float,
                      "layers": ListOf(PROBE_LAYER)},
                     {"final_hidden": Record({}, {"erank": Maybe(float)}), "matfree": ANY,
                      "batch_size": Int(1)})


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
