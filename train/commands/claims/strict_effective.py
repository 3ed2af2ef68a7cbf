"""Claim: causal softmax attention is strictly full rank, yet effectively low rank.

Strict: P is lower triangular with P_tt = exp(s_tt) / sum_j exp(s_tj) > 0, so det P, the
product of its diagonal, is positive: P is invertible whatever the scores, barring
underflow. That half holds by construction and no figure can refute it; the probe's
numerical rank (singular values above s_1 max(m, n) eps_fp32) is printed beside it as P's
conditioning, not as its rank. A first version of this rule read that numerical rank as
the strict rank and returned "refuted" for trained models whose P had 91-98% of T values
above fp32's floor: ill-conditioned, not singular. Effective: rank_0.01 of the centered
P_c, as a share of T. "Low" is not quantified by the claim; we fix it at a quarter of T
before any run.
"""

from __future__ import annotations

from budgets.report.kinds import mirror_kind

from .evidence import Evidence, quantity
from .rule import HOLDS, PARTLY, Claim, Outcome, missing

THRESHOLDS = {
    "eps": 0.01,  # the probe's eps must be this one
    "full": 0.999,  # numerical rank >= this share of T: well conditioned (shown, not judged)
    "low": 0.25,  # rank_0.01(P_c) <= this share of T counts as effectively low
    "share": 0.9,  # each half holds on at least this share of heads
}


# the layers whose mixing is a causal softmax: the zoo's attention blocks, and the layers
# a Hugging Face report names global, sliding or chunked (its other kinds are recurrences
# and scans, whose M can be singular, and DSA's top-k, which need not keep the diagonal)
SOFTMAX_BLOCKS = ("softmax", "sliding_window", "mla", "moe")
SOFTMAX_KINDS = ("global", "sliding", "chunked")


def is_softmax(layer: dict) -> bool:
    kind = layer.get("kind") if isinstance(layer.get("kind"), dict) else {}
    if "attention" in kind:
        return mirror_kind(kind) in SOFTMAX_KINDS
    return (kind.get("zoo_block") or layer.get("block")) in SOFTMAX_BLOCKS


def head_shares(probe: dict) -> tuple[list[float], list[float]]:
    """(numerical rank / T, rank_eps(P_c) / T) per head of every attention layer."""
    T = probe["seq_len"]
    strict, effective = [], []
    for layer in filter(is_softmax, probe["layers"]):
        raw, centered = quantity(layer, "mixing"), quantity(layer, "mixing_centered")
        if raw is None or centered is None or raw.get("shape", [T])[0] != T:
            continue
        strict += [r / T for r in raw["numerical_rank"]]
        effective += [r / T for r in centered["rank_eps"]]
    return strict, effective


def judge(ev: Evidence) -> Outcome:
    probes = [(n, p) for n, p, _ in ev.probes() if abs(p["eps"] - THRESHOLDS["eps"]) < 1e-12]
    probes = [(n, p, *head_shares(p)) for n, p in probes]
    probes = [x for x in probes if x[2]]
    if not probes:
        return missing(f"a probe at eps {THRESHOLDS['eps']} of an attention model (--hf, or "
                       f"the claims runs)")
    name, probe, strict, effective = probes[0]
    n = len(strict)
    conditioned = sum(s >= THRESHOLDS["full"] for s in strict) / n
    low = sum(e <= THRESHOLDS["low"] for e in effective) / n
    figure = (f"full rank by construction (positive diagonal); numerical rank >= 0.999 T in "
              f"{conditioned:.0%} of heads (median {sorted(strict)[n // 2]:.0%} of T); "
              f"rank_0.01(P_c) <= T/4 in {low:.0%} (median {sorted(effective)[n // 2]:.1%} "
              f"of T)")
    test = "P's diagonal > 0 (det P > 0); rank_0.01(P_c) / T <= 0.25"
    used = f"{name}: {n} heads x layers, T = {probe['seq_len']}"
    data = {"conditioned_share": conditioned, "low_share": low, "strict": strict,
            "effective": effective}
    plot = {"kind": "strict_effective", "strict": strict, "effective": effective}
    if low >= THRESHOLDS["share"]:
        return Outcome(HOLDS, figure, test, used=used, plot=plot, data=data)
    return Outcome(PARTLY, figure, test, why="strictly full rank (by construction), not "
                   "effectively low", used=used, plot=plot, data=data)


CLAIM = Claim(
    name="strict_effective",
    sentence="Causal softmax attention is strictly full rank, yet effectively low rank.",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="P's diagonal (strict rank), and rank_0.01 of P_c as a share of T, per head",
    metrics="docs/METRICS.md#claims",
    rule="full: holds by construction (a causal softmax has a positive diagonal); low: "
         "rank_0.01(P_c) <= T/4 on >= 90% of heads: holds, else holds partly; the numerical "
         "rank (>= 0.999 T) is shown as conditioning",
    thresholds=THRESHOLDS,
    evidence=("hf", "runs"),
    judge=judge,
)
