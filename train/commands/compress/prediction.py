"""The report's advice that compress checks: the ranks it advises, per slot and head.

    prediction = zoo_prediction(vdir, target, nbytes, notes)   # from the run's report
    prediction = hf_prediction(target, cal, eps, nbytes, T, command)   # as `report --hf`

A prediction is {"ranks": {slot key: [r per head]}, "seq_len": T, "cost_model",
"advised", "withheld", "source"}: the KV advice's ranks per KV head (budgets/advice/kv.py
kv_option: the probe's sequences stacked, for one shared basis, or on an older probe the
per-sequence maxima); for MLA, linear attention and SSMs, which get no KV advice, the
ranks their inference row measured.
"""

from __future__ import annotations

import math
from pathlib import Path

import zoo
from budgets.advice.kv import kv_option
from budgets.cache import CostModel

from .bases.calibrate import Calibration
from .target.hf_surgery import HFTarget
from .target.zoo_surgery import ZooTarget


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # rank_eps is an integer; guard float noise (as verdicts)


def zoo_prediction(vdir: Path, target: ZooTarget, nbytes: int, notes: list[str]) -> dict | None:
    """The ranks the run's report advises per slot and head (the KV advice's rank_eps_max
    per KV head, rounded up; for MLA, linear attention and SSMs, which get no KV advice,
    the ranks their inference row measured), with the report's T; None when the report
    lacks the figures (said in notes)."""
    from ...rundir.read import load_run

    try:
        report = load_run(vdir)
    except (ValueError, FileNotFoundError) as e:
        notes.append(f"no report to check: {e}")
        return None
    variant = report["variants"][0]
    T = int(variant["seq_len"])
    withheld = next((a["text"] for a in report.get("advice", [])
                     if a["kind"] == "no_advice" and a.get("variant") == variant["variant"]),
                    None)
    found = (_kv_ranks(report, variant, T, target, nbytes, notes)
             if target.caches_kv else _state_ranks(variant, T, target, notes))
    if found is None:
        return None
    ranks, advised, source, model = found
    if set(ranks) != {s.key for s in target.slots}:
        notes.append("the report's layers do not match the model's: no advice to check")
        return None
    return {"ranks": ranks, "seq_len": T, "cost_model": model, "advised": advised,
            "withheld": withheld, "source": source}


def _kv_ranks(report: dict, variant: dict, T: int, target: ZooTarget, nbytes: int,
              notes: list[str]) -> tuple[dict, bool, str, CostModel] | None:
    """(ranks, advised, source, cost model) of the report's KV advice; None without
    per-head ranks."""
    key = target.keys.field
    ranks, models = {}, set()
    for layer in variant["layers"]:
        kv = layer.get("kv_heads")
        opt = kv_option(kv, key, nbytes, T) if kv and key in kv else None
        if opt is None:
            notes.append(f"the report has no per-KV-head maxima of {target.keys.label} for "
                         f"layer {layer['layer']} ({_why_no_kv_heads(target)}): no advice "
                         f"to check")
            return None
        ranks[(layer["layer"], "k")] = opt["rank_k"]
        ranks[(layer["layer"], "v")] = opt["rank_v"]
        models.add(opt["cost_model"])
    advised = any(a["kind"] == "kv_cache_summary" for a in report.get("advice", []))
    model = models.pop() if len(models) == 1 else CostModel.PER_SEQUENCE
    how = "its sequences stacked" if model == CostModel.SHARED else "max over its sequences"
    source = (f"the report's KV advice ({target.keys.label_for(target.rope)} + values: "
              f"rank_eps per KV head at eps {variant['eps']:g}, {how}, "
              f"{variant.get('batch_size') or '?'} probe sequences of T = {T})")
    return ranks, advised, source, model


def _why_no_kv_heads(target: ZooTarget) -> str:
    """Why a report lacks a KV block's per-KV-head figures: the block offers none (the
    probe measures them through its optional key_value_heads), or the probe is older."""
    if not callable(getattr(target.blocks[0], "key_value_heads", None)):
        return f"{target.block_kind} blocks offer no per-KV-head figures"
    return "a probe from an older rankzoo? re-probe"


def _state_ranks(variant: dict, T: int, target: ZooTarget,
                 notes: list[str]) -> tuple[dict, bool, str, CostModel] | None:
    """(ranks, advised, source, cost model) implied by the inference row of a block
    without KV advice (its facts' state_row); None when a layer's rank is undecided."""
    quantity = zoo.facts_of(target.block_kind).state_row
    slots = {s.layer: s for s in target.slots}
    ranks = {}
    for layer in variant["layers"]:
        row = next((r for r in layer["axes"] if r["quantity"] == quantity), None)
        m = None if row is None else row.get("realized_max_sample")
        if m is None or row.get("lower_bound"):
            notes.append(f"the report has no decided {quantity} rank for layer "
                         f"{layer['layer']}: no ranks to check")
            return None
        s = slots[layer["layer"]]
        ranks[s.key] = [min(max(1, _ceil(m)), s.width)] * s.heads
    source = (f"the report's {quantity} rank (rank_eps max over samples and heads at eps "
              f"{variant['eps']:g}, T = {T}); the report gives no "
              f"low-rank advice for {target.block_kind}: the ranks its figures imply")
    return ranks, False, source, CostModel.PER_SEQUENCE


def hf_prediction(target: HFTarget, cal: Calibration, eps: float, nbytes: int, T: int,
                  command: str) -> dict:
    """The ranks `rankzoo report --hf` advises on the calibration batch (the same figures:
    rank_eps per KV head of its sequences stacked at eps, rounded up, by kv_option)."""
    key = target.keys.field
    ranks = {}
    for i, layer in target.at.items():  # the attention layers, by the model's numbers
        _, G, K, V = layer.shape
        kv = {"n_kv_heads": G, "head_dim": K, "v_head_dim": V, "rope": target.rope,
              key: {"rank_eps_pooled": cal.stats[(i, "k")].rank_eps_pooled(eps)},
              "v": {"rank_eps_pooled": cal.stats[(i, "v")].rank_eps_pooled(eps)}}
        opt = kv_option(kv, key, nbytes, T)
        ranks[(i, "k")], ranks[(i, "v")] = opt["rank_k"], opt["rank_v"]
    return {"ranks": ranks, "seq_len": T, "cost_model": CostModel.SHARED, "advised": True,
            "withheld": None,
            "source": f"the KV advice of `{command}` ({target.keys.label_for(target.rope)} "
                      f"+ values: rank_eps per KV head at eps {eps:g} of the "
                      f"{cal.sequences} calibration sequences stacked)"}
