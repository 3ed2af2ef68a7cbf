"""Claim: after the training loss saturates, W_V's effective rank keeps falling to the
task's rank, and test accuracy jumps when it gets there.

Read on configs/claims/grokking.yaml (modular addition mod 47, half the pairs trained full
batch, AdamW with weight decay 2, seeds 0 and 1): per seed, the train loss and validation
accuracy over steps (TensorBoard) and W_V's erank, mean over layers, at every rank record.
"The task's rank" has no definition for modular addition (Nanda et al. 2023 find a few
Fourier frequencies, not a rank), so that part is not tested; the rest is: does the rank
fall after saturation, and does the jump come when the rank reaches its floor? Each seed
is judged alone; seeds whose verdicts differ make the claim `holds partly`, and the why
says so.
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


def judge_run(run: Run) -> tuple[str, str, str, dict]:
    """(verdict, figure, why, data) of one seed's run."""
    acc, loss, rank = run.scalars["val/accuracy"], run.scalars.get("train/loss", []), curve(run)
    s_sat = first(loss, lambda v: v <= THRESHOLDS["saturated"])
    s_grok = first(acc, lambda v: v >= THRESHOLDS["grokked"])
    seed = f"seed {run.seed}: "
    if s_grok is None or s_sat is None:
        return (UNTESTABLE, f"{seed}val accuracy peaked at {fmt(max(v for _, v in acc))}",
                "the run did not grok (or never saturated)", {})
    if s_grok - s_sat < THRESHOLDS["delay"]:
        return (UNTESTABLE, f"{seed}saturated at {s_sat}, generalized at {s_grok}",
                "no delay between memorizing and generalizing: not grokking", {})
    before, after = at(rank, s_sat), at(rank, s_grok)
    floor = min(v for _, v in rank) * THRESHOLDS["floor"]
    s_floor = first(rank, lambda v: v <= floor)
    interval = rank[1][0] - rank[0][0] if len(rank) > 1 else 1
    falls = after <= (1 - THRESHOLDS["fall"]) * before
    together = abs(s_floor - s_grok) <= THRESHOLDS["near"] * interval
    figure = (f"{seed}loss saturated at step {s_sat}, jump at {s_grok}; W_V erank "
              f"{fmt(before)} -> {fmt(after)}, floor {fmt(min(v for _, v in rank))} reached "
              f"at {s_floor}")
    data = {"saturated": s_sat, "grokked": s_grok, "floor_step": s_floor,
            "erank_saturated": before, "erank_grokked": after}
    if falls and together:
        return PARTLY, figure, f"{seed}falls, and the jump comes at the floor", data
    if falls:
        return PARTLY, figure, f"{seed}falls, but the jump is not at the floor", data
    return (REFUTED, figure, f"{seed}W_V's rank does not fall by 10% between saturation and "
            f"the jump", data)


def judge(ev: Evidence) -> Outcome:
    runs = sorted((r for r in ev.of(EXPERIMENT) if r.scalars.get("val/accuracy")),
                  key=lambda r: r.seed)
    if not runs:
        return missing(f"the runs of {EXPERIMENT} (configs/claims/grokking.yaml)")
    judged = {r.seed: judge_run(r) for r in runs}
    plot = {"kind": "grokking", "seeds": {str(r.seed): {
        "accuracy": r.scalars["val/accuracy"], "erank": curve(r),
        "train_loss": r.scalars.get("train/loss", [])} for r in runs}}
    seeds = ", ".join(str(s) for s in judged)
    used = (f"{EXPERIMENT}: seeds {seeds}; {max(curve(r)[-1][0] for r in runs)} steps; "
            f"W_V of every layer" + ("; one seed" if len(runs) == 1 else ""))
    test = "W_V erank at saturation vs at the jump; the jump vs the rank's floor"
    tested = {j[0] for j in judged.values() if j[0] != UNTESTABLE}
    # no seed grokked: not testable; seeds whose verdicts differ (one's rank falls, the
    # other's does not): holds partly, said; a seed that did not grok is said beside
    verdict = (UNTESTABLE if not tested else tested.pop() if len(tested) == 1 else PARTLY)
    whys = [j[2] for j in judged.values()]
    if len({j[0] for j in judged.values()}) > 1:
        whys.append("the seeds disagree")
    if verdict != UNTESTABLE:
        whys.append("the task's rank is undefined for modular addition")
    return Outcome(verdict, "; ".join(j[1] for j in judged.values()), test,
                   why="; ".join(whys), used=used, plot=plot,
                   data={"seeds": {str(s): j[3] for s, j in judged.items()}})


CLAIM = Claim(
    name="grokking",
    sentence="After the training loss saturates, W_V's effective rank keeps falling to the "
             "task's rank, and test accuracy jumps when it gets there.",
    source="the low-rank-bottleneck theory rankzoo starts from",
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
