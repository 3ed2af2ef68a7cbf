"""The report's added sections: the three-part budget, W_O, the adapter note, head classes
with centered metrics n/a where meaningless, the residual stream, and the schema that keeps
old files loading and new ones checked."""

from __future__ import annotations

import json

import pytest

from budgets import RankBudget, VerdictThresholds, annotate, build_report, load_report, to_json
from budgets.advice.head_classes import HeadRules, classify_head, summary
from budgets.report.document import PART_OF_AXIS, RANK_RECORD
from budgets.schema import check

RULES = HeadRules()


def variant_of(*layers, **entry):
    probe = {"seq_len": 32, "eps": 0.1, "batch_size": 2, "layers": list(layers)}
    return build_report({"v": {"probe": probe, "step": 5, "params": 1, **entry}})["variants"][0]


def test_rows_carry_their_part_and_the_budget_its_three_parts(fake_layer):
    layers = [fake_layer(0), fake_layer(1, value_path=0)]
    v = variant_of(*layers)
    for layer in v["layers"]:
        for row in layer["axes"]:
            assert row["part"] == PART_OF_AXIS[row["axis"]]
    budgets = [RankBudget.from_dict(ly["budget"]) for ly in layers]
    assert v["budget"]["per_layer"] == [
        {"layer": i, "pretrain": b.pretrain, "adapter": b.adapter, "inference": b.inference,
         "total": b.total, "cache_elements": b.cache_elements} for i, b in enumerate(budgets)]
    model = v["budget"]["model"]
    assert model == {k: sum(p[k] for p in v["budget"]["per_layer"])
                     for k in ("pretrain", "adapter", "inference", "total", "cache_elements")}
    assert v["budget_total"] == model["total"] == sum(b.total for b in budgets)
    assert v["batch_size"] == 2


def test_w_o_is_a_pretrain_row_capped_by_its_shape(fake_layer, quantity):
    layer = fake_layer(0)
    layer["quantities"]["out"] = {**quantity([5]), "rank_eps_max": [5.0], "shape": [12, 8]}
    rows = {a["quantity"]: a for a in variant_of(layer)["layers"][0]["axes"]}
    out = rows["out"]
    assert (out["axis"], out["part"], out["declared"]) == ("out", "pretrain", 8)
    assert out["utilization"] == pytest.approx(5 / 8) and out["realized_max_sample"] == 5.0
    axes = [a["axis"] for a in variant_of(layer)["layers"][0]["axes"]]
    assert axes.index("value_path") < axes.index("out") < axes.index("inference")
    # no shape: the spectrum's length min(m, n) is the cap; neither: no row
    del layer["quantities"]["out"]["shape"]
    layer["spectra"] = {"out": [[3.0, 2.0, 1.0, 0.5, 0.1, 0.0]]}
    assert {a["quantity"]: a["declared"] for a in variant_of(layer)["layers"][0]["axes"]}[
        "out"] == 6
    del layer["spectra"]
    assert "out" not in {a["quantity"] for a in variant_of(layer)["layers"][0]["axes"]}


def test_adapter_note_none_attached_configured_or_attached(fake_layer):
    two = (fake_layer(0), fake_layer(1))
    assert variant_of(*two)["adapter_note"] == "none attached"
    note = variant_of(*two, lora={"r": 4, "targets": ["q_proj", "v_proj"]})["adapter_note"]
    # r 4 on 2 targets: 8 per layer, 16 over the 2 layers
    assert note.startswith("none attached; a LoRA of r = 4 on q_proj, v_proj would add 8 "
                           "per layer") and "16 per model" in note
    attached = fake_layer(0)
    attached["budget"]["adapter"] = 6
    assert variant_of(attached, lora={"r": 4, "targets": ["q_proj"]})[
        "adapter_note"].startswith("attached: rank 6")
    with pytest.raises(ValueError, match=r"variant 'v': lora.r must be a positive int, got 0"):
        variant_of(*two, lora={"r": 0, "targets": ["q_proj"]})


