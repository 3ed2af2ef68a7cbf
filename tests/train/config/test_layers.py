"""Layer-pattern variants (train/config/layers.py): both spellings, their expansion to
n_layers, the errors that name the key, matching, the round trip through YAML and the
model they build."""

from __future__ import annotations

import pytest
import yaml

from tests.train.conftest import tiny_experiment
from train.config import parse_experiment
from train.experiment.plan import plan_document
from train.lm.decoder import block_specs, build_model

LOCAL = {"block": "sliding_window", "window": 4}
GLOBAL = {"block": "softmax"}
PATTERN = {"pattern": ["local", "local", "global"], "blocks": {"local": LOCAL, "global": GLOBAL}}
LAYERS = {"layers": [{"block": "ssm", "d_state": 4}, GLOBAL]}


def experiment(n_layers=6, match=None, **variants):
    return tiny_experiment(model={"d_model": 16, "n_layers": n_layers},
                           variants={"mha": {"block": "softmax"}, **variants},
                           **({"match": match} if match else {}))


def test_a_pattern_repeats_its_unit_to_n_layers():
    exp = parse_experiment(experiment(lg=PATTERN, sa=LAYERS))
    lg = exp.variant_config("lg")
    assert lg["pattern"] == ["local", "local", "global"] * 2
    assert [s["name"] for s in lg["layers"]] == ["sliding_window"] * 2 + ["softmax"] + \
        ["sliding_window"] * 2 + ["softmax"]
    assert lg["layers"][0]["window"] == 4 and lg["layers"][0]["n_heads"] == 2  # defaults in
    assert exp.variant_config("sa")["pattern"] == ["ssm", "softmax"] * 3
    assert "layers" not in exp.variant_config("mha")  # a uniform variant is as before
    assert exp.variant_config("mha")["block"] == {"name": "softmax", "n_heads": 2}


def test_the_model_builds_each_layer_as_written():
    config = parse_experiment(experiment(lg=PATTERN)).variant_config("lg")
    model = build_model(config)
    assert [b.kind for b in model.blocks] == [name for name, _ in block_specs(config)]
    assert [getattr(b, "window", None) for b in model.blocks] == [4, 4, None] * 2


def test_the_resolved_config_loads_back_equal():
    exp = parse_experiment(experiment(lg=PATTERN, sa=LAYERS))
    again = parse_experiment(yaml.safe_load(yaml.safe_dump(exp.to_dict())))
    assert again.variants == exp.variants
    assert again.variant_config("lg") == exp.variant_config("lg")


@pytest.mark.parametrize("variant, match", [
    ({"pattern": ["local", "global", "global", "local"], "blocks": PATTERN["blocks"]},
     r"variants.bad: a unit of 4 layers does not divide model.n_layers \(6\)"),
    ({"pattern": ["local", "globl"], "blocks": PATTERN["blocks"]},
     r"variants.bad.pattern\[1\] = 'globl'.*global"),
    ({"pattern": ["local"], "blocks": {"local": {**LOCAL, "d_state": 4}}},
     r"variants.bad.blocks.local.d_state"),
    ({"layers": [{"block": "ssm", "window": 4}, GLOBAL]},
     r"variants.bad.layers\[0\].window"),
    ({"layers": [{"block": "nope"}]}, r"variants.bad.layers\[0\].block"),
    ({"layers": [GLOBAL], "pattern": ["a"], "blocks": {"a": GLOBAL}},
     "either layers or pattern \\+ blocks"),
    ({"layers": [GLOBAL], "block": "softmax"}, "remove variants.bad.block"),
    ({"layers": [GLOBAL], "window": 4}, r"variants.bad.window"),
    ({"pattern": ["a"], "blocks": {"a": GLOBAL, "b": LOCAL}}, r"\['b'\] not used"),
    ({"layers": []}, "non-empty list"),
], ids=["unit-does-not-divide", "unknown-sub-block", "knob-of-another-block",
        "knob-of-another-block-in-layers", "unknown-block", "both-spellings",
        "block-beside-layers", "stray-knob", "unused-sub-block", "empty"])
def test_bad_patterns_name_the_key(variant, match):
    with pytest.raises(ValueError, match=match):
        parse_experiment(experiment(bad=variant))


def test_match_params_sizes_a_hybrid_like_any_variant():
    exp = parse_experiment(experiment(lg=PATTERN, sa=LAYERS,
                                      match={"params": True, "tolerance": 0.05}))
    rows = {r["variant"]: r for r in plan_document(exp)["variants"]}
    assert all(abs(r["rel_diff"]) <= 0.05 for r in rows.values())
    assert rows["sa"]["d_mlp"] != rows["mha"]["d_mlp"]  # the SSM layers' own parameters
    assert rows["lg"]["pattern"] == "local x2, global, local x2, global"
    assert [ly["block"] for ly in rows["sa"]["layers"]] == ["ssm", "softmax"] * 3
    # the cache is each layer's own: a window holds W keys, a global layer all T
    per_layer = [ly["cache_elements"] for ly in rows["lg"]["layers"]]
    assert per_layer[0] < per_layer[2] and rows["lg"]["cache_elements"] == sum(per_layer)


def test_match_state_refuses_a_hybrid_by_name():
    with pytest.raises(ValueError, match=r"layer patterns \(lg\)"):
        parse_experiment(experiment(lg=PATTERN, match={"state": True}))
