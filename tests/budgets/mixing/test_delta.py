"""The delta rule's mixing written once (budgets/mixing/delta.py): the closed-form M against
a per-token recurrence in fp64 (outputs and gradients), its past->future factors and rank,
its stability under strong decay, what it allocates, and its caps."""

import pytest
import torch
import torch.nn.functional as F

from budgets.mixing.delta import delta_caps, delta_factors, delta_mixing, gated_scores
from tests.zoo.conftest import Shapes

B, H, K, V = 2, 3, 4, 5
GATES = ["none", "scalar", "channel"]  # DeltaNet, Gated DeltaNet, KDA
NAMES = {"none": "DeltaNet", "scalar": "GDN", "channel": "KDA"}
# (gate, regime): gates at g = 0 (no decay at all) and random log-sigmoid gates
KINDS = [pytest.param("none", "-", id="DeltaNet")] + [
    pytest.param(gate, regime, id=f"{NAMES[gate]}-{regime}")
    for gate in ("scalar", "channel") for regime in ("g=0", "log-sigmoid")]


def inputs(T, gate, regime="log-sigmoid", seed=0, strength=1.0):
    """q, k (L2-normed, q scaled), v, beta and the log gate in fp64, requiring grad."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, K, generator=g, dtype=torch.float64), dim=-1) / K ** 0.5
    k = F.normalize(torch.randn(B, H, T, K, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, V, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    shape = {"none": None, "scalar": (B, H, T), "channel": (B, H, T, K)}[gate]
    log_gate = None
    if shape is not None:
        raw = torch.randn(*shape, generator=g, dtype=torch.float64)
        log_gate = strength * F.logsigmoid(raw) if regime == "log-sigmoid" else 0 * raw
    tensors = [q, k, v, beta] + ([log_gate] if log_gate is not None else [])
    for t in tensors:
        t.requires_grad_()
    return q, k, v, beta, log_gate


def recurrence(q, k, v, beta, log_gate):
    """o [B, H, T, V] of S_t = (I - b k k^T) D_t S_{t-1} + b k v^T, o_t = S_t^T q_t, token
    by token (D_t the scalar or per-channel gate, decayed first as fla does)."""
    S = torch.zeros(B, H, K, V, dtype=torch.float64)
    out = []
    for t in range(k.shape[2]):
        if log_gate is not None:
            a = torch.exp(log_gate[:, :, t])
            S = S * (a[..., None, None] if log_gate.dim() == 3 else a[..., :, None])
        kt = k[:, :, t, :, None]  # [B, H, K, 1]
        S = S + beta[:, :, t, None, None] * kt * (v[:, :, t, None, :] - (kt * S).sum(-2, True))
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, 2)


@pytest.mark.parametrize("gate, regime", KINDS)
def test_m_times_v_is_the_recurrence_with_its_gradients(gate, regime):
    q, k, v, beta, g = inputs(37, gate, regime)  # 37: row blocks of 16 end ragged
    wrt = [q, k, v, beta] + ([g] if g is not None else [])
    cot = torch.randn(B, H, 37, V, dtype=torch.float64)
    want = recurrence(q, k, v, beta, g)
    got = delta_mixing(q, k, beta, g) @ v
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-11)
    names = ["q", "k", "v", "beta", "gate"]
    for a, b, name in zip(torch.autograd.grad(got, wrt, cot), torch.autograd.grad(want, wrt, cot),
                          names, strict=False):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{name} differs")


def test_a_scalar_gate_is_a_per_channel_gate_constant_over_channels():
    q, k, _, beta, g = inputs(20, "scalar")
    torch.testing.assert_close(delta_mixing(q, k, beta, g),
                               delta_mixing(q, k, beta, g[..., None].expand(-1, -1, -1, K)))


# a per-channel gate is computed in row blocks: one row, blocks ending ragged, one block
@pytest.mark.parametrize("gate, rows", [pytest.param("scalar", 16, id="GDN")] + [
    pytest.param("channel", r, id=f"KDA-rows={r}") for r in (1, 5, 16, 64)])
def test_gated_scores_are_the_pairwise_sum(gate, rows):
    q, k, _, _, g = inputs(23, gate)
    G = (g if g.dim() == 4 else g[..., None]).cumsum(-2).detach()
    gap = G[..., :, None, :] - G[..., None, :, :]  # [B, H, T, T, 1 | K]
    causal = torch.ones(23, 23, dtype=torch.bool).tril()
    want = (q[..., :, None, :] * k[..., None, :, :] * torch.exp(gap)).sum(-1) * causal
    torch.testing.assert_close(gated_scores(q, k, G, rows=rows), want, atol=1e-15, rtol=1e-12)


@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_the_past_future_block_has_rank_k_and_its_factors_give_it(gate):
    T = 40  # h = 20 > K = 4: the cap binds
    q, k, _, beta, g = inputs(T, gate)
    with torch.no_grad():
        M, f = delta_mixing(q, k, beta, g), delta_factors(q, k, beta, g)
    block = M[..., T // 2:, :T // 2]
    assert f.L.shape == (B, H, T - T // 2, K) and f.R.shape == (B, H, T // 2, K)
    torch.testing.assert_close(f.L @ f.R.mT, block, atol=1e-14, rtol=1e-12)
    assert torch.linalg.matrix_rank(block).max() <= K
    assert torch.linalg.matrix_rank(block).min() == K  # random inputs use all of it
    assert torch.all(M.triu(1) == 0)


def test_strong_decay_stays_finite_and_exact():
    """Log gates near -50 per token (G ~ -1e3): a split exp(G_i) exp(-G_j) would overflow."""
    q, k, v, beta, g = inputs(48, "channel", strength=50.0)
    M = delta_mixing(q, k, beta, g)
    assert torch.isfinite(M).all()
    torch.testing.assert_close(M @ v, recurrence(q, k, v, beta, g), atol=1e-13, rtol=1e-11)
    grads = torch.autograd.grad((M @ v).sum(), [q, k, beta, g])
    assert all(torch.isfinite(d).all() for d in grads)
    f = delta_factors(q, k, beta, g)
    assert torch.isfinite(f.L).all() and torch.isfinite(f.R).all()


def test_kda_mixing_never_holds_t_by_t_by_k_and_factors_nothing_t_by_t():
    T = 64
    q, k, _, beta, g = inputs(T, "channel")
    with torch.no_grad(), Shapes() as seen:
        delta_mixing(q, k, beta, g)
    assert not [s for s in seen.shapes if len(s) >= 3 and s[-3:] == (T, T, K)]
    with torch.no_grad(), Shapes() as seen:
        delta_factors(q, k, beta, g)
    assert not [s for s in seen.shapes if sum(d >= T // 2 for d in s) >= 2]


def test_caps_are_the_budget_tables_delta_rule_column():
    caps = delta_caps("delta", seq_len=64, d_model=48, n_heads=4, key_dim=8, value_dim=16,
                      params=1000, conv_state=30)
    assert (caps.mixing, caps.logits, caps.value_path, caps.inference) == (8, 8, 48, 8)
    assert caps.cache_elements == 4 * 8 * 16 + 30
    assert caps.flops_per_token == 2 * 1000 + 7 * 4 * 8 * 16
    short = delta_caps("delta", 6, 48, 4, 8, 4, 0, proj_flops=10)
    assert (short.mixing, short.inference, short.flops_per_token) == (3, 4, 10 + 7 * 4 * 8 * 4)
