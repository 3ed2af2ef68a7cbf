"""match.params with SwiGLU MLPs: three matrices per unit of width, so a SwiGLU variant
matched to a GELU reference (or the other way round) holds the reference's parameters."""

import re

import pytest

import zoo
from train.config import parse_experiment
from train.lm.decoder import build_model, mlp_width
from train.sizing.match import count_params, matched_widths


def experiment(variants, model=None, tolerance=0.05):
    return {"name": "m", "seed": 0,
            "data": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
            "model": {"d_model": 32, "n_layers": 2, **(model or {})},
            "block_defaults": {"n_heads": 4}, "variants": variants,
            "match": {"params": True, "tolerance": tolerance}}


def params(exp, variant) -> int:
    return build_model(exp.variant_config(variant)).param_count()


@pytest.mark.parametrize("block", zoo.names())
def test_a_swiglu_variant_of_every_family_matches_a_gelu_reference(block):
    exp = parse_experiment(experiment({"mha": {"block": "softmax"},
                                       "swiglu": {"block": block, "model": {"mlp": "swiglu"}}}))
    ref, got = params(exp, "mha"), params(exp, "swiglu")
    assert abs(got - ref) <= 0.05 * ref, (block, ref, got)
    if block == "softmax":  # the same block: 2/3 of the reference's width, to rounding
        assert abs(exp.d_mlp["swiglu"] - 2 / 3 * exp.d_mlp["mha"]) <= 1


def test_a_swiglu_reference_sizes_at_two_thirds_and_gelu_variants_match_it():
    exp = parse_experiment(experiment({"ref": {"block": "softmax"},
                                       "gelu": {"block": "softmax", "model": {"mlp": "gelu"}},
                                       "mqa": {"block": "softmax", "n_kv_heads": 1}},
                                      model={"mlp": "swiglu"}))
    assert exp.d_mlp["ref"] == mlp_width(32, 4.0, None, "swiglu") == 85
    ref = params(exp, "ref")
    assert all(abs(params(exp, v) - ref) <= 0.05 * ref for v in ("gelu", "mqa"))
    assert abs(exp.d_mlp["gelu"] - 1.5 * exp.d_mlp["ref"]) <= 1


def test_matched_widths_counts_each_variants_own_matrices():
    sizes = {"vocab_size": 32, "d_model": 32, "n_layers": 2, "mlp_ratio": 4.0, "d_mlp": None,
             "seq_len": 16, "norm": "rmsnorm", "tie_embeddings": False}
    variants = {"ref": ("softmax", {"n_heads": 4}), "other": ("softmax", {"n_heads": 4})}
    widths = matched_widths(sizes, variants, 0.05, mlps={"other": "swiglu"})
    counts = [count_params(32, 32, 2, "softmax", {"n_heads": 4}, widths[n], 16, "rmsnorm",
                           False, mlp=m) for n, m in (("ref", "gelu"), ("other", "swiglu"))]
    assert widths == {"ref": 128, "other": 85} and abs(counts[1] - counts[0]) < 3 * 32 * 2


def test_below_the_floor_the_suggested_reference_width_lifts_a_swiglu_variant():
    raw = experiment({"mqa": {"block": "softmax", "n_kv_heads": 1},
                      "mha": {"block": "softmax", "model": {"mlp": "swiglu"}}},
                     model={"d_mlp": 16})
    with pytest.raises(ValueError, match="cannot be matched") as e:
        parse_experiment(raw)
    suggested = int(re.search(r"nearest feasible setting: model\.d_mlp=(\d+)",
                              str(e.value))[1])
    would = int(re.search(r"would give it d_mlp=(-?\d+)", str(e.value))[1])

    def feasible(d_mlp: int) -> bool:
        try:
            return parse_experiment({**raw, "model": {**raw["model"], "d_mlp": d_mlp}}
                                    ).d_mlp["mha"] >= 8  # the floor, a quarter of d_model
        except ValueError:
            return False

    assert feasible(suggested) and not feasible(suggested - 1)
    # one for one, the rule between MLPs of one kind, falls short: a unit of a GELU
    # reference's width moves a SwiGLU variant's by 2/3
    assert not feasible(16 + 8 - would)
