"""How well the predicted loss changes agree with the measured ones, over a document's rows.

    se = change_se(metrics, baseline)   # the standard error of a measured loss change
    agreement(rows)   # {"settings", "spearman", "resolved", "spearman_resolved", ...}

Each measured setting carries the loss change predicted before it was evaluated
(sensitivity.py) beside the one measured on the evaluation data. Two figures say how far
the prediction can be trusted: the Spearman rank correlation over the settings (does it
order them as the measurement does: what an allocator needs) and the range of predicted /
measured over the settings whose measured change is above NOISE (is it on the right
scale: what a tolerance needs).

A measured change is itself uncertain: the evaluation data is a sample. Every setting is
evaluated on the same sequences, so a change's standard error comes from the per-sequence
differences with the full cache (paired). Settings whose changes sit within that error
have no measured order for a prediction to agree with: on a small model most mild
settings are such (a tiny trained Llama: -0.005 to +0.008 nats against standard errors of
a few thousandths), and their random order drags the Spearman over all settings anywhere
between 0.35 and 1.0 from one training draw to the next. So the Spearman is also given
over the *resolved* settings, whose |change| exceeds RESOLVED standard errors, and the
text grades each figure (STRENGTH) and says when few settings are resolved.
"""

from __future__ import annotations

import math

from ....render.recall import spearman  # one rank correlation for the project

NOISE = 1e-3  # nats per token: measured changes below this leave the ratio out
RESOLVED = 2.0  # standard errors a measured change must exceed to count as resolved
MIN_RESOLVED = 4  # fewer resolved settings than this: their Spearman is not given
# (lower bound, word) of |Spearman|, strongest first
STRENGTH = ((0.8, "strong"), (0.5, "moderate"), (0.0, "weak"))


def change_se(metrics: dict, baseline: dict) -> float | None:
    """The standard error of metrics' loss minus baseline's (a token-weighted mean of
    paired per-sequence differences, each evaluation's "per_sequence": target/protocol.py's
    PerSequence), or None without per-sequence losses or with fewer
    than two sequences."""
    now, then = metrics.get("per_sequence"), baseline.get("per_sequence")
    if now is None or then is None or len(now.sums) < 2:
        return None
    total = sum(then.positions)
    diffs = [(a - b) / n for a, b, n in zip(now.sums, then.sums, then.positions, strict=True)
             if n]
    weights = [n / total for n in then.positions if n]
    mean = sum(w * d for w, d in zip(weights, diffs, strict=True))
    N = len(diffs)
    return math.sqrt(N / (N - 1) * sum(w * w * (d - mean) ** 2
                                       for w, d in zip(weights, diffs, strict=True)))


def strength(rho: float | None) -> str | None:
    return None if rho is None else next(word for low, word in STRENGTH if abs(rho) >= low)


def agreement(rows: list[dict]) -> dict:
    """Spearman (over every row with a prediction, the full cache left out, and over the
    resolved ones) and the predicted / measured range."""
    measured = [r for r in rows
                if r["allocation"] != "full" and r.get("predicted_delta_loss") is not None]
    pairs = [(r["predicted_delta_loss"], r["delta_loss"]) for r in measured]
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs]) if pairs else None
    resolved = [r for r in measured if r.get("delta_loss_se") is not None
                and abs(r["delta_loss"]) > RESOLVED * r["delta_loss_se"]]
    rho_resolved = spearman([r["predicted_delta_loss"] for r in resolved],
                            [r["delta_loss"] for r in resolved]) \
        if len(resolved) >= MIN_RESOLVED else None
    ratios = sorted(p / m for p, m in pairs if m > NOISE)
    out = {"settings": len(pairs), "spearman": rho, "strength": strength(rho),
           "resolved": len(resolved), "spearman_resolved": rho_resolved,
           "strength_resolved": strength(rho_resolved), "resolved_at": RESOLVED,
           "ratio_settings": len(ratios),
           "ratio_min": ratios[0] if ratios else None,
           "ratio_median": ratios[len(ratios) // 2] if ratios else None,
           "ratio_max": ratios[-1] if ratios else None, "noise": NOISE}
    out["text"] = _text(out)
    return out


def _text(a: dict) -> str:
    if not a["settings"]:
        return "no setting carries a prediction"
    rho = "n/a (fewer than 3 settings)" if a["spearman"] is None else \
        f"{a['spearman']:+.2f} ({a['strength']})"
    text = f"predicted vs measured loss change over {a['settings']} settings: Spearman {rho}"
    if a["spearman_resolved"] is not None:
        text += (f"; over the {a['resolved']} whose measured change exceeds "
                 f"{a['resolved_at']:g} standard errors, {a['spearman_resolved']:+.2f} "
                 f"({a['strength_resolved']})")
    else:
        text += (f"; only {a['resolved']} setting{'s' * (a['resolved'] != 1)} changed the "
                 f"loss by more than {a['resolved_at']:g} standard errors: the evaluation "
                 f"cannot tell the others' order, so a weak Spearman here says little")
    if a["ratio_settings"]:
        text += (f"; predicted / measured {a['ratio_min']:.2f}-{a['ratio_max']:.2f} "
                 f"(median {a['ratio_median']:.2f}) over the {a['ratio_settings']} whose "
                 f"measured change exceeds {a['noise']:g}")
    return text
