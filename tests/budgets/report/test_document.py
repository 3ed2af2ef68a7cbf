"""The report: declared vs realized rows, rendering, and the JSON round trip."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from budgets import (
    REPORT_SCHEMA_VERSION,
    RankBudget,
    build_report,
    load_report,
    probe_model,
    to_json,
)
from train.render import render_table, to_markdown


def test_rows_put_realized_beside_declared(fake_variants):
    report = build_report(fake_variants(), experiment="quick")
    assert report["schema"] == "rankzoo.report" and report["version"] == REPORT_SCHEMA_VERSION
    assert report["experiment"] == "quick"
    v = report["variants"][0]
    assert (v["variant"], v["step"], v["params"], v["metrics"]) == ("softmax", 100, 1234,
                                                                    {"loss": 2.5})
    layer = v["layers"][0]
    rows = {a["quantity"]: a for a in layer["axes"]}
    assert [a["axis"] for a in layer["axes"]] == [
        "mixing", "logits", "value_path", "inference", "inference"]
    assert set(rows) == {"past_future", "qk", "value", "inference.k", "inference.v"}
    pf = rows["past_future"]
    assert (pf["declared"], pf["realized_mean"], pf["realized_max"]) == (16, 8.0, 10.0)
    assert pf["utilization"] == pytest.approx(8.0 / 16) and pf["per_head"] == [6.0, 10.0]
    assert rows["qk"]["utilization"] == pytest.approx(3.5 / 4)
    assert rows["inference.k"]["declared"] == 16
    assert layer["mixing_centered_erank"] == pytest.approx(3.5)


def test_zero_cap_has_no_utilization_and_totals_add_up(fake_variants, fake_layer):
    report = build_report(fake_variants())
    v = report["variants"][0]
    value = next(a for a in v["layers"][1]["axes"] if a["quantity"] == "value")
    assert value["declared"] == 0 and value["utilization"] is None
    totals = [RankBudget.from_dict(fake_layer(0)["budget"]).total,
              RankBudget.from_dict(fake_layer(1, value_path=0)["budget"]).total]
    assert v["budget_total"] == sum(totals)
    assert report["variants"][1]["metrics"] == {}


def test_json_round_trip(tmp_path, fake_variants):
    report = build_report(fake_variants(), experiment="rt")
    path = tmp_path / "report.json"
    path.write_text(to_json(report))
    assert load_report(path) == report


def test_markdown_and_table_render_every_row(fake_variants):
    # the layout is train/render/'s (tests/train/render/test_render.py); here: nothing is lost
    report = build_report(fake_variants(), experiment="quick")
    md = to_markdown(report)
    assert md.splitlines()[0] == "# Rank-budget report: quick"
    console = Console(width=80, record=True)
    console.print(render_table(report))
    text = console.export_text()
    for v in report["variants"]:
        for layer in v["layers"]:
            for a in layer["axes"]:
                assert a["quantity"] in md, a["quantity"]
    assert "softmax" in text and "88%" in text  # qk: 3.5 of 4


def test_report_from_a_real_probe(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    report = build_report({"tiny": {"probe": probe, "step": 0, "params": 1}})
    layer = report["variants"][0]["layers"][1]
    assert len(layer["axes"]) == 5 and layer["mixing_centered_erank"] > 0
    for a in layer["axes"]:
        assert a["realized_max"] <= a["declared"], a
        if a["realized_max_sample"] is not None:  # probes that record rank_eps_max
            assert a["realized_max"] <= a["realized_max_sample"] <= a["declared"], a


def test_missing_variant_keys_and_empty_input_are_errors():
    with pytest.raises(ValueError, match=r"variant 'x' lacks \['step', 'params'\]"):
        build_report({"x": {"probe": {}}})
    with pytest.raises(ValueError, match="at least one variant"):
        build_report({})


@pytest.mark.parametrize("doc, match", [
    ({"schema": "other", "version": 1}, "expected schema 'rankzoo.report'"),
    ([1, 2], "got None"),
    ({"schema": "rankzoo.report", "version": 99}, "version 99 is not supported"),
])
def test_load_report_names_the_file(tmp_path, doc, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match) as err:
        load_report(path)
    assert str(path) in str(err.value)


def test_load_report_rejects_non_json(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON document") as err:
        load_report(path)
    assert str(path) in str(err.value)
