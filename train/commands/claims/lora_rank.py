"""Claim: the right LoRA rank is r = a log(d_model), with a between 1 and 3.

"Right" is read as the smallest r whose fine-tune reaches a validation loss within 2% of
the best r's (configs/claims/lora.yaml: one pretrained model, fine-tuned with adapters
only at r = 1 ... 16). The base of the log is not stated: the natural log is the claim's
band, base 2 the lenient one.
"""

from __future__ import annotations

import math

from .evidence import Evidence
from .rule import HOLDS, PARTLY, REFUTED, UNTESTABLE, Claim, Outcome, fmt, missing

EXPERIMENT = "claims_lora"
THRESHOLDS = {"within": 0.02, "a": [1.0, 3.0], "min_ranks": 3}


def judge(ev: Evidence) -> Outcome:
    tunes = [r for r in ev.of(EXPERIMENT) if r.lora_rank is not None
             and "val/loss" in r.metrics]
    if len({t.lora_rank for t in tunes}) < THRESHOLDS["min_ranks"]:
        return missing(f"LoRA fine-tunes of {EXPERIMENT} at >= {THRESHOLDS['min_ranks']} "
                       f"ranks (configs/claims/lora.yaml)")
    if all(t.learned is False for t in tunes):  # r* would rank fine-tunes that all failed
        return Outcome(UNTESTABLE, f"no fine-tune learned ({len(tunes)} ranks)",
                       "smallest r within 2% of the best fine-tune val loss",
                       why="no fine-tune beat its task's baseline (report status "
                           "learned: false), so no rank is right; train longer",
                       used=f"{EXPERIMENT}: {len(tunes)} fine-tunes, one seed each")
    losses = sorted((t.lora_rank, t.metrics["val/loss"]) for t in tunes)
    best = min(loss for _, loss in losses)
    right = min(r for r, loss in losses if loss <= best * (1 + THRESHOLDS["within"]))
    d = tunes[0].d_model
    lo, hi = THRESHOLDS["a"]
    ln_band, log2_band = (lo * math.log(d), hi * math.log(d)), (lo * math.log2(d),
                                                                hi * math.log2(d))
    figure = f"r* = {right} at d_model {d}; a log d = {fmt(ln_band[0])}-{fmt(ln_band[1])}"
    test = "smallest r within 2% of the best fine-tune val loss, against [1, 3] x ln d"
    accuracy = {t.lora_rank: t.metrics["val/accuracy"] for t in tunes
                if "val/accuracy" in t.metrics}
    used = (f"{EXPERIMENT}: {len(losses)} fine-tunes, r = {[r for r, _ in losses]}, "
            f"one seed each" + ("; val accuracy " + ", ".join(
                f"{fmt(accuracy[r])} at r={r}" for r, _ in losses if r in accuracy)
                                if accuracy else ""))
    plot = {"kind": "lora", "points": [[r, loss] for r, loss in losses], "right": right,
            "band": list(ln_band)}
    data = {"losses": dict(losses), "accuracy": accuracy, "right": right, "ln_band": ln_band,
            "log2_band": log2_band}
    if ln_band[0] <= right <= ln_band[1]:
        return Outcome(HOLDS, figure, test, why="one seed per r", used=used, plot=plot,
                       data=data)
    if log2_band[0] <= right <= log2_band[1]:
        return Outcome(PARTLY, figure, test, why=f"only with log base 2 ({fmt(log2_band[0])}-"
                       f"{fmt(log2_band[1])}); the claim states no base", used=used,
                       plot=plot, data=data)
    return Outcome(REFUTED, figure, test, why="outside ln and log2 bands; the rank a task "
                   "needs depends on the task, which the formula leaves out", used=used,
                   plot=plot, data=data)


CLAIM = Claim(
    name="lora_rank",
    sentence="The right LoRA rank is r = a log(d_model), with a between 1 and 3.",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="the smallest adapter rank whose fine-tune val loss is within 2% of the best",
    metrics="docs/METRICS.md#claims",
    rule="r* in [ln d, 3 ln d]: holds; only in [log2 d, 3 log2 d]: holds partly; else "
         "refuted; >= 3 ranks; no fine-tune learned the task: not testable",
    thresholds=THRESHOLDS,
    evidence=("runs",),
    judge=judge,
)