@pytest.mark.parametrize("figures, cls", [
    ((0.51, 0.9, 1e-4, 1.0), "sink"),     # a forced sink: sink, though constant as well
    ((0.5, 0.9, 1e-4, 1.0), "dead"),      # the same mix everywhere, not on token 0
    ((0.5, 0.51, 1e-3, 1.0), "local"),
    ((0.5, 0.5, 1e-3, 1.49), "rank-1"),
    ((0.5, 0.5, 1e-3, 1.5), "broad"),
    ((None, None, None, None), "broad"),  # nothing measured matches no rule
])
def test_head_rules_in_order_at_their_boundaries(figures, cls):
    assert classify_head(*figures, RULES) == cls


def test_summary_names_the_commonest_class_first():
    assert summary(["broad", "sink", "sink", "local"]) == "2 of 4 heads are sinks, 1 broad, 1 local"
    assert summary(["sink"]) == "1 of 1 heads is a sink" and summary([]) == "no heads"


def heads_layer(fake_layer, quantity, first, energy, centered_erank=(2.5, 6.0)):
    layer = fake_layer(0)
    layer["quantities"]["mixing_centered"] = quantity([5, 7], erank=list(centered_erank))
    layer["heads"] = {"first_token_mass": list(first), "diagonal_mass": [0.1, 0.2],
                      "centered_energy": list(energy), "raw_erank": [1.2, 9.0]}
    return layer


def test_a_sink_head_is_classed_and_its_centered_metrics_are_not_applicable(fake_layer,
                                                                             quantity):
    layer = heads_layer(fake_layer, quantity, first=[0.98, 0.1], energy=[1e-5, 0.4])
    report = build_report({"v": {"probe": {"seq_len": 32, "eps": 0.1, "layers": [layer]},
                                 "step": 1, "params": 1}})
    out = report["variants"][0]["layers"][0]
    heads = out["heads"]
    assert heads["class"] == ["sink", "broad"] and heads["centered_ok"] == [False, True]
    assert heads["first_token_mass"] == [0.98, 0.1] and heads["raw_erank"] == [1.2, 9.0]
    assert heads["past_future_max"] == [None, None]  # an older probe: no per-sample max
    assert heads["summary"] == "1 of 2 heads is a sink, 1 broad"
    # the layer's centered erank averages the valid head only (6.0, not (2.5 + 6) / 2)
    assert out["mixing_centered_erank"] == pytest.approx(6.0)
    assert out["centered_na"] == "1 of 2 heads: centered energy < 0.001 of raw"
    assert "sink (attention on token 0 > 0.5" in report["head_rules"]
    # every head n/a: no centered figure, so no collapse verdict either
    layer = heads_layer(fake_layer, quantity, first=[0.98, 0.99], energy=[1e-5, 1e-6],
                        centered_erank=(1.0, 1.0))
    out = variant_of(layer)["layers"][0]
    assert out["mixing_centered_erank"] is None and out["collapsed"] is False
    assert out["centered_na"].startswith("2 of 2 heads")


def test_head_rules_follow_the_thresholds(fake_layer, quantity):
    layer = heads_layer(fake_layer, quantity, first=[0.6, 0.1], energy=[0.4, 0.4])
    report = build_report({"v": {"probe": {"seq_len": 32, "eps": 0.1, "layers": [layer]},
                                 "step": 1, "params": 1}})
    assert report["variants"][0]["layers"][0]["heads"]["class"] == ["sink", "broad"]
    strict = VerdictThresholds(heads=HeadRules(sink_mass=0.7, rank1_erank=1.3))
    annotate(report, strict)  # head 0: no sink at 0.6 now, and its raw erank 1.2 < 1.3
    assert report["variants"][0]["layers"][0]["heads"]["class"] == ["rank-1", "broad"]
    assert "token 0 > 0.7" in report["head_rules"]
    assert report["thresholds"]["heads"]["sink_mass"] == 0.7
    with pytest.raises(ValueError, match=r"HeadRules.sink_mass must lie in \(0, 1\), got 2"):
        HeadRules(sink_mass=2)


def test_heads_without_figures_give_no_section(fake_layer):
    layer = fake_layer(0)  # mixing known only by its factors (matrix-free): nothing per head
    layer["heads"] = {k: [None, None] for k in ("first_token_mass", "diagonal_mass",
                                                "centered_energy", "raw_erank")}
    assert "heads" not in variant_of(layer)["layers"][0]


