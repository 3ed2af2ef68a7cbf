"""Matching variants against the first one: parameters (match.params, through the MLP
width) and cached state (match.state, through each block's state knob), alone and together,
through parse_experiment, the resolved config and the dry-run table."""

import dataclasses
import itertools
import json

import pytest
import yaml

import zoo
from train.cli import main
from train.config import load_experiment, parse_experiment
from train.experiment.plan import plan_document
from train.harness.module import build_model
from train.sizing.match import state_knob

# A short sequence and a reference MHA with a small head (K = 4): cache per layer
# 2 * T * H * K = 512 elements at T = 16, which every knob below can reach within 5%.
SEQ_LEN = 16
REFERENCE = {"block": "softmax", "head_dim": 4}
STATE_VARIANTS = {
    "gqa": {"block": "softmax", "n_kv_heads": 4},  # K = 8: G = 2
    "window": {"block": "sliding_window", "window": 3},  # W = 8
    "linear": {"block": "linear"},  # elu+1, F x (V + 1 normalizer column): F = 14
    "ssm": {"block": "ssm", "expand": 1},  # N = 11: 514 elements
    "mla": {"block": "mla", "kv_lora_rank": 4},  # R = 28 (+ rope dim 4)
    "moe": {"block": "moe"},  # head_dim 16
}


def experiment_raw(variants, **match):
    return {
        "name": "m", "seed": 0,
        "data": {"vocab_size": 32, "seq_len": SEQ_LEN, "num_kv_pairs": 2},
        "model": {"d_model": 32, "n_layers": 2},
        "block_defaults": {"n_heads": 4},
        "variants": variants,
        "match": match,
    }


def state_experiment(**match):
    return parse_experiment(experiment_raw({"mha": REFERENCE, **STATE_VARIANTS},
                                           state=True, **match))


def cache_of(exp, variant) -> int:
    """Cached elements per sequence, all layers, of the model the variant trains."""
    model = build_model(exp.variant_config(variant))
    return sum(b.budget(exp.data.seq_len).cache_elements for b in model.blocks)


# ---------------------------------------------------------------- parameters

def test_every_block_pair_matches_parameters_through_the_experiment():
    # (train/sizing/match.py's matched_widths is checked pair by pair in test_harness.py;
    # this goes through parse_experiment and the variant configs training builds)
    for a, b in itertools.permutations(zoo.names(), 2):
        exp = parse_experiment(experiment_raw({"ref": {"block": a}, "other": {"block": b}},
                                              params=True))
        ref, other = (build_model(exp.variant_config(n)).param_count() for n in ("ref", "other"))
        assert abs(other - ref) <= 0.05 * ref, (a, b, exp.d_mlp, ref, other)


# ---------------------------------------------------------------- state

def test_state_matching_hits_the_reference_cache_for_every_knob():
    exp = state_experiment()
    target = cache_of(exp, "mha")
    assert target == 2 * 2 * SEQ_LEN * 4 * 4  # layers x (K and V) x T x H x K
    for name in STATE_VARIANTS:
        cache = cache_of(exp, name)
        assert abs(cache - target) <= 0.05 * target, (name, exp.state[name], cache, target)
    assert exp.state == {"gqa": {"n_kv_heads": 2}, "window": {"window": 8},
                         "linear": {"feature_dim": 14}, "ssm": {"d_state": 11},
                         "mla": {"kv_lora_rank": 28}, "moe": {"head_dim": 16}}
    assert "mha" not in exp.state  # the reference sets the target and keeps its config


def test_matched_knob_is_the_nearest_value():
    exp = state_experiment()
    target = cache_of(exp, "mha")
    for name, spec in STATE_VARIANTS.items():
        knob = state_knob(spec["block"])[0]
        value = exp.state[name][knob]
        chosen = abs(cache_of(exp, name) - target)
        for other in (value - 1, value + 1):
            if spec["block"] == "softmax" or other < 1:
                continue  # n_kv_heads only takes divisors of n_heads
            raw = experiment_raw({"mha": REFERENCE, name: {**spec, knob: other}})
            try:
                neighbour = parse_experiment(raw)
            except ValueError:
                continue  # a value the block rejects (e.g. an odd MoE head dim)
            assert abs(cache_of(neighbour, name) - target) >= chosen, (name, value, other)


