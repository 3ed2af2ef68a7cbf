"""Verdicts and advice: what the declared-vs-realized figures of a report mean.

    annotate(report)                      # adds verdicts, "collapsed", "advice", "thresholds"
    annotate(report, VerdictThresholds(saturated=0.8))

Per axis row, from utilization u = realized (mean over heads) / declared:
  saturated         u >= saturated (0.9): the cap binds; more rank might help
  healthy           between the two
  over-provisioned  u < over_provisioned (0.25): most of the declared rank goes unused
Per layer: collapsed when the centered mixing erank <= collapsed_erank (2): the layer mixes
tokens along at most ~2 directions (rank collapse, Dong et al. 2021). The centered erank is
used because raw softmax matrices read rank ~1 whenever attention is near-uniform.

Advice is computed from the figures only, using realized_max (max over heads, rounded up)
so that no head the model uses would be cut off:
  kv_cache      per variant: sum of declared inference caps / sum of realized inference ranks
  lora_rank     per variant with adapters: the largest realized adapter rank, vs declared r
  cheaper_block per layer: past_future realized max m <= cheaper_block_util * declared, so a
                block whose state caps that rank at m (linear attention's F, an SSM's N:
                their mixing matrices are m-semiseparable) could represent what the layer
                realized. Not a window: a low-rank past->future block says nothing about
                locality, and a window's rank bound W - 1 does not work the other way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

VERDICTS = ("saturated", "healthy", "over-provisioned")


@dataclass(frozen=True)
class VerdictThresholds:
    saturated: float = 0.9          # utilization >= this: the cap binds
    over_provisioned: float = 0.25  # utilization < this: the cap is mostly unused
    collapsed_erank: float = 2.0    # centered mixing erank <= this: the layer collapsed
    cheaper_block_util: float = 0.5  # suggest a cheaper block only if it at least halves the cap
    min_compression: float = 1.25   # advise a low-rank KV cache only from this ratio up

    def __post_init__(self) -> None:
        if not 0.0 <= self.over_provisioned < self.saturated:
            raise ValueError(f"need 0 <= over_provisioned ({self.over_provisioned}) < "
                             f"saturated ({self.saturated})")
        if not 0.0 < self.cheaper_block_util <= 1.0:
            raise ValueError(f"cheaper_block_util must lie in (0, 1], "
                             f"got {self.cheaper_block_util}")


def axis_verdict(utilization: float | None, th: VerdictThresholds) -> str | None:
    """The verdict of one axis row; None when there is no utilization (zero cap)."""
    if utilization is None:
        return None
    if utilization >= th.saturated:
        return "saturated"
    return "over-provisioned" if utilization < th.over_provisioned else "healthy"


def is_collapsed(centered_erank: float | None, th: VerdictThresholds) -> bool:
    return centered_erank is not None and centered_erank <= th.collapsed_erank


def _realized(row: dict) -> int:
    # rank_eps is an integer per head; the max over heads is too, ceil guards float noise.
    return math.ceil((row.get("realized_max") or 0) - 1e-9)


def _rows(variant: dict, axis: str):
    for layer in variant["layers"]:
        for row in layer["axes"]:
            if row["axis"] == axis:
                yield layer, row


def kv_cache_advice(variant: dict, th: VerdictThresholds) -> list[dict]:
    rows = [row for _, row in _rows(variant, "inference")]
    declared, realized = sum(r["declared"] for r in rows), sum(_realized(r) for r in rows)
    if not rows or realized <= 0 or declared < th.min_compression * realized:
        return []
    ratio = declared / realized
    return [{"kind": "kv_cache", "variant": variant["variant"], "declared": declared,
             "realized": realized, "ratio": ratio,
             "text": f"{variant['variant']}: inference state realizes rank {realized} of "
                     f"{declared} declared (sum over layers): a low-rank cache could be "
                     f"~{ratio:.1f}x smaller"}]


def lora_advice(variant: dict) -> list[dict]:
    rows = [row for _, row in _rows(variant, "adapter")]
    if not rows:
        return []
    declared, realized = max(r["declared"] for r in rows), max(_realized(r) for r in rows)
    suggested = max(1, realized)
    tail = (f"r = {suggested} would serve" if suggested < declared
            else f"r = {declared} binds; try a larger r")
    return [{"kind": "lora_rank", "variant": variant["variant"], "declared": declared,
             "realized": realized, "suggested": suggested,
             "text": f"{variant['variant']}: adapters realize rank <= {realized} of "
                     f"r = {declared}: {tail}"}]


def cheaper_block_advice(variant: dict, th: VerdictThresholds) -> list[dict]:
    out = []
    for layer, row in _rows(variant, "mixing"):
        m = _realized(row)
        if row["declared"] and m <= th.cheaper_block_util * row["declared"]:
            state = max(m, 1)
            out.append({"kind": "cheaper_block", "variant": variant["variant"],
                        "layer": layer["layer"], "realized": m, "declared": row["declared"],
                        "state": state,
                        "text": f"{variant['variant']} layer {layer['layer']}: the past->future "
                                f"mixing realizes rank <= {m} of {row['declared']}: a state of "
                                f"{state} (linear attention's F, an SSM's N) caps the same rank"})
    return out


def collapse_advice(variant: dict) -> list[dict]:
    return [{"kind": "collapsed", "variant": variant["variant"], "layer": layer["layer"],
             "erank": layer["mixing_centered_erank"],
             "text": f"{variant['variant']} layer {layer['layer']}: centered mixing erank "
                     f"{layer['mixing_centered_erank']:.2f}: token mixing has collapsed"}
            for layer in variant["layers"] if layer.get("collapsed")]


def annotate(report: dict, thresholds: VerdictThresholds | None = None) -> dict:
    """Add verdicts per axis row, `collapsed` per layer, and the advice list, in place.

    Recomputed from the figures every time, so a report read from disk gets the verdicts
    of the thresholds in use now, and merged reports get advice for all their variants.
    """
    th = thresholds or VerdictThresholds()
    advice: list[dict] = []
    for v in report["variants"]:
        for layer in v["layers"]:
            layer["collapsed"] = is_collapsed(layer.get("mixing_centered_erank"), th)
            for row in layer["axes"]:
                row["verdict"] = axis_verdict(row["utilization"], th)
        advice += (collapse_advice(v) + cheaper_block_advice(v, th) + kv_cache_advice(v, th)
                   + lora_advice(v))
    report["thresholds"] = asdict(th)
    report["advice"] = advice
    return report
