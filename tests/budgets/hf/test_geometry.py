"""The attention shape a HF config declares (duck-typed configs, no transformers needed),
and the caps and windows the probe declares for each layer as the model's forward shows
it (the window test builds tiny models, so it needs transformers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from budgets import attention_budget
from budgets.capture.attention import AttentionCall
from budgets.hf.geometry import Geometry


def _config(**extra):
    base = dict(model_type="mistral", num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, hidden_size=32, max_position_embeddings=128)
    return SimpleNamespace(**{**base, **extra})


def test_geometry_reads_the_standard_names_and_defaults():
    g = Geometry.from_config(_config())
    assert (g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim, g.d_model, g.max_len) == (
        2, 4, 2, 8, 32, 128)  # head_dim = D / H when the config has none
    mha = Geometry.from_config(_config(num_key_value_heads=None, head_dim=16))
    assert (mha.n_kv_heads, mha.head_dim) == (4, 16)


def declared_caps(H: int, G: int, K: int, T: int, d_model: int, window: int | None,
                  params: int, block: str):
    """The caps the probe declares for an attention call of H query heads over G KV heads
    of width K (budgets/capture/attention.py AttentionCall.caps)."""
    call = AttentionCall(torch.nn.Identity(), torch.zeros(1, H, T, K), torch.zeros(1, G, T, K),
                         torch.zeros(1, G, T, K), K ** -0.5, window=window)
    return call.caps(T, d_model, params, block)


@pytest.mark.parametrize("window", [None, 8, 64])
def test_declared_caps_are_the_shared_attention_formula(window):
    got = declared_caps(4, 2, 8, 32, d_model=32, window=window, params=1000, block="mistral")
    assert got == attention_budget("mistral", 32, n_heads=4, n_kv_heads=2, head_dim=8,
                                   d_model=32, window=window, params=1000)


def test_a_window_averages_the_keys_seen_over_the_sequence():
    T, W, H, G, K, D = 32, 8, 4, 2, 8, 32
    keys_seen = W * (W + 1) // 2 + (T - W) * W  # t + 1 keys up to W, then W
    want = 2 * D * (2 * H * K + 2 * G * K) + 2 * H * 2 * K * keys_seen // T
    budget = declared_caps(H, G, K, T, d_model=D, window=W, params=0, block="mistral")
    assert budget.flops_per_token == want
    assert (budget.mixing, budget.inference, budget.cache_elements) == (W - 1, W, 2 * W * G * K)


@pytest.mark.parametrize("model_type, extra", [
    ("gpt_oss", {}),  # layer_types names each layer's attention
    ("qwen2", {"sliding_window": 8, "use_sliding_window": False}),  # the switch (no window)
    ("mistral", {}),  # a window, no switch (every layer)
    ("llama", {}),  # no window at all
])
def test_each_layers_window_is_the_one_its_forward_attends_with(model_type, extra):
    """The probe reads a layer's window from the call its forward makes: the config's
    layer types and switches are the model's own business, so the window each layer
    attends with is read here from its eager P (how far back its keys reach)."""
    pytest.importorskip("transformers", reason="tiny models need transformers")
    from budgets.hf.capture import capture
    from tests.hf_tiny import VOCAB, tiny_model

    T = 16
    model, calls = tiny_model(model_type, **extra), []
    ids = torch.randint(3, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions  # [1, H, T, T]
    with torch.no_grad(), capture(model, calls.append):
        model(input_ids=ids)
    back = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # t - s
    windows = []
    for P in attentions:
        reach = int(back[(P[0] > 0).any(0)].max()) + 1  # the keys a query sees, itself too
        windows.append(None if reach == T else reach)
    assert [c.window for c in calls] == windows


def test_errors_name_parameters_not_flags():
    g = Geometry.from_config(_config())
    with pytest.raises(ValueError, match=r"^seq_len=256 exceeds the mistral model's "
                                         r"max_position_embeddings \(128\)"):
        g.check_seq_len(256)
    g.check_seq_len(128)
