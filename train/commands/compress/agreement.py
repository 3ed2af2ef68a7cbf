"""How well the predicted loss changes agree with the measured ones, over a document's rows.

    agreement(rows)   # {"settings", "spearman", "ratio_min", "ratio_median", "ratio_max", ...}

Each measured setting carries the loss change predicted before it was evaluated
(sensitivity.py) beside the one measured on the evaluation data. Two figures say how far
the prediction can be trusted: the Spearman rank correlation over the settings (does it
order them as the measurement does: what an allocator needs) and the range of predicted /
measured over the settings whose measured change is above NOISE (is it on the right
scale: what a tolerance needs).
"""

from __future__ import annotations

from ...render.recall import spearman  # one rank correlation for the project

NOISE = 1e-3  # nats per token: measured changes below this leave the ratio out


def agreement(rows: list[dict]) -> dict:
    """Spearman and the predicted / measured range over the rows with a prediction (the
    full cache left out)."""
    pairs = [(r["predicted_delta_loss"], r["delta_loss"]) for r in rows
             if r["allocation"] != "full" and r.get("predicted_delta_loss") is not None]
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs]) if pairs else None
    ratios = sorted(p / m for p, m in pairs if m > NOISE)
    out = {"settings": len(pairs), "spearman": rho, "ratio_settings": len(ratios),
           "ratio_min": ratios[0] if ratios else None,
           "ratio_median": ratios[len(ratios) // 2] if ratios else None,
           "ratio_max": ratios[-1] if ratios else None, "noise": NOISE}
    out["text"] = _text(out)
    return out


def _text(a: dict) -> str:
    if not a["settings"]:
        return "no setting carries a prediction"
    rho = "n/a (fewer than 3 settings)" if a["spearman"] is None else f"{a['spearman']:+.2f}"
    text = f"predicted vs measured loss change over {a['settings']} settings: Spearman {rho}"
    if a["ratio_settings"]:
        text += (f"; predicted / measured {a['ratio_min']:.2f}-{a['ratio_max']:.2f} "
                 f"(median {a['ratio_median']:.2f}) over the {a['ratio_settings']} whose "
                 f"measured change exceeds {a['noise']:g}")
    return text
