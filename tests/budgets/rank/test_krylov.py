"""Block Lanczos (budgets/rank/krylov.py) and its bounds (ritz_bounds.py) against dense
eigensolvers in fp64: Ritz values, residuals through thick restarts, the centered view
sharing the raw one's space, and bounds that never claim more than the spectrum holds."""

import math

import pytest
import torch

from budgets.rank.krylov import Lanczos, View, block_lanczos, empty_ritz, run_lanczos
from budgets.rank.ritz_bounds import cluster_free, energy_bounds


class Dense:
    """A^T A products of explicit matrices A [N, m, n] (fp64), restrictable to entries."""

    def __init__(self, A):
        self.A, self.batch, self.shape = A.double(), (A.shape[0],), tuple(A.shape[-2:])
        self.device = A.device

    def gram(self, X):
        return (self.A.mT @ (self.A @ X.double())).to(X.dtype)

    def take(self, idx):
        return Dense(self.A[idx])


def decaying(N=3, m=120, n=100, rate=0.93, seed=0, repeats=0):
    """Matrices with singular values rate^i (the first `repeats` values all equal 1)."""
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(N, m, n, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(N, n, n, generator=g, dtype=torch.float64)).Q
    s = rate ** torch.arange(n, dtype=torch.float64)
    s[:repeats] = 1.0
    return U @ torch.diag_embed(s.expand(N, n)) @ V.mT  # [N, m, n]


def never(idx, theta, rho, products):
    return torch.zeros(len(idx), dtype=torch.bool)


@pytest.mark.parametrize("k_max", [64, 24], ids=["no-restart", "thick-restarts"])
def test_ritz_values_and_residuals_are_the_dense_ones(k_max):
    A = decaying()
    lam = torch.linalg.eigvalsh(A.mT @ A).flip(-1)
    ritz = block_lanczos(Dense(A.float()), never, k_max, block=8, max_products=96)
    top = lam[:, :8]
    torch.testing.assert_close(ritz.values[:, :8], top, rtol=1e-5, atol=1e-7)
    assert (ritz.values <= lam[:, :ritz.values.shape[1]] + 1e-5).all()  # Cauchy interlacing


