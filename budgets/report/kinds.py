"""The per-kind summary of a Hugging Face report: layers grouped by what they are (sliding
window W, global, no RoPE, an SSD state N, experts after them), realized against the caps
their kind declares.

    kinds = kind_summary(report_layers)      # after budgets.hf.probe.build_hf_report's rows

A sliding-window layer declares what zoo's sliding_window block declares (past->future
cap W - 1), a global one what zoo's softmax block declares (T / 2): the same formula,
budgets/budget.py's attention_budget, so each kind is compared with the zoo block that
declares the same caps.
"""

from __future__ import annotations

# the zoo block (zoo/registry.py's name) that declares the caps of each attention kind
ZOO_BLOCK = {"sliding": "sliding_window", "global": "softmax", "ssm": "ssm"}
SUMMARY_QUANTITIES = ("past_future", "qk", "inference.k", "inference.v")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def kind_summary(layers: list[dict]) -> list[dict]:
    """Per kind label, in first-seen order: its layers, and per summary quantity the cap
    (the largest declared over its layers) and the mean realized rank_eps."""
    groups: dict[str, list[dict]] = {}
    for layer in layers:
        if "kind" in layer:
            groups.setdefault(layer["kind"]["label"], []).append(layer)
    out = []
    for label, members in groups.items():
        kind = members[0]["kind"]
        rows = {}
        for q in SUMMARY_QUANTITIES:
            found = [a for m in members for a in m["axes"] if a["quantity"] == q]
            if found:
                rows[q] = {"declared": max(a["declared"] for a in found),
                           "realized_mean": _mean([a["realized_mean"] for a in found])}
        out.append({"kind": label, "layers": [m["layer"] for m in members],
                    "zoo_block": ZOO_BLOCK[kind["attention"]], "moe": kind["moe"],
                    "rows": rows})
    return out
