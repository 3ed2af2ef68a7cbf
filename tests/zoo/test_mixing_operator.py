"""Each block's matrix-free mixing (mixing_operator) against its materialized matrix."""

import pytest
import torch

import budgets
import budgets.rank.matfree as matfree
import zoo
from budgets.probe.blocks import mixing_figures, mixing_figures_matfree
from tests.zoo.conftest import Shapes

CASES = {
    "mha": ("softmax", {}),
    "gqa": ("softmax", {"n_kv_heads": 2}),
    "window6": ("sliding_window", {"window": 6}),
    "mla": ("mla", {}),
    "linear-F4": ("linear", {"feature_dim": 4}),
    "linear-unnormalized": ("linear", {"normalize": False}),
    "ssm-N4": ("ssm", {"d_state": 4}),
    "ssm-G2": ("ssm", {"d_state": 4, "n_groups": 2}),
}


def build(case: str, seed: int = 0):
    name, kwargs = CASES[case]
    torch.manual_seed(seed)
    return zoo.build(name, d_model=32, n_heads=4, **kwargs).eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_matrix_free_past_future_equals_exact(case):
    block, x = build(case), torch.randn(2, 48, 32)
    exact = mixing_figures(block.mixing_matrices(x), 0.1)[0]
    free = mixing_figures_matfree(block.mixing_operator(x), 0.1, k_max=64)[0]
    for quantity in free:  # past_future always; mixing and centered for attention
        got, want = free[quantity][0], exact[quantity][0]
        assert got["rank_eps"] == want["rank_eps"], quantity
        torch.testing.assert_close(torch.tensor(got["stable_rank"]),
                                   torch.tensor(want["stable_rank"]), rtol=1e-4, atol=1e-6)
    assert "past_future" in free


def test_factored_blocks_give_every_metric_exactly():
    block, x = build("ssm-N4"), torch.randn(2, 48, 32)
    exact = mixing_figures(block.mixing_matrices(x), 0.1)[0]["past_future"][0]
    free = mixing_figures_matfree(block.mixing_operator(x), 0.1)[0]["past_future"][0]
    torch.testing.assert_close(torch.tensor(free["erank"]), torch.tensor(exact["erank"]),
                               rtol=1e-4, atol=1e-6)


def test_moe_has_no_operator_and_is_probed_exactly():
    torch.manual_seed(0)
    block = zoo.build("moe", d_model=32, n_heads=4, top_k=2).eval()
    x = torch.randn(1, 24, 32)
    assert block.mixing_operator(x) is None
    probe = budgets.probe_model(block, x, matfree_from=8)
    assert probe["layers"][0]["quantities"]["mixing"]["rank_eps"]


@pytest.mark.parametrize("case", ["mha", "window6", "linear-F4", "ssm-N4"])
def test_a_long_probe_holds_no_T_by_T_tensor(case, monkeypatch):
    """Above matfree_from, probing a block allocates nothing with two dims >= T/2."""
    block, T = build(case), 320  # T/2 above every width (ssm: 140) and k_max = 64
    x = torch.randn(1, T, 32)
    monkeypatch.setattr(matfree, "CHUNK_ELEMENTS", 4 * 8 * T)  # chunks of 8 query rows
    with Shapes() as seen:
        probe = budgets.probe_model(block, x, matfree_from=T)
    assert probe["matfree"] == {"from": T, "k_max": matfree.K_MAX}
    assert any(T in s for s in seen.shapes)
    assert [s for s in seen.shapes if sum(d >= T // 2 for d in s) >= 2] == []
