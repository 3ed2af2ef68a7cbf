"""The sparse family's math (budgets/mixing/sparse.py) against plain enumerations: the
pooling matrix against the pooled slots, the slots' visibility, the key counts the FLOPs
are made of, and the masked softmax of a branch that sees nothing yet."""

import pytest
import torch

from budgets.mixing.sparse import (
    SparseShape,
    compress,
    compressed_mixing,
    floor_sum,
    keys_up_to,
    masked_softmax,
    pool_weights,
    pooling_matrix,
    selected_keys,
    slot_visible,
    slots_up_to,
    sparse_mixing,
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


def test_slots_read_are_the_enumeration():
    for T in range(1, 40):
        for k in range(1, 6):
            for rate in range(1, 5):
                want = sum(min(k, (p + 1) // rate) for p in range(T))
                assert slots_up_to(T, k, rate) == want, (T, k, rate)


def random_compressed_mixing(T, rate, window, top_k=None, G=1, H=2, seed=0):
    """M of a random compressed-only layer: gated pooling, random sigmoid gates, and (top_k)
    a random choice of complete slots per query (any choice: the cap holds for all)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, 6, dtype=torch.float64, generator=g)
    k = torch.randn(1, G, T, 6, dtype=torch.float64, generator=g)
    weights = pool_weights(torch.randn(1, G, T, dtype=torch.float64, generator=g), T, rate, k)
    pool = pooling_matrix(weights, T, rate)  # [1, G, S, T]
    S = T // rate
    mask = None
    if top_k is not None:
        scores = torch.rand(1, G, T, S, dtype=torch.float64, generator=g)
        mask = torch.zeros(1, G, T, S, dtype=torch.bool)
        mask.scatter_(-1, scores.topk(min(top_k, S), -1).indices, True)
    n = 1 + (window is not None)
    gates = torch.sigmoid(torch.randn(1, H, T, n, dtype=torch.float64, generator=g))
    return sparse_mixing(q, k, None, scale=0.4, gates=gates, window=window, pool=pool,
                         rate=rate, slot_mask=mask)


@pytest.mark.parametrize("T, rate, window, top_k", [
    (32, 4, 3, None), (32, 3, 5, None), (33, 5, None, None), (40, 4, 1, None),
    (32, 2, 4, 3), (30, 4, 2, 1), (64, 8, 6, 2)],
    ids=["r4-W3", "r3-W5-straddling", "r5-noW", "r4-W1", "slots-k3", "slots-k1", "r8-W6-k2"])
def test_compressed_cap_bounds_the_realized_past_future_rank(T, rate, window, top_k):
    """rank M[t:, :t] <= min(T/2, ceil(t/rate) + W - 1) on random instances, and random
    instances reach it (the cap is not loose), with every slot or a top-k of them."""
    shape = SparseShape(32, 2, 1, 6, "slots" if top_k else "none", top_k or 1, rate=rate,
                        gated_pooling=True, window=window)
    cap, t = compressed_mixing(shape, T), T // 2
    realized = set()
    for seed in range(3):
        M = random_compressed_mixing(T, rate, window, top_k, seed=seed)[0]  # [H, T, T]
        realized |= {int(r) for r in torch.linalg.matrix_rank(M[:, t:, :t])}
    assert max(realized) <= cap < t, (realized, cap)
    if top_k is None or top_k > 1:  # one slot per query may leave a slot unread
        assert max(realized) == cap, (realized, cap)
