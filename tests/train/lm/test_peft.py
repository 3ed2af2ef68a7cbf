"""PEFT's LoRA on a zoo model: the adapters act in every block's forward, and the probes
account each one against its own r (LoraConfig's `r` and `rank_pattern`)."""

import copy

import pytest
import torch

import budgets
from train.lm.decoder import DecoderLM

peft = pytest.importorskip("peft", reason="PEFT is not installed (pip install peft)")

BLOCKS = {  # block -> (kwargs, projections to adapt)
    "softmax": ({"n_heads": 2, "n_kv_heads": 1}, ["q_proj", "v_proj"]),
    "mla": ({"n_heads": 2, "kv_lora_rank": 8}, ["q_proj", "kv_up"]),
    "moe": ({"n_heads": 4, "top_k": 2}, ["k_proj", "v_proj"]),
    "linear": ({"n_heads": 2, "feature_map": "elu+1"}, ["q_proj", "v_proj"]),
    "ssm": ({"n_heads": 2, "d_state": 4}, ["in_proj", "out_proj"]),
}


def peft_model(block: str, seed: int = 0):
    """A tiny DecoderLM, and the same model with PEFT LoRA (r 4; the second target r 2)
    whose B factors are random (PEFT starts them at zero, which would hide everything)."""
    torch.manual_seed(seed)
    kwargs, targets = BLOCKS[block]
    base = DecoderLM(32, 16, 2, block, kwargs, max_len=16).eval()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                             rank_pattern={targets[1]: 2})
    wrapped = peft.get_peft_model(copy.deepcopy(base), config).eval()
    tokens = torch.randint(0, 32, (2, 16))
    with torch.no_grad():  # PEFT's B starts at zero: the wrapped model is the base model
        torch.testing.assert_close(wrapped(tokens), base(tokens))
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    return base, wrapped, targets


@pytest.mark.parametrize("block", list(BLOCKS))
def test_peft_adapters_act_in_the_forward_and_train(block):
    base, wrapped, _ = peft_model(block)
    tokens = torch.randint(0, 32, (2, 16))
    assert not torch.allclose(base(tokens), wrapped(tokens), atol=1e-4)  # the update acts
    wrapped(tokens).square().mean().backward()
    grads = [p.grad for n, p in wrapped.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    frozen = [p for n, p in wrapped.named_parameters() if "lora_" not in n]
    assert all(not p.requires_grad for p in frozen)


@pytest.mark.parametrize("block", ["softmax", "ssm"])
def test_peft_adapters_accounted_against_r_and_rank_pattern(block):
    _, wrapped, targets = peft_model(block)
    rows = budgets.adapter_ranks(wrapped, eps=0.01)
    assert len(rows) == 2 * len(targets)  # two layers
    for row in rows:
        module = wrapped.get_submodule(row["module"])
        want_r = 2 if row["module"].endswith(targets[1]) else 4
        B = module.lora_B["default"].weight.double()
        A = module.lora_A["default"].weight.double()
        dense = torch.linalg.svdvals(module.scaling["default"] * B @ A)[:want_r]
        assert row["declared"] == want_r and row["scale"] == 8 / want_r
        torch.testing.assert_close(torch.tensor(row["spectrum"], dtype=torch.float64), dense,
                                   rtol=1e-5, atol=1e-6)
        assert row["metrics"]["numerical_rank"] == want_r  # random B, A: full rank r

    probe = budgets.probe_model(wrapped, torch.randint(0, 32, (2, 16)))
    for layer in probe["layers"]:
        assert sorted(a["declared"] for a in layer["adapters"]) == [2, 4]
        assert layer["budget"]["adapter"] == 6
