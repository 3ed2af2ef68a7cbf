"""The report of a model probed through its captured calls: a Hugging Face model
(budgets/hf/probe.py) or any model's SDPA calls (budgets/probe/own.py).

    report = captured_report(name, entry, experiment, thresholds, zoo_blocks)

build_report's document of the one variant, plus per-head eranks, the probe's source, the
per-kind summary (kinds.py) and what the probe could not read, named.
"""

from __future__ import annotations

from collections.abc import Mapping

from .document import build_report
from .kinds import kind_summary

ERANK_QUANTITIES = ("mixing", "mixing_centered", "past_future", "hidden_centered")
# what a probe of captured calls names beside its layers, carried into the report
NAMED = ("unread_calls", "unmeasured_mixers")


def captured_report(name: str, entry: dict, experiment: str, thresholds=None,
                    zoo_blocks: Mapping[str, str] | None = None) -> dict:
    """build_report of one model probed through its captured calls (a Hugging Face model,
    or any model's SDPA calls), plus per-head eranks, the probe's source (with the
    matrix-free settings, when the probe used them), the per-kind summary, each kind
    beside the zoo block `zoo_blocks` names for its attention kind, and what the probe
    could not read."""
    source, probe = entry["source"], entry["probe"]
    report = build_report({name: entry}, experiment=experiment, thresholds=thresholds)
    report["source"] = {**source, **({"matfree": probe["matfree"]} if "matfree" in probe
                                     else {}),
                        # the captured loss beside the model's own (budgets/probe/faithful.py)
                        **({"loss_check": probe["loss_check"]} if "loss_check" in probe
                           else {})}
    for layer, probed in zip(report["variants"][0]["layers"], probe["layers"], strict=True):
        # matrix-free SSM layers have no whole-mixing figures: empty lists there
        eranks = {q: probed["quantities"].get(q, {}).get("erank", []) for q in ERANK_QUANTITIES}
        layer["erank"] = eranks  # per head (hidden_centered: one value per layer)
        for key in ("kind", "not_measured", "indexer", "signed"):
            if key in probed:
                layer[key] = probed[key]
    report["kinds"] = kind_summary(report["variants"][0]["layers"], zoo_blocks)
    for key in NAMED:  # layers and calls no capture reads, named
        if probe.get(key):
            report[key] = probe[key]
    return report
