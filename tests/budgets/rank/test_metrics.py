"""Effective-rank metrics against NumPy on planted spectra, invariances and pitfalls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from budgets import METRICS, rank_metrics


def orthogonal(*shape, gen):
    q, _ = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64, generator=gen))
    return q


def planted(s: torch.Tensor, m: int, n: int, gen) -> torch.Tensor:
    """A = U diag(s) V^T with random orthogonal U [.., m, k], V [.., n, k]; s [..., k]."""
    k = s.shape[-1]
    U = orthogonal(*s.shape[:-1], m, m, gen=gen)[..., :k]
    V = orthogonal(*s.shape[:-1], n, n, gen=gen)[..., :k]
    return (U * s.unsqueeze(-2)) @ V.transpose(-1, -2)


def expected(s: np.ndarray, eps: float) -> dict[str, float]:
    """The definitions, written out independently with NumPy on one spectrum."""
    e = s**2
    need = (1 - eps**2) * e.sum()
    rank_eps, acc = 0, 0.0
    while acc < need:  # walk down the spectrum until enough energy
        acc += e[rank_eps]
        rank_eps += 1
    p = s[s > 0] / s.sum()
    return {
        "rank_eps": rank_eps,
        "erank": float(np.exp(-(p * np.log(p)).sum())),
        "stable_rank": e.sum() / e[0],
        "participation_ratio": e.sum() ** 2 / (e**2).sum(),
        "sigma_1": s[0],
        "sigma_ratio": s[1] / s[0],
    }


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3, 0.6])
def test_planted_spectra_match_numpy_batched(eps):
    gen = torch.Generator().manual_seed(0)
    m, n, k = 9, 6, 6
    s = torch.rand(3, 2, k, dtype=torch.float64, generator=gen) * 5 + 0.1
    n_zero = torch.tensor([[0, 1], [2, 3], [4, 2]])  # planted exact ranks 6, 5, 4, 3, 2, 4
    s = torch.where(torch.arange(k) >= k - n_zero.unsqueeze(-1), 0.0, s)
    s = s.sort(-1, descending=True).values
    A = planted(s, m, n, gen)  # [3, 2, 9, 6]
    got = rank_metrics(A, eps=eps)
    assert set(got) == set(METRICS)
    for name in METRICS:
        assert got[name].shape == (3, 2) and got[name].dtype == torch.float64
    for i in range(3):
        for j in range(2):
            want = expected(s[i, j].numpy(), eps)
            for name, value in want.items():
                assert got[name][i, j].item() == pytest.approx(value, rel=1e-9), (name, i, j)
            rank = np.linalg.matrix_rank(A[i, j].numpy())
            assert got["numerical_rank"][i, j].item() == rank == k - n_zero[i, j]


def test_numerical_rank_of_5_4_3():
    gen = torch.Generator().manual_seed(1)
    s = torch.tensor([5.0, 4.0, 3.0] + [0.0] * 13, dtype=torch.float64)
    got = rank_metrics(planted(s, 16, 16, gen))
    assert got["numerical_rank"].item() == 3
    # energies 25, 16, 9 of 50: 41/50 = 0.82 < 0.99 <= 1, so rank_eps(0.1) is 3 ...
    assert got["rank_eps"].item() == 3
    # ... while eps = 0.5 asks for 75 %, and 25 + 16 = 41 >= 37.5.
    assert rank_metrics(planted(s, 16, 16, gen), eps=0.5)["rank_eps"].item() == 2
    assert got["sigma_ratio"].item() == pytest.approx(0.8)


def test_invariant_under_orthogonal_maps_and_positive_scale():
    gen = torch.Generator().manual_seed(2)
    A = torch.randn(4, 7, 5, dtype=torch.float64, generator=gen)
    A[..., 3:] *= 1e-2  # a spread spectrum, so every metric is far from its bounds
    Q, R = orthogonal(4, 7, 7, gen=gen), orthogonal(4, 5, 5, gen=gen)
    base, moved = rank_metrics(A), rank_metrics(3.5 * Q @ A @ R)
    for name in METRICS:
        scale = 3.5 if name == "sigma_1" else 1.0
        torch.testing.assert_close(moved[name], scale * base[name], rtol=1e-9, atol=0)


def test_stochastic_pitfall_centering_recovers_structure():
    """Near-uniform row-stochastic P: raw reads rank 1, centered reads the planted rank 3."""
    gen = torch.Generator().manual_seed(3)
    n, r = 32, 3
    C = torch.eye(n, dtype=torch.float64) - 1.0 / n  # projector orthogonal to the ones vector
    X = C @ torch.randn(n, r, dtype=torch.float64, generator=gen)
    Y = C @ torch.randn(n, r, dtype=torch.float64, generator=gen)
    Xq, Yq = torch.linalg.qr(X)[0], torch.linalg.qr(Y)[0]  # equal singular values: rank_eps = r
    E = 0.004 * Xq @ Yq.T  # rows sum to 0, so P stays row-stochastic
    P = torch.full((n, n), 1.0 / n, dtype=torch.float64) + E
    assert (P > 0).all() and torch.allclose(P.sum(-1), torch.ones(n, dtype=torch.float64))
    raw, centered = rank_metrics(P), rank_metrics(P, center=True)
    assert raw["rank_eps"].item() == 1
    # s_1 = 1 exactly (the ones direction; E is orthogonal to it on both sides), which the
    # fp64 SVD reads as up to 6e-16 below 1 on 49 of seeds 0-99 (AVX-512 and AVX2 alike)
    assert raw["sigma_1"].item() >= 1.0 - 1e-12
    assert centered["rank_eps"].item() == r
    assert centered["erank"].item() == pytest.approx(r)


def test_center_subtracts_mean_row_without_touching_input():
    gen = torch.Generator().manual_seed(4)
    A = torch.randn(2, 6, 4, generator=gen)
    before = A.clone()
    got = rank_metrics(A, center=True)
    ref = rank_metrics(A - A.mean(-2, keepdim=True))
    for name in METRICS:
        torch.testing.assert_close(got[name], ref[name])
    assert torch.equal(A, before)


def test_zero_and_constant_matrices_read_zero():
    for A, center in [(torch.zeros(3, 5, 4), False), (torch.full((2, 6, 6), 0.25), True)]:
        got = rank_metrics(A, center=center)
        for name in METRICS:
            assert torch.equal(got[name], torch.zeros(A.shape[:-2])), name
    raw = rank_metrics(torch.full((6, 6), 0.25))  # uncentered, a constant matrix is rank 1
    assert raw["rank_eps"].item() == raw["numerical_rank"].item() == 1


def test_tiny_and_integer_matrices():
    one = rank_metrics(torch.tensor([[2.0]]))
    assert one["rank_eps"].item() == one["erank"].item() == one["numerical_rank"].item() == 1
    assert one["sigma_1"].item() == 2.0 and one["sigma_ratio"].item() == 0.0
    row = rank_metrics(torch.tensor([[3.0, 4.0, 0.0]]))
    assert row["sigma_1"].item() == pytest.approx(5.0) and row["rank_eps"].item() == 1
    ints = rank_metrics(torch.eye(5, dtype=torch.int64))
    assert ints["numerical_rank"].item() == 5 and ints["erank"].item() == pytest.approx(5)
    assert ints["sigma_1"].dtype == torch.float32


def test_half_precision_is_measured_in_fp32():
    gen = torch.Generator().manual_seed(5)
    A = torch.randn(2, 8, 8, generator=gen)
    got = rank_metrics(A.to(torch.bfloat16))
    ref = rank_metrics(A.to(torch.bfloat16).float())
    assert got["erank"].dtype == torch.float32
    torch.testing.assert_close(got["erank"], ref["erank"])


def test_huge_values_do_not_overflow():
    gen = torch.Generator().manual_seed(6)
    A = torch.randn(6, 6, generator=gen)
    big, ref = rank_metrics(A * 1e15), rank_metrics(A)
    for name in ("rank_eps", "erank", "stable_rank", "participation_ratio"):
        torch.testing.assert_close(big[name], ref[name], rtol=1e-4, atol=0)


def test_empty_matrix_reads_zero():
    got = rank_metrics(torch.zeros(2, 0, 5))
    assert all(torch.equal(v, torch.zeros(2)) for v in got.values())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_is_an_error_naming_count_and_shape(bad):
    A = torch.ones(2, 3, 4)
    A[0, 1, 2] = A[1, 0, 0] = bad
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) has 2 non-finite"):
        rank_metrics(A)


def test_vector_is_an_error_naming_shape():
    with pytest.raises(ValueError, match=r"got shape \(5,\)"):
        rank_metrics(torch.ones(5))


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.1, 1.5])
def test_bad_eps_is_an_error_naming_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        rank_metrics(torch.eye(3), eps=eps)
