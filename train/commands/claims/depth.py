"""Claim: attention's effective rank falls with depth, settling at d/4 to d/3 after
layer 8 (85 -> 32 over GPT-2 Medium's layers).

The quantity: per layer, the mean over heads and probe sequences of rank_0.01 of the
centered mixing matrix P_c (the claim's rank_0.01, energy 1 - 0.01^2), read from a probe
taken at eps = 0.01 (`rankzoo claims --hf` probes at 0.01; the claims experiments monitor
at 0.01). "d" is not defined by the claim; we read it as d_model, and note that the
GPT-2 Medium figures (85 -> 32 at d_model 1024) already sit below d/4 = 256.
"""

from __future__ import annotations

from ...render.recall import spearman as rank_correlation
from .evidence import Evidence, layer_mean
from .rule import HOLDS, PARTLY, REFUTED, Claim, Outcome, fmt, missing

THRESHOLDS = {
    "eps": 0.01,  # the probe's eps must be this one
    "min_layers": 3,  # fewer layers have no depth trend
    "fall": 0.10,  # the last third's mean below the first third's by at least 10%
    "rho": -0.5,  # and Spearman's rho(layer, rank) at most this
    "plateau_from": 8,  # the plateau is read on layers > 8
    "plateau_band": [0.25, 1 / 3],  # rank / d_model inside this band
    "plateau_share": 0.75,  # on at least this share of those layers
}


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation, the project's one (train/render/recall.py); 0 where it
    has none (a flat side, fewer than 3 points): no trend."""
    rho = rank_correlation(x, y)
    return 0.0 if rho is None else rho


def depth_curve(probe: dict) -> list[float]:
    """Per layer: the mean rank_eps of the centered mixing matrix over heads."""
    values = [layer_mean(layer, "mixing_centered", "rank_eps") for layer in probe["layers"]]
    return [v for v in values if v is not None]


def falls(curve: list[float]) -> tuple[bool, float, float]:
    """(falls by the rule, rho, relative fall from the first third to the last)."""
    third = max(1, len(curve) // 3)
    first, last = sum(curve[:third]) / third, sum(curve[-third:]) / third
    drop = (first - last) / first if first > 0 else 0.0
    rho = spearman(list(range(len(curve))), curve)
    return drop >= THRESHOLDS["fall"] and rho <= THRESHOLDS["rho"], rho, drop


def plateau(curve: list[float], d_model: int) -> bool | None:
    """Whether layers past plateau_from sit in d/4..d/3 (None: no such layers)."""
    late = curve[THRESHOLDS["plateau_from"] + 1:]
    if not late:
        return None
    lo, hi = (b * d_model for b in THRESHOLDS["plateau_band"])
    inside = sum(lo <= v <= hi for v in late)
    return inside >= THRESHOLDS["plateau_share"] * len(late)


def judge(ev: Evidence) -> Outcome:
    probes = [(n, p, d) for n, p, d in ev.probes(THRESHOLDS["min_layers"])
              if abs(p["eps"] - THRESHOLDS["eps"]) < 1e-12]
    if not probes:
        return missing(f"a probe at eps {THRESHOLDS['eps']} of a model with >= "
                       f"{THRESHOLDS['min_layers']} layers (--hf, or the claims runs)")
    name, probe, d_model = probes[0]  # the checkpoint when given: the claim is about LMs
    curve = depth_curve(probe)
    ok, rho, drop = falls(curve)
    flat = plateau(curve, d_model)
    figure = f"{fmt(curve[0])} -> {fmt(curve[-1])} over {len(curve)} layers (rho {rho:+.2f})"
    test = f"rank_0.01(P_c) per layer; falls by >= 10% and rho <= {THRESHOLDS['rho']}"
    used = f"{name}: {len(curve)} layers, T = {probe['seq_len']}, {probe['batch_size']} seqs"
    plot = {"kind": "depth", "series": {n: depth_curve(p) for n, p, _ in probes}}
    data = {"curve": curve, "rho": rho, "fall": drop, "plateau": flat, "d_model": d_model}
    if flat is None:
        why = (f"the d/4..d/3 plateau after layer {THRESHOLDS['plateau_from']} needs more than "
               f"{THRESHOLDS['plateau_from'] + 1} layers; {name} has {len(curve)}")
        if not ok:
            return Outcome(REFUTED, figure, test, why=f"no fall with depth; {why}", used=used,
                           plot=plot, data=data)
        return Outcome(PARTLY, figure, test, why=f"falls with depth; {why}", used=used,
                       plot=plot, data=data)
    if ok and flat:
        return Outcome(HOLDS, figure, test, used=used, plot=plot, data=data)
    if ok or flat:
        why = "falls with depth, but not in d/4..d/3" if ok else "in d/4..d/3, but no fall"
        return Outcome(PARTLY, figure, test, why=why, used=used, plot=plot, data=data)
    return Outcome(REFUTED, figure, test, why="no fall with depth, not in d/4..d/3",
                   used=used, plot=plot, data=data)


CLAIM = Claim(
    name="depth",
    sentence="Attention's effective rank falls with depth and settles at d/4 to d/3 after "
             "layer 8 (85 -> 32 over GPT-2 Medium's layers).",
    source="the low-rank-bottleneck theory rankzoo starts from",
    quantity="per layer, rank_0.01 of the centered mixing matrix P_c, mean over heads and "
             "sequences",
    metrics="docs/METRICS.md#claims",
    rule="falls: last third's mean >= 10% below the first third's and Spearman rho <= -0.5; "
         "plateau: >= 75% of layers past 8 with rank/d_model in [1/4, 1/3]; both: holds; "
         "one: holds partly; none: refuted; <= 9 layers: the plateau is untested",
    thresholds=THRESHOLDS,
    evidence=("hf", "runs"),
    judge=judge,
)
