"""Claim: under cross-entropy, W_V's effective rank is bounded by the rank of the data's
covariance.

"The rank of the data's covariance" has no one reading for token data (the one-hot
covariance of V tokens has rank V - 1 whatever the language); we test the reading the
zoo can set: the Markov task whose next-token logits have rank r
(configs/claims/markov.yaml at r = 2, 4, 8, 16). The quantity: erank of W_V, the largest
over layers, at the end of each run.
"""

from __future__ import annotations

from .depth import spearman
from .evidence import Evidence, Run, layer_mean
from .rule import HOLDS, PARTLY, REFUTED, Claim, Outcome, fmt, missing

EXPERIMENT = "claims_markov"
THRESHOLDS = {"slack": 1.25,  # bounded: W_V erank <= 1.25 r
              "tracks": 0.8,  # follows r: Spearman rho(r, erank) >= 0.8
              "min_ranks": 3}


def wv_erank(run: Run) -> float:
    """The largest W_V erank over the layers of a run's last probe."""
    values = [layer_mean(layer, "value", "erank") for layer in run.last["layers"]]
    return max(v for v in values if v is not None)


def judge(ev: Evidence) -> Outcome:
    runs = [r for r in ev.of(EXPERIMENT) if r.data.get("task") == "markov"]
    points = sorted((int(r.data["rank"]), wv_erank(r), r.seed) for r in runs)
    ranks = sorted({p[0] for p in points})
    if len(ranks) < THRESHOLDS["min_ranks"]:
        return missing(f"runs of {EXPERIMENT}_r* at >= {THRESHOLDS['min_ranks']} logit "
                       f"ranks (configs/claims/markov.yaml)")
    bounded = [e <= THRESHOLDS["slack"] * r for r, e, _ in points]
    rho = spearman([p[0] for p in points], [p[1] for p in points])
    figure = ", ".join(f"r={r}: {fmt(e)}" for r, e, _ in points)
    test = "largest W_V erank against 1.25 x the data's logit rank r"
    seeds = sorted({p[2] for p in points})
    used = f"{EXPERIMENT}: {len(points)} runs, r = {ranks}, seeds {seeds}"
    plot = {"kind": "data_rank", "points": [[r, e] for r, e, _ in points]}
    data = {"points": [{"rank": r, "wv_erank": e, "seed": s} for r, e, s in points],
            "rho": rho}
    if all(bounded):
        return Outcome(HOLDS, figure, test, used=used, plot=plot, data=data)
    if rho >= THRESHOLDS["tracks"]:
        return Outcome(PARTLY, figure, test, why=f"W_V's rank grows with r (rho {rho:.2f}) "
                       f"but exceeds it at {bounded.count(False)} of {len(points)} runs",
                       used=used, plot=plot, data=data)
    return Outcome(REFUTED, figure, test, why=f"above 1.25 r at {bounded.count(False)} of "
                   f"{len(points)} runs, no trend with r (rho {rho:.2f}); the covariance "
                   "is read as the logit rank", used=used, plot=plot, data=data)


CLAIM = Claim(
    name="data_rank",
    sentence="Under cross-entropy, W_V's effective rank is bounded by the rank of the data's "
             "covariance.",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="erank of W_V (largest over layers) against the Markov task's logit rank r",
    metrics="docs/METRICS.md#claims",
    rule="bounded at every r (erank <= 1.25 r): holds; else Spearman rho(r, erank) >= 0.8: "
         "holds partly (tracks r, not bounded); else refuted; >= 3 ranks",
    thresholds=THRESHOLDS,
    evidence=("runs",),
    judge=judge,
)
