"""The attention shape and caps a HF config declares: duck-typed configs, no transformers
needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from budgets import attention_budget
from budgets.hf.geometry import Geometry, declared_budget, window_of


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


@pytest.mark.parametrize("window", [None, 8, 64])
def test_declared_budget_is_the_shared_attention_formula(window):
    g = Geometry.from_config(_config())
    got = declared_budget(g, 32, window, params=1000)
    assert got == attention_budget("mistral", 32, n_heads=4, n_kv_heads=2, head_dim=8,
                                   d_model=32, window=window, params=1000)


def test_a_window_averages_the_keys_seen_over_the_sequence():
    g = Geometry.from_config(_config())
    T, W, H, G, K, D = 32, 8, 4, 2, 8, 32
    keys_seen = W * (W + 1) // 2 + (T - W) * W  # t + 1 keys up to W, then W
    want = 2 * D * (2 * H * K + 2 * G * K) + 2 * H * 2 * K * keys_seen // T
    budget = declared_budget(g, T, W, params=0)
    assert budget.flops_per_token == want
    assert (budget.mixing, budget.inference, budget.cache_elements) == (W - 1, W, 2 * W * G * K)


def test_window_of_reads_layer_types_then_the_global_switch():
    typed = _config(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    assert [window_of(typed, i) for i in range(2)] == [8, None]
    assert window_of(_config(sliding_window=8, use_sliding_window=False), 0) is None
    assert window_of(_config(sliding_window=8), 1) == 8
    assert window_of(_config(), 0) is None


def test_errors_name_parameters_not_flags():
    g = Geometry.from_config(_config())
    with pytest.raises(ValueError, match=r"^seq_len=256 exceeds the mistral model's "
                                         r"max_position_embeddings \(128\)"):
        g.check_seq_len(256)
    g.check_seq_len(128)
