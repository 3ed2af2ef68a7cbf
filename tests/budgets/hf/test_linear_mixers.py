"""The linear mixers read from their modules' forwards (budgets/hf/hooked.py): lfm2's
gated short convolutions, recurrent_gemma's RG-LRU and MiniMax's lightning attention, on
tiny random fp64 models (tests/hf_tiny.py): each layer's M rebuilds the module's own
output, equals an independent recurrence, factors within its cap, and the probe measures
every decoder layer (tests/budgets/hf/mixer_checks.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers",
                    reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

from budgets.hf.hooked import capture_hooked  # noqa: E402
from tests.budgets.hf.mixer_checks import (  # noqa: E402
    captured,
    check_factors,
    check_probe,
    check_readout,
    fp64_decays,
    ids,
    relative,
)
from tests.hf_tiny import tiny_model  # noqa: E402

LABELS = {
    "lfm2": ["short conv L=3", "global", "short conv L=3"],
    "recurrent_gemma": ["RG-LRU", "RG-LRU", "sliding W=16"],
    "minimax": ["lightning K=16", "global"],
}
# the largest relative error of M's readout against the module's output: the RG-LRU's scan
# accumulates in fp32; the convolution and lightning attention run in fp64
REPRODUCTION = {"lfm2": 1e-12, "recurrent_gemma": 1e-6, "minimax": 1e-12}


@pytest.fixture(scope="module", params=list(LABELS))
def calls(request) -> tuple[str, list]:
    return request.param, captured(request.param, [capture_hooked])


def test_m_rebuilds_the_modules_output(calls):
    model_type, found = calls
    assert len(found) == sum(label != "global" and "W=" not in label
                             for label in LABELS[model_type])
    check_readout(found, REPRODUCTION[model_type])


def _diagonal_recurrence(call) -> torch.Tensor:
    """h [B, T, Ch] of h_t = a_t h_{t-1} + b_t x_t per channel, in fp64."""
    h, out = torch.zeros(call.x.shape[:2], dtype=torch.float64), []
    for t in range(call.x.shape[-1]):
        h = torch.exp(call.log_a[..., t]) * h + call.b[..., t] * call.x[..., t].double()
        out.append(h)
    return torch.stack(out, 1)


def test_the_rg_lru_mixing_equals_its_recurrence():
    for call in captured("recurrent_gemma", [capture_hooked]):
        mixed = call.readout(call.exact() @ call.values())
        assert relative(mixed, _diagonal_recurrence(call)) < 1e-12


def test_lightning_m_v_is_the_attention_before_its_norm():
    """The RMS norm after lightning attention would hide a wrong scale of M (and rounds
    through fp32): M v is checked where the module's norm reads it."""
    model = tiny_model("minimax", fp64=True)
    fp64_decays(model)
    layer = model.model.layers[0].self_attn
    seen: list = []
    handle = layer.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad(), capture_hooked(model, lambda c: None) as found:
        model(input_ids=ids(), use_cache=False)
    handle.remove()
    mixed = found[0].exact() @ found[0].values()  # [B, H, T, V]
    assert relative(mixed.transpose(1, 2).flatten(2), seen[0]) < 1e-13


def test_the_factors_give_the_past_future_block_within_the_cap(calls):
    model_type, found = calls
    check_factors(found, model_type)


def test_a_forward_that_builds_a_graph_is_not_read():
    model = tiny_model("lfm2")
    with capture_hooked(model, lambda c: None) as found:
        model(input_ids=ids(), use_cache=False)
    assert found == []


@pytest.mark.parametrize("model_type", list(LABELS))
def test_every_layer_is_measured_on_both_paths(model_type):
    check_probe(model_type, LABELS[model_type])