def test_the_residual_formula_is_the_true_residual_through_restarts():
    """||R y_last|| (no pass over M) equals ||M V y - theta V y|| formed densely, before
    and after thick restarts (d_max = 32: from the 4th step on)."""
    A = decaying().float()
    M = (A.mT @ A).double()
    checked = []

    def stop(idx, theta, rho, products):
        V = run.V[:, :, :run.d].double()
        t, Y = torch.linalg.eigh(V.mT @ M @ V)
        t, Y = t.flip(-1), Y.flip(-1)
        true = (M @ V @ Y - V @ Y * t.unsqueeze(-2)).norm(dim=-2)
        big = theta > 1e-3 * theta[:, :1]  # values fp32 resolves
        torch.testing.assert_close(theta, t, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(rho[big], true[big], rtol=1e-2, atol=1e-6)
        checked.append(run.d)
        return torch.zeros(len(idx), dtype=torch.bool)

    run = Lanczos(3, 100, [View(stop, empty_ritz(3, 32, 8))], k_max=24, block=8,
                  max_products=64)
    run_lanczos([run], lambda idx, X: A.mT @ (A @ X))
    assert checked.count(32) >= 4  # restarted several times


def test_a_centered_view_shares_the_raw_space():
    """Ritz values of A and of A - 1 mu^T from one run, each within the dense ones."""
    A = decaying(rate=0.9) + 0.05  # a mean row worth removing
    m = A.shape[-2]
    mu = A.mean(-2)  # [N, n]
    Ac = A - mu.unsqueeze(-2)
    lam = torch.linalg.eigvalsh(A.mT @ A).flip(-1)
    lam_c = torch.linalg.eigvalsh(Ac.mT @ Ac).flip(-1)
    views = [View(never, empty_ritz(3, 88, 8)),
             View(never, empty_ritz(3, 88, 8), mu.float(), torch.full((3,), float(m)))]
    op = Dense(A.float())
    run = Lanczos(3, 100, views, k_max=80, block=8, max_products=80)
    run_lanczos([run], lambda idx, X: op.take(idx).gram(X))
    torch.testing.assert_close(views[0].ritz.values[:, :10], lam[:, :10], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(views[1].ritz.values[:, :10], lam_c[:, :10], rtol=1e-5,
                               atol=1e-7)


def test_a_split_at_restart_keeps_both_views_right():
    A = decaying(rate=0.95) + 0.05
    mu = A.mean(-2)
    Ac = A - mu.unsqueeze(-2)
    lam, lam_c = (torch.linalg.eigvalsh(B.mT @ B).flip(-1) for B in (A, Ac))
    views = [View(never, empty_ritz(3, 32, 8)),
             View(never, empty_ritz(3, 32, 8), mu.float(), torch.full((3,), 120.0))]
    op = Dense(A.float())
    run_lanczos([Lanczos(3, 100, views, k_max=24, block=8, max_products=160)],
                lambda idx, X: op.take(idx).gram(X))
    for view, exact in zip(views, (lam, lam_c), strict=True):
        torch.testing.assert_close(view.ritz.values[:, :6], exact[:, :6], rtol=1e-4,
                                   atol=1e-6)


@pytest.mark.parametrize("rate,repeats", [(0.97, 0), (0.9, 0), (1.0, 0), (0.97, 40)],
                         ids=["slow", "fast", "flat", "repeated"])
@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_bounds_never_claim_more_than_the_spectrum(rate, repeats, eps):
    """At every step: the reached rank >= rank_eps, a decided rank == rank_eps, and the
    floor <= rank_eps, including a flat spectrum (P^T P ~ I: a previous-token head) and
    an eigenvalue repeated past the block size."""
    A = decaying(N=4, m=150, n=140, rate=rate, repeats=repeats)
    lam = torch.linalg.eigvalsh(A.mT @ A).flip(-1).clamp_min(0)
    fro2 = lam.sum(-1)
    true = ((lam.cumsum(-1) < (1 - eps**2) * fro2.unsqueeze(-1)).sum(-1) + 1).double()
    checked = []

    top = lam[:, 0] * 1.5  # a valid, loose bound on the top eigenvalue

    def stop(idx, theta, rho, products):
        b = energy_bounds(theta, rho, fro2[idx], eps, 8, top=top[idx])
        assert (b.floor >= torch.ceil((1 - eps**2) * fro2[idx] / top[idx])).all()
        t = true[idx]
        reached = ~b.rank.isnan()
        assert (b.rank[reached] >= t[reached]).all()
        assert (b.rank[b.decided] == t[b.decided]).all()
        assert (b.floor <= t).all()
        checked.append(int(b.decided.sum()))
        return b.decided

    block_lanczos(Dense(A.float()), stop, 140, block=8, max_products=140)
    assert checked


def test_cluster_free_stops_at_a_run_of_converged_equal_values():
    theta = torch.tensor([[5.0, 3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.5]], dtype=torch.float64)
    rho = torch.full_like(theta, 1e-9)
    assert cluster_free(theta, rho, 4).tolist() == [2]  # four 2.0s start at index 2
    assert cluster_free(theta, rho, 5).tolist() == [8]  # no run of five
    rho[0, 3] = 1.0  # an unconverged member breaks the run
    assert cluster_free(theta, rho, 3).tolist() == [8]


def test_a_zero_matrix_is_decided_at_once():
    A = torch.zeros(2, 30, 20)
    fro2 = torch.zeros(2, dtype=torch.float64)
    ritz = block_lanczos(Dense(A), lambda idx, th, rho, p: energy_bounds(
        th, rho, fro2[idx], 0.1, 4).decided, 16, block=4)
    assert (ritz.products == 4).all()
    assert not math.isnan(float(energy_bounds(ritz.values, ritz.residuals, fro2, 0.1, 4
                                              ).decided.all()))
