"""The per-kind summary of a report of captured calls (budgets/report/captured.py): layers
grouped by what they are (sliding window W, global, no RoPE, an SSD state N, experts after
them), realized against the caps their kind declares.

    kinds = kind_summary(report_layers, {"global": "softmax", ...})   # build_hf_report's rows

A sliding-window layer declares what zoo's sliding_window block declares (past->future
cap W - 1), a global one what zoo's softmax block declares (T / 2), a chunked one what of
its chunk crosses T / 2: the same formula, budgets/budget.py's attention_budget, so each
kind is compared with the zoo block that declares the same caps (none, where no block's
facts mirror the kind: chunked layers today). Which block that is, the caller says
(budgets does not know zoo): train reads it from the blocks' own `facts.mirrors`
(train/hf/probe.py zoo_blocks).
"""

from __future__ import annotations

from collections.abc import Mapping

SUMMARY_QUANTITIES = ("past_future", "qk", "inference.k", "inference.v", "inference.state",
                      "inference.latent")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def mirror_kind(kind: dict) -> str:
    """The layer kind a zoo block mirrors (zoo/facts.py HF_KINDS): the attention kind, or
    `dsa` for attention an indexer's top-k selects (its caps and cache are the sparse
    family's, whatever the mask beneath)."""
    return "dsa" if kind.get("topk") else kind["attention"]


def kind_summary(layers: list[dict], zoo_blocks: Mapping[str, str] | None = None) -> list[dict]:
    """Per kind label, in first-seen order: its layers, the zoo block declaring the caps
    of its attention kind (`zoo_blocks`: attention kind -> block; None where none is
    given), and per summary quantity the cap (the largest declared over its layers) and
    the mean realized rank_eps."""
    zoo_blocks = zoo_blocks or {}
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
        # each layer once: zamba's two Mamba scans of one layer are one layer of the kind
        out.append({"kind": label, "layers": list(dict.fromkeys(m["layer"] for m in members)),
                    # a zoo layer is its own block; an HF layer's kind names its caps' block
                    "zoo_block": kind.get("zoo_block") or zoo_blocks.get(mirror_kind(kind)),
                    "moe": kind["moe"],
                    "rows": rows})
    return out

