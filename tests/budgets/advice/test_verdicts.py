"""Verdicts at their boundaries, and advice computed from the figures."""

from __future__ import annotations

import pytest

from budgets import (
    VerdictThresholds,
    annotate,
    build_report,
    load_report,
    to_json,
)
from budgets.advice.verdicts import axis_verdict, is_collapsed
from train.render import render_advice, to_markdown

TH = VerdictThresholds()


@pytest.mark.parametrize("util, verdict", [
    (0.9, "saturated"), (1.0, "saturated"), (0.8999, "healthy"), (0.25, "healthy"),
    (0.2499, "over-provisioned"), (0.0, "over-provisioned"), (None, None),
])
def test_axis_verdict_boundaries(util, verdict):
    assert axis_verdict(util, TH) == verdict


def test_collapse_boundary_and_overrides():
    assert is_collapsed(2.0, TH) and not is_collapsed(2.0001, TH) and not is_collapsed(None, TH)
    strict = VerdictThresholds(saturated=0.5, collapsed_erank=3.0)
    assert axis_verdict(0.5, strict) == "saturated" and is_collapsed(3.0, strict)
    with pytest.raises(ValueError, match=r"over_provisioned \(0.9\) < saturated \(0.5\)"):
        VerdictThresholds(saturated=0.5, over_provisioned=0.9)


@pytest.fixture
def one_layer_report(fake_layer, quantity):
    def build(past_future, erank, inference=(12, 8), adapters=()):
        layer = fake_layer(0)
        q = layer["quantities"]
        q["past_future"] = quantity(past_future)
        q["mixing_centered"] = quantity([1, 1], erank=erank)
        q["inference.k"], q["inference.v"] = quantity(inference), quantity([9])
        layer["adapters"] = [{"module": m, "adapter": "default", "declared": r,
                              "metrics": {"rank_eps": float(real)}} for m, r, real in adapters]
        probe = {"seq_len": 32, "eps": 0.1, "layers": [layer]}
        return build_report({"v": {"probe": probe, "step": 1, "params": 1}})

    return build


def test_report_carries_verdicts_and_collapse(one_layer_report):
    layer = one_layer_report([14.4, 14.4], erank=[2.0, 2.0])["variants"][0]["layers"][0]
    rows = {a["quantity"]: a for a in layer["axes"]}
    assert rows["past_future"]["verdict"] == "saturated"  # 14.4 / 16 = 0.9 exactly
    assert rows["qk"]["verdict"] == "healthy" and layer["collapsed"] is True
    layer = one_layer_report([4, 4], erank=[2.5, 2.5])["variants"][0]["layers"][0]
    assert layer["axes"][0]["verdict"] == "healthy" and layer["collapsed"] is False
    layer = one_layer_report([3.9, 3.9], erank=[3, 3])["variants"][0]["layers"][0]
    assert layer["axes"][0]["verdict"] == "over-provisioned"  # 3.9 / 16 < 0.25


def test_advice_from_the_figures_of_an_older_probe(one_layer_report):
    # no rank_eps_max (a probe from before it existed): no bound on data-dependent ranks
    # (cheaper block, KV cache), one note saying why; weights' and verdicts' advice stays
    report = one_layer_report([3, 5], erank=[1.5, 2.5], inference=(4, 2),
                              adapters=[("wq", 8, 3), ("wv", 8, 2)])
    by_kind = {a["kind"]: a for a in report["advice"]}
    assert "kv_cache" not in by_kind and "cheaper_block" not in by_kind
    assert "per-sample maxima" in by_kind["note"]["text"] and "v" in by_kind["note"]["text"]
    assert by_kind["lora_rank"]["suggested"] == 3 and "r = 3 would serve" in by_kind[
        "lora_rank"]["text"]
    assert by_kind["lora_rank"]["conditions"]["max_observed"] == 3
    assert by_kind["collapsed"]["erank"] == pytest.approx(2.0)
    rows = {a["quantity"]: a for a in report["variants"][0]["layers"][0]["axes"]}
    assert rows["adapter.wq.default"]["declared"] == 8
    assert rows["adapter.wq.default"]["verdict"] == "healthy"  # 3 / 8
    assert rows["past_future"]["realized_max_sample"] is None


def test_no_cheaper_block_above_half_the_cap_and_saturated_lora(one_layer_report):
    report = one_layer_report([9, 9], erank=[3, 3], adapters=[("wq", 4, 4)])
    kinds = [a["kind"] for a in report["advice"]]
    assert "cheaper_block" not in kinds and "collapsed" not in kinds
    lora = next(a for a in report["advice"] if a["kind"] == "lora_rank")
    assert "r = 4 binds" in lora["text"]


def test_advice_in_markdown_table_and_json(tmp_path, fake_variants):
    report = build_report(fake_variants(), experiment="quick")
    md = to_markdown(report)
    assert "## Advice" in md and "per-sample maxima" in md
    assert render_advice(report).row_count == len(report["advice"]) > 0
    path = tmp_path / "r.json"
    path.write_text(to_json(report))
    assert load_report(path) == report  # added keys keep version 1 readable
    old = build_report(fake_variants())
    del old["advice"], old["thresholds"]  # a report written before verdicts existed
    assert annotate(old)["advice"] == report["advice"]


def test_threshold_overrides_are_checked():
    with pytest.raises(ValueError, match="cache_dtype 'fp4' is not one of"):
        VerdictThresholds(cache_dtype="fp4")
    with pytest.raises(ValueError, match=r"flat_abs \(-1\)"):
        VerdictThresholds(flat_abs=-1)
    assert VerdictThresholds(cache_dtype="float32").cache_bytes == 4
