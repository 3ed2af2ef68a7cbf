"""Claim: after the training loss saturates, W_V's effective rank keeps falling to the
task's rank, and test accuracy jumps when it gets there.

Read on configs/claims/grokking.yaml (modular addition mod 31, full batch, AdamW with
weight decay 1): the train loss and validation accuracy over steps (TensorBoard) and
W_V's erank, mean over layers, at every rank record. "The task's rank" has no definition
for modular addition (Nanda et al. 2023 find a few Fourier frequencies, not a rank), so
that part is not tested; the rest is: does the rank fall after saturation, and does the
jump come when the rank reaches its floor?
"""

from __future__ import annotations

from .evidence import Evidence, Run, value_figures
from .rule import PARTLY, REFUTED, UNTESTABLE, Claim, Outcome, fmt, missing

EXPERIMENT = "claims_grokking"
THRESHOLDS = {"saturated": 0.05,  # train loss at or below: saturated
              "grokked": 0.95,  # validation accuracy at or above: generalized
              "delay": 200,  # steps from saturation to the jump, at least: grokking
              "fall": 0.10,  # erank at the jump >= 10% below its value at saturation
              "floor": 1.05,  # the floor: within 5% of the run's lowest erank
              "near": 2}  # the jump within this many rank records of reaching the floor


def first(series: list[tuple[int, float]], test) -> int | None:
    return next((s for s, v in series if test(v)), None)


def at(series: list[tuple[int, float]], step: int) -> float:
    """The value at the record nearest `step`."""
    return min(series, key=lambda sv: abs(sv[0] - step))[1]


def curve(run: Run) -> list[tuple[int, float]]:
    return [(r["step"], value_figures(r)["erank"]) for r in run.records]


def judge(ev: Evidence) -> Outcome:
    runs = [r for r in ev.of(EXPERIMENT) if r.scalars.get("val/accuracy")]
    if not runs:
        return missing(f"the run of {EXPERIMENT} (configs/claims/grokking.yaml)")
    run = runs[0]
    acc, loss, rank = run.scalars["val/accuracy"], run.scalars.get("train/loss", []), curve(run)
    s_sat = first(loss, lambda v: v <= THRESHOLDS["saturated"])
    s_grok = first(acc, lambda v: v >= THRESHOLDS["grokked"])
    plot = {"kind": "grokking", "accuracy": acc, "erank": rank, "train_loss": loss}
    used = f"{EXPERIMENT}/{run.name}: seed {run.seed}, {rank[-1][0]} steps, one seed"
    test = "W_V erank at saturation vs at the jump; the jump vs the rank's floor"
    if s_grok is None or s_sat is None:
        return Outcome(UNTESTABLE, f"val accuracy peaked at {fmt(max(v for _, v in acc))}",
                       test, why="the run did not grok (or never saturated)", used=used,
                       plot=plot)
    if s_grok - s_sat < THRESHOLDS["delay"]:
        return Outcome(UNTESTABLE, f"saturated at {s_sat}, generalized at {s_grok}", test,
                       why="no delay between memorizing and generalizing: not grokking",
                       used=used, plot=plot)
    before, after = at(rank, s_sat), at(rank, s_grok)
    floor = min(v for _, v in rank) * THRESHOLDS["floor"]
    s_floor = first(rank, lambda v: v <= floor)
    interval = rank[1][0] - rank[0][0] if len(rank) > 1 else 1
    falls = after <= (1 - THRESHOLDS["fall"]) * before
    together = abs(s_floor - s_grok) <= THRESHOLDS["near"] * interval
    figure = (f"loss saturated at step {s_sat}, jump at {s_grok}; W_V erank {fmt(before)} -> "
              f"{fmt(after)}, floor reached at {s_floor}")
    data = {"saturated": s_sat, "grokked": s_grok, "floor_step": s_floor,
            "erank_saturated": before, "erank_grokked": after}
    why = "the task's rank is undefined for modular addition"
    if falls and together:
        return Outcome(PARTLY, figure, test, why=f"falls, and the jump comes at the floor; "
                       f"{why}", used=used, plot=plot, data=data)
    if falls:
        return Outcome(PARTLY, figure, test, why=f"falls, but the jump is not at the floor; "
                       f"{why}", used=used, plot=plot, data=data)
    return Outcome(REFUTED, figure, test, why=f"W_V's rank does not fall by 10% between "
                   f"saturation and the jump; {why}", used=used, plot=plot, data=data)


CLAIM = Claim(
    name="grokking",
    sentence="After the training loss saturates, W_V's effective rank keeps falling to the "
             "task's rank, and test accuracy jumps when it gets there.",
    source="the seed theory of rankzoo (issue 39)",
    quantity="W_V erank (mean over layers) over training, beside validation accuracy and "
             "train loss",
    metrics="docs/METRICS.md#claims",
    rule="saturated: train loss <= 0.05; grokked: val accuracy >= 0.95, >= 200 steps later; "
         "falls: erank at the jump >= 10% below at saturation; at the floor: within 2 "
         "records of reaching 1.05 x the lowest erank. The task's rank is undefined, so at "
         "best holds partly; no fall: refuted; no grokking: not testable",
    thresholds=THRESHOLDS,
    evidence=("runs",),
    judge=judge,
)
