"""train/commands/compress/bases/lowrank.py: bases from activations, projections, bytes, rank
allocation."""

import pytest
import torch

from budgets.advice.kv import kv_option
from budgets.probe.streams import kv_head_figures
from train.commands.compress.bases.lowrank import (
    Slot,
    SlotStats,
    cache_bytes,
    eps_ranks,
    full_ranks,
    greedy_ranks,
    project_heads,
    project_rows,
    projectors,
    retained_energy,
    slot_bytes,
    uniform_ranks,
)

B, G, T, K = 3, 2, 40, 8


def planted(rank: int, seed: int = 0) -> torch.Tensor:
    """Activations [B, G, T, K] whose rows span a rank-`rank` subspace per head."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randn(B, G, T, rank, generator=g)
    basis = torch.randn(G, rank, K, generator=g)
    return codes @ basis  # [B, G, T, K]


def stats_of(a: torch.Tensor) -> SlotStats:
    st = SlotStats(Slot(0, "k", a.shape[1], a.shape[-1]))
    st.add(a)
    return st


def test_planted_rank_is_kept_at_r_and_lost_at_r_minus_one():
    r = 3
    a = planted(r)
    U, energy = stats_of(a).basis()
    assert energy.shape == (G, K) and (energy[:, r:] < 1e-10 * energy[:, :1]).all()
    exact = project_heads(a.double(), projectors(U, [r] * G))
    assert torch.allclose(exact, a.double(), atol=1e-5)  # a is fp32: rank r up to rounding
    short = project_heads(a.double(), projectors(U, [r - 1] * G))
    assert (short - a.double()).norm() > 1e-2 * a.norm()
    assert retained_energy(energy, [r] * G) == pytest.approx([1.0] * G)
    assert all(x < 0.999 for x in retained_energy(energy, [r - 1] * G))


def test_bases_are_uncentered():
    # a constant offset is what a cache stores, so it is a direction the basis must keep
    a = torch.ones(1, 1, T, K) * 5 + 0.01 * torch.randn(1, 1, T, K)
    U, energy = stats_of(a).basis()
    top = U[0, :, 0].abs()
    assert torch.allclose(top, torch.full((K,), K ** -0.5, dtype=torch.float64), atol=1e-2)
    assert energy[0, 0] > 0.99 * energy[0].sum()


def test_projecting_the_weight_projects_the_activation():
    D = 16
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(G * K, D, generator=g), torch.randn(G * K, generator=g)
    x = torch.randn(5, D, generator=g)
    a = (x @ w.T + b).view(5, G, K).transpose(0, 1)[None]  # [1, G, 5, K]
    U, _ = stats_of(a).basis()
    P = projectors(U, [2, 5])
    w2, b2 = project_rows(w, P), project_rows(b[:, None], P)[:, 0]
    via_weights = (x @ w2.T + b2).view(5, G, K).transpose(0, 1)[None]
    assert torch.allclose(via_weights, project_heads(a, P), atol=1e-5)
    assert torch.allclose(project_rows(w, projectors(U, [K, K])), w, atol=1e-5)


def test_kv_bytes_by_hand_and_as_the_report_counts_them():
    # 2 layers, G = 2 KV heads, K = V = 8, bf16, bases amortized at T = 32
    slots = [Slot(i, kind, 2, 8) for i in range(2) for kind in ("k", "v")]
    ranks = {(0, "k"): [3, 2], (0, "v"): [4, 1], (1, "k"): [1, 1], (1, "v"): [2, 2]}
    got = cache_bytes(slots, ranks, 2, 32)
    per_token = (3 + 2 + 4 + 1 + 1 + 1 + 2 + 2) * 2  # 32 B of codes
    basis = 8 * (3 + 2 + 4 + 1 + 1 + 1 + 2 + 2) * 2  # 256 B of bases per sequence
    full = 2 * (8 + 8) * 2 * 2  # 128 B per token
    assert got["code_bytes_per_token"] == per_token and got["basis_bytes"] == basis
    assert got["full_bytes_per_token"] == full
    assert got["bytes_per_token"] == pytest.approx(per_token + basis / 32)  # 40 B
    assert got["ratio"] == pytest.approx(full / 40)
    # the same figure as the report's kv advice for layer 0 (budgets/advice/kv.py)
    kv = {"n_kv_heads": 2, "head_dim": 8, "v_head_dim": 8, "k": {"rank_eps_max": [3, 2]},
          "v": {"rank_eps_max": [4, 1]}}
    layer0 = cache_bytes(slots[:2], ranks, 2, 32)
    assert kv_option(kv, "k", 2, 32)["cache_bytes_per_token"] == pytest.approx(
        layer0["bytes_per_token"])
    assert cache_bytes(slots, full_ranks(slots), 2, 32)["ratio"] < 1  # bases cost extra


def test_a_window_slot_holds_w_tokens_of_t():
    # Gemma 3's mix at T = 1024: a local layer (W = 128) holds an eighth of what a global
    # layer holds, so its bytes per token are an eighth, full and low-rank alike
    local, glob = Slot(0, "k", 1, 8, window=128), Slot(1, "k", 1, 8)
    for T, share in ((1024, 128 / 1024), (64, 1.0)):  # a window longer than T holds T
        for shared in (True, False):
            a, b = slot_bytes(local, [2], 2, T, shared), slot_bytes(glob, [2], 2, T, shared)
            assert a["full"] == pytest.approx(share * b["full"])
            assert a["codes"] == pytest.approx(share * b["codes"])
            assert a["basis"] == b["basis"]  # the basis is the same size
    both = [local, glob]
    ranks = {local.key: [1], glob.key: [8]}
    assert cache_bytes(both, ranks, 2, 1024, True)["ratio"] == pytest.approx(
        (8 * 2 * (1 + 1 / 8)) / (8 * 2 + 1 * 2 / 8))


def test_state_and_latent_bytes_by_hand():
    # linear attention: H = 2 heads, F = 6 feature rows, V + 1 = 5 columns, fp32, T = 10
    state = Slot(0, "state", 2, 6, columns=5)
    got = cache_bytes([state], {(0, "state"): [2, 3]}, 4, 10)
    assert got["full_bytes_per_token"] == pytest.approx(2 * 6 * 5 * 4 / 10)
    assert got["bytes_per_token"] == pytest.approx(((2 + 3) * 5 * 4 + 6 * (2 + 3) * 4) / 10)
    # an SSM group's conv state stays in full
    ssm = Slot(0, "state", 1, 8, columns=32, fixed_per_sequence=12)
    got = cache_bytes([ssm], {(0, "state"): [2]}, 2, 16)
    assert got["bytes_per_token"] == pytest.approx((2 * 32 * 2 + 12 * 2 + 8 * 2 * 2) / 16)
    # MLA: latent R = 16 coded to r = 4, the RoPE key (4) kept per token
    mla = Slot(0, "latent", 1, 16, fixed_per_token=4)
    got = cache_bytes([mla], {(0, "latent"): [4]}, 2, 64)
    assert got["full_bytes_per_token"] == (16 + 4) * 2
    assert got["bytes_per_token"] == pytest.approx((4 + 4) * 2 + 16 * 4 * 2 / 64)


SLOTS = [Slot(i, kind, 2, 8) for i in range(3) for kind in ("k", "v")]


def test_uniform_is_the_largest_r_that_reaches_the_ratio():
    for target in (1.5, 2.0, 4.0):
        ranks = uniform_ranks(SLOTS, target, 2, 64)
        r = ranks[(0, "k")][0]
        assert len({x for v in ranks.values() for x in v}) == 1
        assert cache_bytes(SLOTS, ranks, 2, 64)["ratio"] >= target
        more = {k: [r + 1] * 2 for k in ranks}
        assert cache_bytes(SLOTS, more, 2, 64)["ratio"] < target
    assert uniform_ranks(SLOTS, 50.0, 2, 64) is None  # beyond r = 1
    with pytest.raises(ValueError, match="must be > 1"):
        uniform_ranks(SLOTS, 1.0, 2, 64)


def test_greedy_fits_the_bytes_and_follows_the_energy():
    g = torch.Generator().manual_seed(0)
    energies = {s.key: torch.rand(2, 8, generator=g).sort(descending=True).values
                for s in SLOTS}
    # layer 1's keys: almost all energy in 6 directions; the rest: almost all in 1
    energies[(1, "k")] = torch.tensor([[1.0] * 6 + [1e-6] * 2] * 2)
    for s in SLOTS:
        if s.key != (1, "k"):
            energies[s.key] = torch.tensor([[1.0] + [1e-3] * 7] * 2)
    ranks = greedy_ranks(SLOTS, energies, 2.0, 2, 64)
    size = cache_bytes(SLOTS, ranks, 2, 64)
    assert size["ratio"] >= 2.0 - 1e-9
    assert ranks[(1, "k")] == [6, 6]  # its six strong directions, not its two faint ones
    assert sum(map(sum, ranks.values())) > 12 + 10  # the bytes left went to the others
    assert greedy_ranks(SLOTS, energies, 50.0, 2, 64) is None
    with pytest.raises(ValueError, match="must be > 1"):
        greedy_ranks(SLOTS, energies, 0.5, 2, 64)


def test_greedy_on_one_scale_spends_where_the_gains_are_largest():
    # keys' gains a hundredth of the values': by shares each slot looks alike and gets
    # the same ranks; on one scale (output-aware gains) the values take the bytes
    slots = [Slot(0, "k", 1, 8), Slot(0, "v", 1, 8)]
    decay = torch.tensor([[2.0 ** -j for j in range(8)]])
    gains = {(0, "k"): 0.01 * decay, (0, "v"): decay}
    by_shares = greedy_ranks(slots, gains, 2.0, 2, 64, shared=True)
    one_scale = greedy_ranks(slots, gains, 2.0, 2, 64, shared=True, shares=False)
    assert by_shares[(0, "k")] == by_shares[(0, "v")]
    assert one_scale[(0, "v")][0] > one_scale[(0, "k")][0]
    for ranks in (by_shares, one_scale):  # both spend the same bytes: 8 of 16 codes
        assert ranks[(0, "k")][0] + ranks[(0, "v")][0] == 8
    # what each keeps of the gains, summed over both slots: one scale keeps more
    kept = {name: sum(float(gains[k][0, :r[k][0]].sum()) for k in gains)
            for name, r in (("shares", by_shares), ("one", one_scale))}
    assert kept["one"] > kept["shares"]


def test_eps_ranks_are_the_reports_pooled_ranks():
    a = planted(5) + 0.05 * torch.randn(B, G, T, K, generator=torch.Generator().manual_seed(3))
    st = stats_of(a)
    for eps in (0.05, 0.1, 0.3):
        report = kv_head_figures({"k": a, "v": a}, eps)["k"]
        assert st.rank_eps_max(eps) == [int(x) for x in report["rank_eps_max"]]
        assert st.rank_eps_pooled(eps) == [int(x) for x in report["rank_eps_pooled"]]
        assert eps_ranks({(0, "k"): st}, eps)[(0, "k")] == [
            max(1, int(x)) for x in report["rank_eps_pooled"]]
    with pytest.raises(ValueError, match="eps"):
        st.rank_eps_max(1.0)


def test_bad_shapes_are_named():
    st = SlotStats(Slot(0, "k", 2, 8))
    with pytest.raises(ValueError, match=r"expected activations \[B, 2, T, 8\]"):
        st.add(torch.zeros(1, 3, 4, 8))
    with pytest.raises(ValueError, match="no calibration activations"):
        st.basis()
    with pytest.raises(ValueError, match="rank 9 of head 0 outside"):
        projectors(torch.eye(8).expand(2, 8, 8).double(), [9, 1])
