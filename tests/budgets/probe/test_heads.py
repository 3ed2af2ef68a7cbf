"""Per-head statistics (budgets/probe/heads.py): exact from P, and matrix-free from an operator."""

from __future__ import annotations

import math

import pytest
import torch

from budgets.probe.blocks import mixing_figures, mixing_figures_matfree
from budgets.probe.heads import HEAD_STATS, head_stats, head_stats_operator
from budgets.rank.matfree import AttentionMixing, CenteredOperator

T, K = 24, 16
SINK, LOCAL, UNIFORM, CONTENT = range(4)  # the heads of _qk


def _qk(T: int = T, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [2, 4, T, K] (fp64): a sink head (every query matches token 0's key), a local
    head (each key is its own query, scaled up), a uniform head (zero queries) and a
    content head (random)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, T, K, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, T, K, generator=g, dtype=torch.float64)
    d = torch.randn(K, generator=g, dtype=torch.float64)
    d = d / d.norm()
    q[:, SINK] = 4 * d + 0.1 * q[:, SINK]
    k[:, SINK] = 0.1 * k[:, SINK]
    k[:, SINK, 0] = 20 * d
    q[:, LOCAL] = q[:, LOCAL] / q[:, LOCAL].norm(dim=-1, keepdim=True)
    k[:, LOCAL] = 40 * q[:, LOCAL]
    q[:, UNIFORM] = 0.0
    return q, k


def _probs(q, k, scale, window=None, softcap=None):
    """Causal (windowed, soft-capped) softmax P [B, H, T, T], in q's dtype."""
    S = q @ k.mT * scale
    if softcap:
        S = softcap * torch.tanh(S / softcap)
    t = torch.arange(q.shape[-2])
    seen = t[None, :] <= t[:, None]
    if window is not None:
        seen &= t[None, :] > t[:, None] - window
    return S.masked_fill(~seen, -math.inf).softmax(-1)


def test_sink_head_reads_first_token_mass_one_and_no_centered_energy():
    q, k = _qk()
    stats = head_stats(_probs(q, k, K**-0.5))
    assert stats["first_token_mass"][SINK] == pytest.approx(1.0, abs=1e-6)
    assert stats["centered_energy"][SINK] < 1e-8
    # the other heads spread their mass: neither 1 nor 0
    assert max(stats["first_token_mass"][h] for h in (LOCAL, CONTENT)) < 0.5
    assert min(stats["centered_energy"][h] for h in (LOCAL, UNIFORM, CONTENT)) > 1e-2


def test_local_head_puts_its_mass_on_the_diagonal():
    q, k = _qk()
    stats = head_stats(_probs(q, k, K**-0.5))
    assert stats["diagonal_mass"][LOCAL] > 0.5
    assert stats["diagonal_mass"][SINK] < 0.5 and stats["diagonal_mass"][CONTENT] < 0.5


def test_stats_are_the_definitions_averaged_over_the_batch():
    q, k = _qk()
    P = _probs(q, k, K**-0.5)  # [B, H, T, T]
    stats = head_stats(P)
    for b in range(P.shape[0]):  # per sample: the definitions written out, entry by entry
        for h in range(P.shape[1]):
            one = head_stats(P[b:b + 1, h:h + 1])
            Pb = P[b, h]
            band = sum(float(Pb[t, s]) for t in range(T) for s in range(max(0, t - 2), t + 1))
            assert one["diagonal_mass"][0] == pytest.approx(band / T, rel=1e-12)
            assert one["first_token_mass"][0] == pytest.approx(float(Pb[1:, 0].mean()),
                                                               rel=1e-12)
            C = Pb - Pb.mean(0, keepdim=True)
            assert one["centered_energy"][0] == pytest.approx(
                float(C.square().sum() / Pb.square().sum()), rel=1e-9, abs=1e-15)
    for name in HEAD_STATS:
        per_sample = [head_stats(P[b:b + 1])[name] for b in range(P.shape[0])]
        assert stats[name] == pytest.approx([sum(v) / 2 for v in zip(*per_sample, strict=True)])


@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (None, 2.0)])
def test_matrix_free_stats_equal_the_exact_ones(window, softcap):
    q, k = _qk()
    scale = K**-0.5
    exact = head_stats(_probs(q, k, scale, window, softcap))  # fp64
    full = AttentionMixing(q, k, scale, window, softcap).full()  # the operator works in fp32
    free = head_stats_operator(full, CenteredOperator(full))
    for name in HEAD_STATS:
        assert free[name] == pytest.approx(exact[name], abs=2e-6), name
    if window:  # token 0 leaves the windows of the queries from t = 5 on
        assert free["first_token_mass"][SINK] < 0.5
    elif not softcap:  # (a cap of 2 on the scores leaves no head very peaked)
        assert free["first_token_mass"][SINK] == pytest.approx(1.0, abs=1e-5)


def test_operator_stats_refuse_a_block():
    q, k = _qk()
    op = AttentionMixing(q, k, 0.25).past_future()
    with pytest.raises(ValueError, match="whole mixing matrix"):
        head_stats_operator(op, CenteredOperator(op))


def test_layer_figures_exact_and_matrix_free_agree():
    """mixing_figures vs mixing_figures_matfree: heads and past_future_lengths, on the
    same q and k (fp64 exact, fp32 operator)."""
    q, k = _qk(T=32)
    exact_q, exact = mixing_figures(_probs(q, k, K**-0.5), 0.1)
    free_q, free = mixing_figures_matfree(AttentionMixing(q, k, K**-0.5), 0.1)
    for name in HEAD_STATS:
        assert free["heads"][name] == pytest.approx(exact["heads"][name], abs=2e-6), name
    assert exact["heads"]["raw_erank"] == exact_q["mixing"][0]["erank"]
    assert [e["seq_len"] for e in free["past_future_lengths"]] == [8, 16, 32]
    for a, b in zip(exact["past_future_lengths"], free["past_future_lengths"], strict=True):
        assert a["seq_len"] == b["seq_len"] and not a["lower_bound"]
        assert b["rank_eps"] == a["rank_eps"] and b["rank_eps_max"] == a["rank_eps_max"]
