"""Two lines of a report of captured calls: the capture's loss check, and DSA's indexer read
as a selector (budgets/probe/faithful.py and budgets/probe/selector.py measure them).

    loss_check_text(report["source"])  # 'loss 4.8556 captured, 4.8556 without the capture
                                       #  (tolerance 1e-04)'
    indexer_line(report)               # 'indexer (dsa top-k 8, layers 0-1): ...', or None
"""

from __future__ import annotations

from .table import fmt


def loss_check_text(source: dict) -> str:
    """The captured loss beside the uncaptured one and the tolerance they agree within,
    or '' for a report that does not carry the check."""
    c = source.get("loss_check")
    if not c:
        return ""
    return (f"loss {c['captured']:.6g} captured, {c['uncaptured']:.6g} without the capture "
            f"(tolerance {c['tolerance']:.0e})")


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def indexer_line(report: dict) -> str | None:
    """One line for the layers with a top-k selection: the share of visible keys kept, the
    dense softmax's mass they hold, the overlap with its own top-k, the indexer logits'
    rank_eps (means over heads and layers), the layers reusing another's choice; None
    without such layers."""
    layers = [ly for ly in report["variants"][0]["layers"] if "indexer" in ly]
    if not layers:
        return None
    figs = [ly["indexer"] for ly in layers]
    ks = sorted({f["topk"] for f in figs})
    numbers = ", ".join(str(ly["layer"]) for ly in layers)
    head = f"indexer (dsa top-k {', '.join(map(str, ks))}; layers {numbers})"
    if not any(f["bites"] for f in figs):
        return (f"{head}: the probe's {report['variants'][0]['seq_len']} tokens are no more "
                f"than k, so the selection cannot bite: every key a query sees is kept")
    kept = _mean(f["keys_kept"] for f in figs)
    mass = _mean(_mean(f["dense_mass"]) for f in figs if f["dense_mass"])
    overlap = _mean(_mean(f["topk_overlap"]) for f in figs if f["topk_overlap"])
    logits = [f["logits"] for f in figs if f.get("logits")]
    line = (f"{head}: keeps {_share(kept)} of the keys a query sees, holding "
            f"{_share(mass)} of the dense softmax's mass; {_share(overlap)} of the dense "
            f"top-k chosen")
    if logits:
        rank = _mean(lg["rank_eps"] for lg in logits)
        line += f"; indexer logits rank_eps {fmt(rank, '.1f')} of {logits[0]['shape'][0]}"
    shared = [ly["layer"] for ly in layers if ly["indexer"].get("shared_from")]
    if shared:
        many = len(shared) > 1
        line += (f"; layer{'s' * many} {', '.join(map(str, shared))} reuse{'s' * (not many)} "
                 f"an earlier layer's choice")
    return line
