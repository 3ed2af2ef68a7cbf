"""Claim: at 4k tokens, attention's effective rank is below 3% of T.

The quantity: rank_0.01 of the centered mixing matrix P_c per head, as a share of T, on
a probe of T >= 4096 tokens (at that length the probe goes matrix-free and decides
rank_eps up to k_max values, well above 3% of 4096 = 123). A probe shorter than 4096
tokens cannot test a claim about 4k tokens.
"""

from __future__ import annotations

from .evidence import Evidence, quantity
from .rule import HOLDS, PARTLY, REFUTED, UNTESTABLE, Claim, Outcome, missing

THRESHOLDS = {"eps": 0.01, "min_seq_len": 4096, "share_of_t": 0.03,
              "holds": 0.9, "refuted": 0.1}  # shares of heads below 3% of T


def shares(probe: dict) -> list[float]:
    T = probe["seq_len"]
    out = []
    for layer in probe["layers"]:
        q = quantity(layer, "mixing_centered")
        if q is not None:
            out += [r / T for r in q["rank_eps"]]
    return out


def judge(ev: Evidence) -> Outcome:
    if ev.probed is None:
        return missing("--hf MODEL --text FILE --seq-len 4096")
    probe = ev.probed.probe
    T = probe["seq_len"]
    test = "rank_0.01(P_c) / T < 3% per head, T >= 4096"
    if THRESHOLDS["min_seq_len"] > T or abs(probe["eps"] - THRESHOLDS["eps"]) > 1e-12:
        return Outcome(UNTESTABLE, f"probed at T = {T}", test,
                       why=f"the claim is about 4k tokens; probe at --seq-len 4096 (T = {T} "
                           f"here)", used=ev.probed.name)
    s = shares(probe)
    if not s:
        return Outcome(UNTESTABLE, "no attention heads", test, used=ev.probed.name)
    below = sum(x < THRESHOLDS["share_of_t"] for x in s) / len(s)
    figure = f"{below:.0%} of heads below 3% of T (median {sorted(s)[len(s) // 2]:.1%})"
    used = f"{ev.probed.name}: {len(s)} heads x layers, T = {T}"
    verdict = (HOLDS if below >= THRESHOLDS["holds"] else
               REFUTED if below <= THRESHOLDS["refuted"] else PARTLY)
    why = "" if verdict != PARTLY else f"holds on {below:.0%} of heads"
    return Outcome(verdict, figure, test, why=why, used=used, data={"shares": s})


CLAIM = Claim(
    name="long_context",
    sentence="At 4k tokens, attention's effective rank is below 3% of T.",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="rank_0.01(P_c) / T per head, on a probe of >= 4096 tokens",
    metrics="docs/METRICS.md#claims",
    rule="share of heads below 3% of T: >= 90% holds, <= 10% refuted, else holds partly; "
         "a probe below 4096 tokens or at another eps: not testable as stated",
    thresholds=THRESHOLDS,
    evidence=("hf",),
    judge=judge,
)
