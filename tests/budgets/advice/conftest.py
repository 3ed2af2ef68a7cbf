"""Fakes shared by the advice tests: probe layers with per-sample maxima, the report
they give, and the advice items picked out of it."""

from __future__ import annotations

import pytest

from budgets import build_report
from budgets.advice.annotate import CHECKS

T, B = 32, 4


def violations(report: dict) -> list[str]:
    """Every advised bound of `report` re-checked as annotate checks an item before it
    emits it (CHECKS); one line per bound the figures break, [] when all hold."""
    variants = {v["variant"]: v for v in report["variants"]}
    return [line for item in report["advice"] if item["kind"] in CHECKS
            for line in CHECKS[item["kind"]](item, variants[item["variant"]])]


def lengths(*per_length):
    """past_future_lengths at T/4, T/2, T from per-head maxima at each length."""
    ts = (T // 4, T // 2, T)[-len(per_length):]
    return [{"seq_len": t, "rank_eps": [float(x) - 0.5 for x in m],
             "rank_eps_max": [float(x) for x in m], "lower_bound": False}
            for t, m in zip(ts, per_length, strict=True)]


@pytest.fixture
def probed(fake_layer):
    """probed(i, pf_mean, pf_max, lengths=None, kv=None) -> a probe layer in the spec's
    format: rank_eps_max on every quantity (the mean's value where not given)."""
    def build(i=0, pf_mean=(3, 4), pf_max=(3, 5), past_future_lengths=None, kv=None):
        layer = fake_layer(i)
        for metrics in layer["quantities"].values():
            metrics["rank_eps_max"] = list(metrics["rank_eps"])
        pf = layer["quantities"]["past_future"]
        pf["rank_eps"] = [float(x) for x in pf_mean]
        pf["rank_eps_max"] = [float(x) for x in pf_max]
        layer["past_future_lengths"] = (past_future_lengths if past_future_lengths is not None
                                        else lengths((3, 4), (3, 4), pf_max))
        if kv is not None:
            layer["kv_heads"] = kv
        return layer

    return build


def report_of(*layers, status=None, **entry):
    probe = {"seq_len": T, "eps": 0.1, "batch_size": B, "layers": list(layers)}
    entry = {"probe": probe, "step": 10, "params": 1, **entry}
    if status is not None:
        entry["status"] = status
    return build_report({"v": entry})


def kinds(report):
    return [a["kind"] for a in report["advice"]]


def the(report, kind):
    (item,) = [a for a in report["advice"] if a["kind"] == kind]
    return item


def mqar_status(chance=0.25):
    return {"state": "finished", "step": 600, "max_steps": 600, "learned": True,
            "baseline": {"task": "mqar", "chance_accuracy": chance}}
