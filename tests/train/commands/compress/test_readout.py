"""train/commands/compress/bases/readout.py: the weights of output-aware bases and the basis
they give."""

import pytest
import torch

from train.commands.compress.bases.lowrank import projectors
from train.commands.compress.bases.readout import (
    head_gram,
    pair_weight,
    query_weight,
    readout_sensitivity,
    value_weight,
    weighted_basis,
)

# ---------------------------------------------------------------- output-aware bases

def weighted_error(P: torch.Tensor, C: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """tr(W (I - P) C (I - P)^T): the error of a -> P a as a reader weighing by W sees it."""
    R = torch.eye(P.shape[-1], dtype=P.dtype) - P
    return torch.einsum("ij,jk,kl,il->", W, R, C, R)


def random_psd(K: int, g: torch.Generator, spread: float) -> torch.Tensor:
    A = torch.randn(K, K, generator=g, dtype=torch.float64)
    Q, _ = torch.linalg.qr(A)
    return Q @ torch.diag(torch.logspace(0, -spread, K, dtype=torch.float64)) @ Q.T


@pytest.mark.parametrize("r", [1, 2, 4])
def test_weighted_basis_is_the_brute_force_optimum(r):
    g = torch.Generator().manual_seed(r)
    K = 6
    C, W = random_psd(K, g, 2.0), random_psd(K, g, 1.5)
    U, E, gain = weighted_basis(C[None], W[None])
    assert torch.allclose(E[0] @ U[0], torch.eye(K, dtype=torch.float64), atol=1e-9)
    P = projectors(U, [r], E)[0]
    closed = weighted_error(P, C, W)
    assert float(closed) == pytest.approx(float(gain[0, r:].sum()), rel=1e-7)  # the ridge
    best = float("inf")  # brute force: every rank-r map A B, by L-BFGS from several starts
    for start in range(3):
        gs = torch.Generator().manual_seed(100 + start)
        A = torch.randn(K, r, generator=gs, dtype=torch.float64).requires_grad_()
        B = torch.randn(r, K, generator=gs, dtype=torch.float64).requires_grad_()
        opt = torch.optim.LBFGS([A, B], max_iter=200, tolerance_grad=1e-14,
                                tolerance_change=1e-16, line_search_fn="strong_wolfe")

        def closure(A=A, B=B, opt=opt):
            opt.zero_grad()
            f = weighted_error(A @ B, C, W)
            f.backward()
            return f
        opt.step(closure)
        best = min(best, float(weighted_error(A.detach() @ B.detach(), C, W)))
    assert float(closed) <= best + 1e-9  # nothing the search found beats it
    assert best == pytest.approx(float(closed), rel=1e-5)  # and the search reaches it
    energy_U = torch.linalg.eigh(C).eigenvectors.flip(-1)[None]
    assert float(closed) <= float(weighted_error(projectors(energy_U, [r])[0], C, W)) + 1e-12


def rotate_half(angles: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation [K, K] (rotate-half pairs (j, j + K/2)) at one angle per pair."""
    h = len(angles)
    R = torch.zeros(2 * h, 2 * h, dtype=torch.float64)
    c, s = angles.cos().double(), angles.sin().double()
    idx = torch.arange(h)
    R[idx, idx], R[idx + h, idx + h] = c, c
    R[idx, idx + h], R[idx + h, idx] = -s, s
    return R


def test_pair_weight_is_the_rotation_average_and_commutes_with_rope():
    g = torch.Generator().manual_seed(0)
    K, N = 4, 8
    Q = random_psd(K, g, 1.0)
    # each pair's angle uniform and independent of the other's
    grid = 2 * torch.pi * torch.arange(N, dtype=torch.float64) / N
    avg = sum(rotate_half(torch.stack((a, b))).T @ Q @ rotate_half(torch.stack((a, b)))
              for a in grid for b in grid) / N ** 2
    W = pair_weight(Q[None])[0]
    assert torch.allclose(avg, W, atol=1e-12)
    R = rotate_half(torch.tensor([0.3, 1.7], dtype=torch.float64))
    assert torch.allclose(R.T @ W @ R, W, atol=1e-12)
    # so the weighted error of a projection fitted before RoPE is the same after it
    C = random_psd(K, g, 1.0)
    U, E, _ = weighted_basis(C[None], W[None])
    P = projectors(U, [2], E)[0]
    after = weighted_error(R @ P @ R.T, R @ C @ R.T, W)
    assert float(after) == pytest.approx(float(weighted_error(P, C, W)), rel=1e-10)


def test_query_and_value_weights_sum_the_heads_that_read_a_kv_head():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 6, generator=g)  # [B, H, T, K], H = 4 reading G = 2
    w = query_weight(q, 2, rope=False)
    q64 = q.double()
    for kv in range(2):
        heads = q64[:, 2 * kv:2 * kv + 2].reshape(-1, 6)
        assert torch.allclose(w[kv], heads.T @ heads / (2 * 5))  # a mean over B*T positions
    assert torch.allclose(query_weight(q, 2, rope=True), pair_weight(w))
    w_o = torch.randn(7, 4 * 3, generator=g)  # [D, H*V]
    v = value_weight(w_o, 4, 2)
    for kv in range(2):
        want = sum(w_o[:, h * 3:(h + 1) * 3].double().T @ w_o[:, h * 3:(h + 1) * 3].double()
                   for h in (2 * kv, 2 * kv + 1))
        assert torch.allclose(v[kv], want)
    # weighted: each query by its own factor, each head by its own
    per_query = torch.rand(2, 4, 5, generator=g)
    wq = query_weight(q, 2, rope=False, per_query=per_query)
    scaled = q64 * per_query.double().sqrt()[..., None]
    assert torch.allclose(wq[1], scaled[:, 2:4].reshape(-1, 6).T @ scaled[:, 2:4].reshape(-1, 6)
                          / 10)
    per_head = torch.tensor([0.5, 2.0, 1.0, 3.0])
    wv = value_weight(w_o, 4, 2, per_head)
    heads = head_gram(w_o, 4)
    assert torch.allclose(wv[0], 0.5 * heads[0] + 2.0 * heads[1])
    assert torch.allclose(wv[1], 1.0 * heads[2] + 3.0 * heads[3])


def attention(s: torch.Tensor, v: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """One head's output at one query: W_O sum_j softmax(s)_j v_j; s [S], v [S, V]."""
    return w_o @ (torch.softmax(s, -1) @ v)


def test_readout_sensitivity_is_the_output_jacobians_energy():
    # rho and kappa are E||delta o||^2 per unit variance of independent errors of the
    # logits and of the values: the squared Frobenius norms of the output's Jacobians
    g = torch.Generator().manual_seed(0)
    H, S, V, D = 2, 7, 3, 5
    s = torch.randn(1, H, 4, S, generator=g, dtype=torch.float64) * 2  # [B, H, Tq, S]
    v = torch.randn(1, H, S, V, generator=g, dtype=torch.float64)
    w_o = torch.randn(D, H * V, generator=g, dtype=torch.float64)
    rho, kappa = readout_sensitivity(torch.softmax(s, -1), v, head_gram(w_o, H))
    for h in range(H):
        w = w_o[:, h * V:(h + 1) * V]
        for i in range(4):
            row, vals = s[0, h, i], v[0, h]
            J_s = torch.autograd.functional.jacobian(
                lambda x, vals=vals, w=w: attention(x, vals, w), row)
            J_v = torch.autograd.functional.jacobian(
                lambda x, row=row, w=w: attention(row, x, w), vals)
            assert float(rho[0, h, i]) == pytest.approx(float(J_s.square().sum()), rel=1e-9)
            per_value = float(J_v.square().sum()) / float(w.square().sum())  # tr(M) apart
            assert float(kappa[0, h, i]) == pytest.approx(per_value, rel=1e-9)

