"""Claim: multi-head attention widens the effective rank, but its heads are largely
redundant.

Read on the values the heads carry, per layer: rank_0.01 of the stacked value cache of
all key/value heads ([T, G V], `inference.v`) against each head's own ([T, V],
`kv_heads.v`). Widening: the joint rank exceeds the largest head's by 25%. Redundancy:
the overlap (joint - max head) / (sum of heads - max head), 0 when every head spans the
same directions and 1 when none share any; "largely redundant" is an overlap at most
0.5. This reads redundancy of the heads' value subspaces, not of their attention
patterns (rankzoo measures no pattern similarity); layers of one KV head are skipped.
"""

from __future__ import annotations

from .evidence import Evidence, quantity
from .rule import HOLDS, PARTLY, REFUTED, Claim, Outcome, fmt, missing

THRESHOLDS = {"widen": 1.25, "widen_share": 0.75, "redundant": 0.5}


def layer_heads(layer: dict) -> tuple[float, list[float]] | None:
    """(joint value rank, per KV head ranks) of a layer with >= 2 KV heads, else None."""
    joint, heads = quantity(layer, "inference.v"), (layer.get("kv_heads") or {}).get("v")
    if joint is None or not heads or len(heads.get("rank_eps", [])) < 2:
        return None
    return sum(joint["rank_eps"]) / len(joint["rank_eps"]), list(heads["rank_eps"])


def independence(joint: float, per_head: list[float]) -> float:
    """0: the heads span one subspace; 1: disjoint subspaces."""
    top, total = max(per_head), sum(per_head)
    return 0.0 if total == top else min(1.0, max(0.0, (joint - top) / (total - top)))


def judge(ev: Evidence) -> Outcome:
    found = [(n, p, [h for h in map(layer_heads, p["layers"]) if h]) for n, p, _ in ev.probes()]
    found = [f for f in found if f[2]]
    if not found:
        return missing("a probe of a model with >= 2 key/value heads (--hf, or the runs)")
    name, probe, layers = found[0]
    widen = [j / max(h) for j, h in layers]
    indep = sorted(independence(j, h) for j, h in layers)
    median = indep[len(indep) // 2]
    wide = sum(w >= THRESHOLDS["widen"] for w in widen) / len(widen)
    figure = (f"joint/max-head value rank {fmt(min(widen))}-{fmt(max(widen))}; "
              f"head overlap index {fmt(median)} (0 redundant, 1 disjoint)")
    test = "rank_0.01 of all heads' values vs each head's"
    used = f"{name}: {len(layers)} layers, {len(layers[0][1])} KV heads, T = {probe['seq_len']}"
    data = {"widening": widen, "independence": indep}
    a, b = wide >= THRESHOLDS["widen_share"], median <= THRESHOLDS["redundant"]
    if a and b:
        return Outcome(HOLDS, figure, test, used=used, data=data)
    if a or b:
        why = "widens, but heads are not redundant" if a else "redundant, but no widening"
        return Outcome(PARTLY, figure, test, why=why, used=used, data=data)
    return Outcome(REFUTED, figure, test, why="no widening, no redundancy", used=used,
                   data=data)


CLAIM = Claim(
    name="heads",
    sentence="Multi-head attention widens the effective rank, but heads are largely "
             "redundant.",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="per layer, rank_eps of the stacked value cache of all KV heads vs each head's",
    metrics="docs/METRICS.md#claims",
    rule="widens: joint >= 1.25 x the largest head on >= 75% of layers; redundant: median "
         "overlap index <= 0.5; both: holds; one: holds partly; none: refuted",
    thresholds=THRESHOLDS,
    evidence=("hf", "runs"),
    judge=judge,
)