def test_residual_stream_beside_the_normed_input(fake_layer, quantity):
    layer = fake_layer(0)
    layer["quantities"]["hidden_centered"] = quantity([1], erank=[98.0])
    layer["residual"] = {"centered_erank": 6.9, "norm_median": 130.0, "n_massive": 1,
                         "massive": [{"sample": 0, "position": 0, "norm": 23000.0,
                                      "ratio": 23000.0 / 130.0}]}
    out = variant_of(layer)["layers"][0]
    assert out["residual"] == layer["residual"] and out["residual"] is not layer["residual"]
    assert out["input_centered_erank"] == out["hidden_centered_erank"] == 98.0
    assert "residual" not in variant_of(fake_layer(0))["layers"][0]


def full_report(fake_layer, quantity):
    layer = heads_layer(fake_layer, quantity, first=[0.98, 0.1], energy=[1e-5, 0.4])
    for metrics in layer["quantities"].values():
        metrics["rank_eps_max"] = list(metrics["rank_eps"])
    layer["quantities"]["out"] = {**quantity([5]), "rank_eps_max": [5.0], "shape": [12, 8]}
    layer["past_future_lengths"] = [{"seq_len": t, "rank_eps": [6.0, 10.0],
                                     "rank_eps_max": [6.0, 10.0], "lower_bound": False}
                                    for t in (8, 16, 32)]
    layer["residual"] = {"centered_erank": 3.0, "norm_median": 1.0, "massive": []}
    kv = {"rank_eps": [2.0, 3.0], "rank_eps_max": [2.0, 3.0], "erank": [1.5, 2.0]}
    layer["kv_heads"] = {"n_kv_heads": 2, "head_dim": 4, "rope": True, "k": kv, "v": kv,
                         "k_pre_rope": kv}
    status = {"state": "finished", "step": 5, "max_steps": 5, "learned": True,
              "reason": "val/accuracy 0.9", "baseline": {"task": "mqar",
                                                         "chance_accuracy": 0.016}}
    probe = {"seq_len": 32, "eps": 0.1, "batch_size": 2, "layers": [layer]}
    return build_report({"v": {"probe": probe, "step": 5, "params": 1, "status": status,
                               "lora": {"r": 2, "targets": ["wq"]}}}), probe


def test_every_new_key_round_trips_and_is_checked(tmp_path, fake_layer, quantity):
    report, _ = full_report(fake_layer, quantity)
    path = tmp_path / "report.json"
    path.write_text(to_json(report))
    assert load_report(path) == report
    bad = json.loads(to_json(report))
    bad["variants"][0]["layers"][0]["axes"][0]["part"] = "pre-train"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"axes\[0\]\.part: expected one of"):
        load_report(path)
    bad = json.loads(to_json(report))
    bad["advice"][0]["conditions"]["checked"] = "yes"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"advice\[0\]\.conditions\.checked"):
        load_report(path)


def test_a_report_without_the_new_keys_still_loads(tmp_path, fake_layer, quantity):
    report, _ = full_report(fake_layer, quantity)
    old = json.loads(to_json(report))
    for key in ("head_rules",):
        del old[key]
    v = old["variants"][0]
    for key in ("batch_size", "budget", "adapter_note", "status"):
        del v[key]
    for layer in v["layers"]:
        for key in ("heads", "residual", "past_future_lengths", "kv_heads", "centered_na",
                    "input_centered_erank"):
            layer.pop(key, None)
        layer["axes"] = [{k: x for k, x in a.items() if k not in ("part", "realized_max_sample")}
                         for a in layer["axes"] if a["axis"] != "out"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = annotate(load_report(path))
    assert [a["kind"] for a in loaded["advice"]][-1] == "note"  # no maxima: no bounds


def test_a_probe_record_with_the_new_keys_is_checked(fake_layer, quantity):
    _, probe = full_report(fake_layer, quantity)
    record = json.loads(json.dumps({"step": 5, **probe}))
    assert check(record, RANK_RECORD) == record
    record["layers"][0]["quantities"]["past_future"]["rank_eps_max"] = ["many"]
    with pytest.raises(ValueError, match=r"past_future\.rank_eps_max\[0\]"):
        check(record, RANK_RECORD)
