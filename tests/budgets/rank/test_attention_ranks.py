"""A whole attention layer's matrix-free ranks from shared passes (attention_ranks.py)
against exact ones on materialized matrices (fp64 references)."""

import math

import pytest
import torch

from budgets.rank.attention_ranks import attention_metrics, centered_pair_metrics
from budgets.rank.matfree import (
    AttentionMixing,
    AttentionOperator,
    CenteredOperator,
    operator_metrics,
)
from budgets.rank.metrics import rank_metrics

from .test_matfree import causal_probs, heads


def corner(P: torch.Tensor, t: int) -> torch.Tensor:
    return P[..., t // 2:t, :t // 2]  # the past->future block of the prefix of length t


@pytest.mark.parametrize("window", [None, 12], ids=["causal", "window12"])
def test_every_block_equals_the_exact_path(window):
    q, k = heads(T=160)
    T = q.shape[-2]
    got = attention_metrics(AttentionMixing(q, k, 0.5, window), 0.1, k_max=T,
                            lengths=(T // 4, T // 2))
    P = causal_probs(q, k, 0.5, window)
    exact = {"mixing": rank_metrics(P, 0.1), "mixing_centered": rank_metrics(P, 0.1, center=True),
             "past_future": rank_metrics(corner(P, T), 0.1)}
    exact.update({t: rank_metrics(corner(P, t), 0.1) for t in (T // 4, T // 2)})
    found = {**{q: got[q] for q in ("mixing", "mixing_centered", "past_future")},
             **got["lengths"]}
    assert set(found) == set(exact)
    for name, ref in exact.items():
        real = ref["sigma_1"] > 1e-6  # a centered sink head is rounding on both sides
        assert torch.equal(found[name]["rank_eps"][real], ref["rank_eps"][real]), name
        torch.testing.assert_close(found[name]["stable_rank"][real], ref["stable_rank"][real],
                                   rtol=1e-4, atol=1e-6)


def test_shared_passes_give_what_separate_operators_give():
    q, k = heads(T=200, seed=2)
    mixing = AttentionMixing(q, k, 0.5)
    got = attention_metrics(mixing, 0.1, k_max=64)
    raw, centered = centered_pair_metrics(mixing.full(), 0.1, k_max=64)
    pf = operator_metrics(mixing.past_future(), 0.1, k_max=64)
    for shared, alone in ((got["mixing"], raw), (got["mixing_centered"], centered),
                          (got["past_future"], pf)):
        torch.testing.assert_close(shared["rank_eps"], alone["rank_eps"], equal_nan=True)
        torch.testing.assert_close(shared["sigma_1"], alone["sigma_1"], rtol=1e-5, atol=1e-7)


def test_a_head_past_k_max_reads_as_a_lower_bound():
    """A near-identity head (each query on its own key: P^T P ~ I) needs ~all T values: the
    bound says so at once, under k_max, and never above the true rank."""
    q, k = heads(T=200)
    got = attention_metrics(AttentionMixing(q, k, 0.5), 0.1, k_max=16)
    exact = rank_metrics(causal_probs(q, k, 0.5), 0.1)["rank_eps"]
    head = got["mixing"]
    assert head["rank_eps"][:, 2].isnan().all()
    above = head["rank_eps_above"][:, 2]
    assert (above >= 16).all() and (above < exact[:, 2]).all()


def test_very_sharp_scores_keep_their_probabilities():
    """Scores far below a row's maximum (exp's slow range under -88) give the exact P, to
    what fp32 scores of magnitude ~100 resolve."""
    q, k = heads(T=96)
    q = q * 30  # score gaps of hundreds
    op = AttentionOperator(q, k, 0.5)
    P = causal_probs(q, k, 0.5).float()
    X = torch.randn(*P.shape[:-2], 96, 4)
    torch.testing.assert_close(op.matmul(X), P @ X, rtol=1e-3, atol=1e-5)
    assert not math.isnan(float(op.fro2().sum()))


@pytest.mark.parametrize("window", [None, 12], ids=["causal", "window12"])
def test_the_top_bound_holds_for_every_block(window):
    """||P||_1 ||P||_inf from the first pass bounds ||P||_2^2 of the whole matrix, its
    centered form, its past->future block and a prefix's (named at construction), and the
    prefix's energy is its own."""
    q, k = heads(T=160)
    T = q.shape[-2]
    corner_t = ((T // 4, T // 2), (0, T // 4))
    mixing = AttentionMixing(q, k, 0.5, window)
    full = mixing.full(blocks=(corner_t,))
    P = causal_probs(q, k, 0.5, window)
    pf = mixing.past_future()
    for bound, M in ((full.top_bound(), P), (CenteredOperator(full).top_bound(),
                                             P - P.mean(-2, keepdim=True)),
                     (pf.top_bound(), corner(P, T)),
                     (full.block_sums(corner_t).top().reshape(2, 4), corner(P, T // 2))):
        # the bound is the fp32 operator's: its scores of ~100 round at ~1e-5 relative
        # (3.4e-5 at most over heads() seeds 0-99), and a block whose fp64 norm^2 is ~1e-48
        # (the near-identity head's, in a window) reads 0 in fp32 (9 of those seeds, AVX-512
        # and AVX2 alike): fp32's smallest normal is the bound's resolution
        tiny = torch.finfo(torch.float32).tiny
        assert (bound >= torch.linalg.matrix_norm(M, 2).square() * (1 - 1e-4) - tiny).all()
    torch.testing.assert_close(full.block_sums(corner_t).fro2.reshape(2, 4),
                               corner(P, T // 2).square().sum((-2, -1)), rtol=1e-4, atol=1e-8)
