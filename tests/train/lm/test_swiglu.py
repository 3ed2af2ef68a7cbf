"""model.mlp: swiglu: LLaMA's gated MLP, its width rule, and a hybrid and decoding with it."""

import pytest
import torch

from train.config import parse_experiment
from train.lm.decoder import MLP, DecoderLM, SwiGLU, build_model, mlp_width

from ..conftest import tiny_experiment


def tiny(**kw) -> DecoderLM:
    args = dict(vocab_size=32, d_model=24, n_layers=2, block="softmax",
                block_kwargs={"n_heads": 2}, max_len=24)
    return DecoderLM(**{**args, **kw})


def test_swiglu_is_the_gated_formula_in_fp64():
    torch.manual_seed(0)
    mlp = SwiGLU(8, 12).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    gate, up, down = mlp.gate.weight, mlp.up.weight, mlp.down.weight
    a = x @ gate.T
    expected = ((a / (1 + torch.exp(-a))) * (x @ up.T)) @ down.T  # silu(a) = a * sigmoid(a)
    torch.testing.assert_close(mlp(x), expected)


def test_three_matrices_and_the_two_thirds_width():
    gelu, swiglu = tiny(), tiny(mlp="swiglu")
    assert all(isinstance(layer.mlp, MLP) for layer in gelu.layers)
    assert all(isinstance(layer.mlp, SwiGLU) for layer in swiglu.layers)
    assert gelu.d_mlp == 96 and swiglu.d_mlp == mlp_width(24, 4.0, None, "swiglu") == 64
    per_layer = {name: sum(p.numel() for p in model.layers[0].mlp.parameters())
                 for name, model in (("gelu", gelu), ("swiglu", swiglu))}
    assert per_layer == {"gelu": 2 * 24 * 96, "swiglu": 3 * 24 * 64}  # equal at the same ratio
    assert gelu.param_count() == swiglu.param_count()
    assert tiny(mlp="swiglu", d_mlp=10).layers[0].mlp.gate.weight.shape == (10, 24)
    with pytest.raises(ValueError, match=r"mlp must be one of \['gelu', 'swiglu'\], got 'relu'"):
        tiny(mlp="relu")


def test_the_output_projection_is_scaled_like_gelus():
    torch.manual_seed(0)
    model = tiny(mlp="swiglu", d_model=64, n_layers=8)
    down = torch.cat([layer.mlp.down.weight.flatten() for layer in model.layers])
    gate = torch.cat([layer.mlp.gate.weight.flatten() for layer in model.layers])
    assert abs(down.std().item() - 0.02 / 4) < 0.0005 and abs(gate.std().item() - 0.02) < 0.002


def test_a_swiglu_hybrid_decodes_like_its_parallel_forward():
    torch.manual_seed(0)
    layers = [("sliding_window", {"n_heads": 2, "window": 4}), ("softmax", {"n_heads": 2})]
    model = tiny(block=None, block_kwargs=None, layers=layers, mlp="swiglu").eval()
    tokens = torch.randint(32, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache(2)
        steps = [model(tokens[:, :6], cache)] + [model(tokens[:, t:t + 1], cache)
                                                 for t in range(6, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_a_variant_sets_its_own_mlp_and_configs_without_one_stay_gelu():
    raw = tiny_experiment(variants={
        "mha": {"block": "softmax"},
        "swiglu": {"block": "softmax", "model": {"mlp": "swiglu"}},
        "hybrid": {"layers": [{"block": "softmax"}], "model": {"mlp": "swiglu"}}})
    exp = parse_experiment(raw)
    kinds = {v: type(build_model(exp.variant_config(v)).layers[0].mlp) for v in exp.variants}
    assert kinds == {"mha": MLP, "swiglu": SwiGLU, "hybrid": SwiGLU}
    assert exp.variant_config("swiglu")["model"]["d_mlp"] == mlp_width(16, 4.0, None, "swiglu")
    assert parse_experiment(exp.to_dict()).variants == exp.variants  # reloads
    old = exp.variant_config("mha")
    del old["model"]["mlp"]  # a config.yaml written before model.mlp existed
    assert isinstance(build_model(old).layers[0].mlp, MLP)
    for variants, match in [
        ({"a": {"block": "softmax", "model": {"mlp": "geglu"}}},
         r"variants\.a\.model\.mlp must be one of \['gelu', 'swiglu'\], got 'geglu'"),
        ({"a": {"block": "softmax", "model": {"d_model": 8}}},
         r"variants\.a\.model: \['d_model'\] cannot differ between variants"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_experiment(tiny_experiment(variants=variants))
    with pytest.raises(ValueError, match=r"model\.mlp must be one of"):
        parse_experiment(tiny_experiment(model={"mlp": "relu"}))