def test_matched_state_is_used_reported_and_reloads(tmp_path):
    exp = state_experiment()
    # the written value stays in the variant (the resolved config is the one written) ...
    assert exp.variants["window"].block_kwargs["window"] == 3
    assert exp.to_dict()["variants"]["window"]["window"] == 3
    # ... while training builds the matched one
    assert exp.variant_config("window")["block"]["window"] == 8
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp.to_dict(), sort_keys=False))
    assert load_experiment(path) == exp


def test_state_then_params():
    exp = state_experiment(params=True)
    doc = plan_document(exp)
    for row in doc["variants"]:
        assert abs(row["rel_diff"]) <= 0.05, row
        assert abs(row["cache_rel_diff"]) <= 0.05, row
    # parameters were matched on the state-matched blocks: ssm's d_state went from 16 to 11
    rows = {r["variant"]: r for r in doc["variants"]}
    assert rows["ssm"]["kwargs"]["d_state"] == 11
    assert rows["ssm"]["d_mlp"] == exp.variant_config("ssm")["model"]["d_mlp"]


def test_without_match_state_nothing_changes():
    exp = parse_experiment(experiment_raw({"mha": REFERENCE, **STATE_VARIANTS}))
    assert exp.state == {}
    assert exp.variant_config("window")["block"]["window"] == 3


@pytest.mark.parametrize("variant, match", [
    # MLA's latent is at most d_model (32): 2 * 16 * (32 + 4) = 1,152 < 2,048
    ({"block": "mla"}, r"variant 'other' \(mla\) cannot be matched to the reference's 2,048 "
                       r"cached elements per sequence within 5\.0% by its kv_lora_rank; "
                       r"nearest achievable: 1,152 at kv_lora_rank=32"),
    # n_kv_heads takes divisors of n_heads only: 768 per group, so 1,536 or 3,072
    ({"block": "softmax", "head_dim": 12}, r"variant 'other' \(softmax\) cannot be matched "
                                           r"to the reference's 2,048 .*by its n_kv_heads; "
                                           r"nearest achievable: 1,536 at n_kv_heads=2"),
])
def test_impossible_state_target_names_the_values(variant, match):
    raw = experiment_raw({"mha": {"block": "softmax"}, "other": variant}, state=True)
    with pytest.raises(ValueError, match=match):
        parse_experiment(raw)


def test_the_state_knob_and_its_values_are_the_blocks_declaration(monkeypatch):
    """match.state reads each block's facts (zoo/facts.py) as they are: a value the
    declaration leaves out is never tried (here the SSM's N = 11 that would match)."""
    cls = zoo.block_class("ssm")
    sizing = dataclasses.replace(cls.facts.sizing, values=lambda kw, D, T: [1, 2, 3])
    monkeypatch.setattr(cls, "facts", dataclasses.replace(cls.facts, sizing=sizing))
    raw = experiment_raw({"mha": REFERENCE, "ssm": STATE_VARIANTS["ssm"]}, state=True)
    with pytest.raises(ValueError, match=r"variant 'ssm' \(ssm\) cannot be matched .* by "
                                         r"its d_state; nearest achievable: [\d,]+ at d_state=3"):
        parse_experiment(raw)


def test_dry_run_shows_matched_state(tmp_path, capsys):
    raw = experiment_raw({"mha": REFERENCE, **STATE_VARIANTS}, state=True, params=True)
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))  # the first variant is the reference
    runs = tmp_path / "runs"
    assert main(["train", str(config), "--dry-run", "--runs-dir", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "parameters and cache matched within 5%" in table
    assert "window=8" in table and "(was 3)" in table and "Δcache" in table
    assert main(["train", str(config), "--dry-run", "--format", "json",
                 "--runs-dir", str(runs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not runs.exists()
    assert doc["match"]["state"] is True
    rows = {r["variant"]: r for r in doc["variants"]}
    assert rows["window"]["state"] == {"knob": "window", "value": 8, "written": 3,
                                       "matched": True}
    assert rows["mha"]["state"]["matched"] is False
    assert all(abs(r["cache_rel_diff"]) <= 0.05 for r in doc["variants"])
