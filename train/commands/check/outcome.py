"""A check experiment's run read back: each cheaper-block suggestion verified or refuted
against the variant it was advised for.

    attach_checks(report)   # report["advice_checks"]: one item per check variant

A variant named check.<variant>.<block>_<knob><N> (written by emit.py) beside <variant> in
the same run is the check of <variant>'s advice "a block with a fixed state of N". It is
verified when, at the end of training, its validation accuracy is at most
ACCURACY_TOLERANCE below the original's and its validation loss at most LOSS_TOLERANCE
nats per token above (each metric the runs log; MQAR logs both, the Markov language its
loss); refuted when either is beyond; inconclusive when a run did not finish or logs
neither.
"""

from __future__ import annotations

import re

ACCURACY_TOLERANCE = 0.02  # absolute, of val/accuracy
LOSS_TOLERANCE = 0.02  # nats per token, of val/loss: rankzoo compress's default tolerance
CHECK_NAME = re.compile(r"^check\.(?P<variant>.+)\.(?P<knob>ssm_n|linear_f)(?P<state>\d+)$")
BLOCKS = {"ssm": "an SSM with N = {n}", "linear": "linear attention with F = {n}"}


def compare(original: dict, candidate: dict) -> dict[str, dict]:
    """Per metric logged by both: the two values, the difference (candidate - original),
    its tolerance and whether it is within (accuracy may not drop, loss may not grow, by
    more than the tolerance)."""
    out = {}
    for metric, tol, sign in (("val/accuracy", ACCURACY_TOLERANCE, -1),
                              ("val/loss", LOSS_TOLERANCE, 1)):
        a, b = original["metrics"].get(metric), candidate["metrics"].get(metric)
        if a is None or b is None:
            continue
        out[metric] = {"original": a, "candidate": b, "difference": b - a,
                       "tolerance": tol, "within": sign * (b - a) <= tol}
    return out


def _finished(variant: dict) -> bool:
    return (variant.get("status") or {}).get("state", "finished") == "finished"


def check_item(original: dict, candidate: dict, block: str, state: int) -> dict:
    """The advice_check item of one check variant against its original."""
    metrics = compare(original, candidate)
    if not metrics or not (_finished(original) and _finished(candidate)):
        verdict = "inconclusive"
    else:
        verdict = "verified" if all(m["within"] for m in metrics.values()) else "refuted"
    shown = "; ".join(f"{k} {m['original']:.4g} -> {m['candidate']:.4g} "
                      f"({m['difference']:+.4f}, tolerance {m['tolerance']:g})"
                      for k, m in metrics.items()) or "no val/accuracy or val/loss in both"
    name = original["variant"]
    return {"kind": "advice_check", "variant": name, "candidate": candidate["variant"],
            "block": block, "state": state, "metrics": metrics, "verdict": verdict,
            "text": f"{name}: the cheaper-block advice (a fixed state of {state}: "
                    f"{BLOCKS[block].format(n=state)}, in every layer) is {verdict} by "
                    f"{candidate['variant']}: {shown}"}


def attach_checks(report: dict) -> list[dict]:
    """report["advice_checks"]: one item per check variant whose original is in the same
    report (none: the key is left out). Returns the items."""
    by_name = {v["variant"]: v for v in report["variants"]}
    items = []
    for name, variant in by_name.items():
        m = CHECK_NAME.match(name)
        if m and m["variant"] in by_name:
            items.append(check_item(by_name[m["variant"]], variant, m["knob"].split("_")[0],
                                    int(m["state"])))
    if items:
        report["advice_checks"] = items
    return items
