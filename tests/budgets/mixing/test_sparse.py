"""The sparse family's math (budgets/mixing/sparse.py) against plain enumerations: the
pooling matrix against the pooled slots, the slots' visibility, the key counts the FLOPs
are made of, and the masked softmax of a branch that sees nothing yet."""

import pytest
import torch

from budgets.mixing.sparse import (
    SparseShape,
    compress,
    floor_sum,
    keys_up_to,
    masked_softmax,
    pool_weights,
    pooling_matrix,
    selected_keys,
    slot_visible,
)


def test_key_counts_are_the_enumerations():
    for T in range(1, 40):
        for k in range(1, 12):
            assert keys_up_to(T, k) == sum(min(k, n) for n in range(1, T + 1))
            assert floor_sum(T, k) == sum(t // k for t in range(T))


@pytest.mark.parametrize("top_k, block", [(1, 1), (1, 4), (2, 4), (3, 5), (9, 2)])
def test_block_selection_counts_its_own_block_and_whole_earlier_ones(top_k, block):
    shape = SparseShape(32, 4, 1, 8, "block", top_k, block)
    for T in range(1, 40):
        want = sum(min(top_k, t // block + 1) * block - (block - 1 - t % block)
                   for t in range(T))  # k blocks (or all), the own one up to t
        assert selected_keys(shape, T) == want, T


@pytest.mark.parametrize("gated", [False, True], ids=["mean", "gated"])
def test_pooling_matrix_rebuilds_the_slots(gated):
    B, G, T, rate = 2, 3, 11, 3
    k, v = torch.randn(B, G, T, 4, dtype=torch.float64), torch.randn(B, G, T, 5,
                                                                     dtype=torch.float64)
    logits = torch.randn(B, G, T, dtype=torch.float64) if gated else None
    w = pool_weights(logits, T, rate, k)  # [B, G, 9]
    slot_k, slot_v = compress(k, v, w, rate)  # 3 complete slots; tokens 9, 10 in none
    pool = pooling_matrix(w, T, rate)  # [B, G, 3, T]
    assert pool.shape == (B, G, 3, T) and bool((pool[..., 9:] == 0).all())
    torch.testing.assert_close(pool.sum(-1), torch.ones(B, G, 3, dtype=torch.float64))
    torch.testing.assert_close(pool @ k, slot_k)
    torch.testing.assert_close(pool @ v, slot_v)
    if not gated:
        torch.testing.assert_close(slot_k[:, :, 1], k[:, :, 3:6].mean(2))


def test_a_slot_is_visible_once_complete():
    seen = slot_visible(torch.arange(10), 3, 3)  # slots end at 2, 5, 8
    assert seen.sum(-1).tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]


def test_a_branch_with_nothing_visible_gives_zeros_and_finite_gradients():
    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    allowed = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    p = masked_softmax(logits, allowed)
    assert p[1].abs().sum() == 0 and p[0, 1] == 0
    torch.testing.assert_close(p[[0, 2]].sum(-1), torch.ones(2, dtype=torch.float64))
    (g,) = torch.autograd.grad((p * torch.randn_like(p)).sum(), logits)
    assert bool(torch.isfinite(g).all()) and g[1].abs().sum() == 0
