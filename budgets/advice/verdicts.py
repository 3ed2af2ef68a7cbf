"""Verdicts: what the declared-vs-realized figures of a report say, row by row and layer
by layer (the advice built on them, and `annotate`, are budgets/advice/annotate.py's).

    th = VerdictThresholds(saturated=0.8, cache_dtype="float16")
    annotate_verdicts(report, th)         # a verdict per axis row, head classes and
                                          # `collapsed` per layer, in place

Per axis row, from utilization u = realized (mean over heads) / declared:
  saturated         u >= saturated (0.9): the cap binds; more rank might help
  healthy           between the two
  over-provisioned  u < over_provisioned (0.25): most of the declared rank goes unused
Per layer: heads are classified (budgets/advice/head_classes.py; the rules go to
report["head_rules"]); heads whose centered energy is below HeadRules.dead_energy of the
raw have no valid centered figures, so mixing_centered_erank averages the other heads
(null if none) and "centered_na" says how many were left out. collapsed: that centered
mixing erank <= collapsed_erank (2): the layer mixes tokens along at most ~2 directions
(rank collapse, Dong et al. 2021); raw softmax ranks read ~1 whenever attention is
near-uniform.
Past->future ranks are flat over the probe's lengths when `is_flat` (the cheaper-block
advice asks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cache import DTYPE_BYTES
from .head_classes import HeadRules, classify_heads

VERDICTS = ("saturated", "healthy", "over-provisioned")


@dataclass(frozen=True)
class VerdictThresholds:
    saturated: float = 0.9          # utilization >= this: the cap binds
    over_provisioned: float = 0.25  # utilization < this: the cap is mostly unused
    collapsed_erank: float = 2.0    # centered mixing erank <= this: the layer collapsed
    cheaper_block_util: float = 0.5  # suggest a cheaper block only if it at least halves the cap
    min_compression: float = 1.25   # advise a low-rank KV cache only from this ratio up (at T)
    solved_fraction: float = 0.9    # solved: the way from the task's baseline to perfect
    flat_abs: float = 1.0           # past->future rank flat over T: grows by at most
    flat_rel: float = 0.1           # max(flat_abs, flat_rel * rank at the shortest length)
    cache_dtype: str = "bfloat16"   # the dtype the KV bytes are counted in
    heads: HeadRules = HeadRules()  # head classes (budgets/advice/head_classes.py)

    def __post_init__(self) -> None:
        if not 0.0 <= self.over_provisioned < self.saturated:
            raise ValueError(f"need 0 <= over_provisioned ({self.over_provisioned}) < "
                             f"saturated ({self.saturated})")
        if not 0.0 < self.cheaper_block_util <= 1.0:
            raise ValueError(f"cheaper_block_util must lie in (0, 1], "
                             f"got {self.cheaper_block_util}")
        if not 0.0 < self.solved_fraction <= 1.0:
            raise ValueError(f"solved_fraction must lie in (0, 1], got {self.solved_fraction}")
        if self.flat_abs < 0 or self.flat_rel < 0:
            raise ValueError(f"flat_abs ({self.flat_abs}) and flat_rel ({self.flat_rel}) "
                             f"must be >= 0")
        if self.cache_dtype not in DTYPE_BYTES:
            raise ValueError(f"cache_dtype {self.cache_dtype!r} is not one of "
                             f"{sorted(DTYPE_BYTES)}")

    @property
    def cache_bytes(self) -> int:
        return DTYPE_BYTES[self.cache_dtype]


def axis_verdict(utilization: float | None, th: VerdictThresholds) -> str | None:
    """The verdict of one axis row; None when there is no utilization (zero cap)."""
    if utilization is None:
        return None
    if utilization >= th.saturated:
        return "saturated"
    return "over-provisioned" if utilization < th.over_provisioned else "healthy"


def is_collapsed(centered_erank: float | None, th: VerdictThresholds) -> bool:
    return centered_erank is not None and centered_erank <= th.collapsed_erank


def is_flat(at_shortest: float, at_T: float, th: VerdictThresholds) -> bool:
    """Whether a past->future rank stays flat from the shortest probed length to T."""
    return at_T <= at_shortest + max(th.flat_abs, th.flat_rel * at_shortest)


# ---------------------------------------------------------------- a report's verdicts

def _centered_view(layer: dict, rules: HeadRules) -> None:
    """Classify the heads; average the centered erank over the heads where it is valid."""
    heads = classify_heads(layer["heads"], rules)
    erank, ok = heads.get("centered_erank"), heads["centered_ok"]
    layer.pop("centered_na", None)
    if erank is None or all(x is None for x in erank):
        return  # nothing per head to average: keep the probe's layer mean
    kept = [e for e, good in zip(erank, ok, strict=True) if good and e is not None]
    layer["mixing_centered_erank"] = sum(kept) / len(kept) if kept else None
    if not all(ok):
        layer["centered_na"] = (f"{ok.count(False)} of {len(ok)} heads: centered energy < "
                                f"{rules.dead_energy:g} of raw")


def annotate_verdicts(report: dict, th: VerdictThresholds) -> None:
    """Add head classes and `collapsed` per layer and a verdict per axis row, in place."""
    for variant in report["variants"]:
        for layer in variant["layers"]:
            if layer.get("heads"):
                _centered_view(layer, th.heads)
            layer["collapsed"] = is_collapsed(layer.get("mixing_centered_erank"), th)
            for row in layer["axes"]:
                row["verdict"] = axis_verdict(row["utilization"], th)
