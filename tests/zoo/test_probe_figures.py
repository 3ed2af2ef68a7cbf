"""The probe's per-head, per-length and per-KV-head figures on zoo blocks: the optional
`key_value_heads(x)` of the softmax family, and the matrix-free figures of every family."""

import pytest
import torch

import budgets
import zoo
from zoo.rope import apply_rope

B, T, D = 2, 48, 32


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def _block(name: str, **kwargs):
    torch.manual_seed(0)
    return zoo.build(name, d_model=D, n_heads=4, **kwargs).eval()


def test_key_value_heads_are_what_the_cache_holds_and_the_keys_before_rope():
    block, x = _block("softmax", n_kv_heads=2), _x()
    heads = block.key_value_heads(x)
    assert set(heads) == {"k", "v", "k_pre_rope"}
    assert heads["k"].shape == heads["k_pre_rope"].shape == (B, 2, T, D // 4)
    torch.testing.assert_close(heads["k"], apply_rope(heads["k_pre_rope"], 0, 10000.0))
    cache = block.init_cache(B, T)
    block(x, cache=cache)
    state = block.inference_state(cache)
    for name in ("k", "v"):  # the cache joins the KV heads: [B, T, G*K]
        torch.testing.assert_close(heads[name].transpose(1, 2).reshape(B, T, -1), state[name])
    assert set(_block("softmax", rope=False).key_value_heads(x)) == {"k", "v"}


def test_sliding_window_gives_the_tokens_its_rolling_cache_keeps():
    block, x = _block("sliding_window", window=6), _x()
    heads = block.key_value_heads(x)
    assert heads["k"].shape[-2] == 6
    cache = block.init_cache(B, T)
    block(x, cache=cache)
    k = block.inference_state(cache)["k"]  # [B, W, G*K]
    torch.testing.assert_close(heads["k"].transpose(1, 2).reshape(B, 6, -1), k)


def test_kv_heads_read_a_planted_low_rank_key_projection_before_rope():
    block, x, r = _block("softmax", n_kv_heads=2), _x(), 3
    G, K = 2, D // 4
    g = torch.Generator().manual_seed(1)
    U = torch.linalg.qr(torch.randn(G, K, r, generator=g)).Q  # [G, K, r]
    V = torch.linalg.qr(torch.randn(G, D, r, generator=g)).Q  # [G, D, r]
    with torch.no_grad():
        block.k_proj.weight.copy_((U @ V.mT).reshape(G * K, D))
    kv = budgets.probe_model(torch.nn.Sequential(block), x)["layers"][0]["kv_heads"]
    assert (kv["n_kv_heads"], kv["head_dim"], kv["v_head_dim"], kv["rope"]) == (G, K, K, True)
    assert kv["k_pre_rope"]["rank_eps"] == kv["k_pre_rope"]["rank_eps_max"] == [float(r)] * G
    assert min(kv["k"]["rank_eps"]) > r
    assert "kv_heads" not in budgets.probe_model(torch.nn.Sequential(_block("linear")), x
                                                 )["layers"][0]


@pytest.mark.parametrize("name, kwargs", [("softmax", {}), ("sliding_window", {"window": 6}),
                                          ("linear", {"feature_dim": 4}), ("ssm", {"d_state": 4}),
                                          ("mla", {})])
def test_matrix_free_figures_equal_the_exact_ones(name, kwargs):
    model, x = torch.nn.Sequential(_block(name, **kwargs)), _x()
    exact = budgets.probe_model(model, x, matfree_from=None)["layers"][0]
    free = budgets.probe_model(model, x, matfree_from=16)["layers"][0]
    assert [e["seq_len"] for e in free["past_future_lengths"]] == [12, 24, 48]
    for a, b in zip(exact["past_future_lengths"], free["past_future_lengths"], strict=True):
        assert (b["seq_len"], b["rank_eps"], b["rank_eps_max"]) == (
            a["seq_len"], a["rank_eps"], a["rank_eps_max"])
    factored = free["heads"]["first_token_mass"][0] is None
    assert factored == (name in ("linear", "ssm"))  # known by past->future factors only
    for stat in ("first_token_mass", "diagonal_mass", "centered_energy"):
        assert len(exact["heads"][stat]) == 4 and None not in exact["heads"][stat]
        if not factored:
            assert free["heads"][stat] == pytest.approx(exact["heads"][stat], abs=1e-5), stat
