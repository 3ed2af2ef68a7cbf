"""Claim: causal softmax attention is strictly full rank, yet effectively low rank.

Strict: the numerical rank of the raw mixing matrix P (s_i > s_1 max(m, n) eps_fp32)
equals T, per head and sequence (a positive diagonal makes it so exactly, barring
underflow). Effective: rank_0.01 of the centered P_c, as a share of T. "Low" is not
quantified by the claim; we fix it at a quarter of T before any run.
"""

from __future__ import annotations

from .evidence import Evidence, quantity
from .rule import HOLDS, PARTLY, REFUTED, Claim, Outcome, missing

THRESHOLDS = {
    "eps": 0.01,  # the probe's eps must be this one
    "full": 0.999,  # numerical rank >= this share of T counts as full (a batch mean)
    "low": 0.25,  # rank_0.01(P_c) <= this share of T counts as effectively low
    "share": 0.9,  # each half holds on at least this share of heads
}


def head_shares(probe: dict) -> tuple[list[float], list[float]]:
    """(numerical rank / T, rank_eps(P_c) / T) per head of every attention layer."""
    T = probe["seq_len"]
    strict, effective = [], []
    for layer in probe["layers"]:
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
    full = sum(s >= THRESHOLDS["full"] for s in strict) / n
    low = sum(e <= THRESHOLDS["low"] for e in effective) / n
    figure = (f"full rank in {full:.0%} of heads; rank_0.01(P_c) <= T/4 in {low:.0%} "
              f"(median {sorted(effective)[n // 2]:.1%} of T)")
    test = "numerical rank of P = T; rank_0.01(P_c) / T <= 0.25"
    used = f"{name}: {n} heads x layers, T = {probe['seq_len']}"
    data = {"full_share": full, "low_share": low, "strict": strict, "effective": effective}
    plot = {"kind": "strict_effective", "strict": strict, "effective": effective}
    a, b = full >= THRESHOLDS["share"], low >= THRESHOLDS["share"]
    if a and b:
        return Outcome(HOLDS, figure, test, used=used, plot=plot, data=data)
    if a or b:
        why = "strictly full rank, not effectively low" if a else "low, but not full rank"
        return Outcome(PARTLY, figure, test, why=why, used=used, plot=plot, data=data)
    return Outcome(REFUTED, figure, test, why="neither full rank nor low", used=used,
                   plot=plot, data=data)


CLAIM = Claim(
    name="strict_effective",
    sentence="Causal softmax attention is strictly full rank, yet effectively low rank.",
    source="the seed theory of rankzoo (issue 39)",
    quantity="numerical rank of P, and rank_0.01 of P_c as a share of T, per head",
    metrics="docs/METRICS.md#claims",
    rule="full: numerical rank >= 0.999 T; low: rank_0.01(P_c) <= T/4; each on >= 90% of "
         "heads; both: holds; one: holds partly; none: refuted",
    thresholds=THRESHOLDS,
    evidence=("hf", "runs"),
    judge=judge,
)
