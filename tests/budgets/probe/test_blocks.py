"""Probes on a tiny fake model that keeps the block contract (tests/budgets/conftest.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from budgets import (
    METRICS,
    AttentionMixing,
    is_probeable,
    probe_model,
    probeable_blocks,
    rank_metrics,
)
from budgets.probe.blocks import prefix_lengths

H, K, D, T = 2, 4, 12, 10  # the conftest model's heads, head dim, width; the batch's length


def test_layers_quantities_and_list_lengths(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens, eps=0.2)
    assert probe["seq_len"] == T and probe["eps"] == 0.2
    assert [ly["layer"] for ly in probe["layers"]] == [0, 1]
    assert [ly["name"] for ly in probe["layers"]] == ["blocks.0", "blocks.1"]
    lengths = {"mixing": H, "mixing_centered": H, "past_future": H, "qk": H, "value": 1,
               "inference.k": H, "inference.v": 1, "hidden_centered": 1}
    for layer in probe["layers"]:
        assert layer["block"] == "tiny" and "spectra" not in layer
        assert list(layer["quantities"]) == list(lengths)
        for q, metrics in layer["quantities"].items():
            assert list(metrics) == [*METRICS, "rank_eps_max", "shape"]
            shape = metrics.pop("shape")
            assert all(len(v) == lengths[q] for v in metrics.values()), q
            assert len(shape) == 2 and all(isinstance(n, int) for n in shape)
    json.dumps(probe)  # plain floats and ints only


def test_budget_comes_from_the_block_at_the_probe_length(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    for layer, block in zip(probe["layers"], tiny_lm.blocks, strict=True):
        assert layer["budget"] == block.budget(T).to_dict()


def test_ranks_respect_structural_caps(tiny_lm, tokens):
    """Random weights realize their caps exactly: per-head qk rank K, value min(D, H*K)."""
    layer = probe_model(tiny_lm, tokens)["layers"][0]["quantities"]
    assert layer["qk"]["numerical_rank"] == [K] * H
    assert layer["value"]["numerical_rank"] == [min(D, H * K)]
    assert layer["inference.k"]["numerical_rank"] == [min(T, K)] * H
    assert all(r <= T // 2 for r in layer["past_future"]["rank_eps"])


def test_metrics_are_per_sample_then_averaged(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    block = tiny_lm.blocks[0]
    with torch.no_grad():
        P = block.mixing_matrices(tiny_lm.emb(tokens))  # layer 0 sees the embeddings
        per_sample = rank_metrics(P, center=True)["erank"].mean(0)
        of_mean = rank_metrics(P.mean(0), center=True)["erank"]
    got = torch.tensor(probe["layers"][0]["quantities"]["mixing_centered"]["erank"])
    torch.testing.assert_close(got, per_sample)
    # Averaging attention over samples blurs it into a pattern no sample used.
    assert (got - of_mean).abs().min() > 1e-3


def test_hidden_states_are_measured_centered_per_sample(tiny_lm, tokens):
    """Each layer's hidden_centered is the per-sample centered erank of the block's input."""
    probe = probe_model(tiny_lm, tokens)
    with torch.no_grad():
        x = tiny_lm.emb(tokens)  # [B, T, D], what layer 0 reads
        want = rank_metrics(x, center=True)["erank"].mean()
    got = probe["layers"][0]["quantities"]["hidden_centered"]["erank"]
    assert got == pytest.approx([float(want)], rel=1e-5)
    # a constant residual stream (every token alike) has centered erank 0: collapsed. The
    # row is of small integers, whose mean over tokens is exact: a random row's fp32 mean
    # can round off its own value and leave a rank-1 residue of erank 1 (15 of 20 seeds,
    # AVX-512 and AVX2 alike), which a stream never centered would read as well
    with torch.no_grad():
        tiny_lm.emb.weight.copy_(torch.arange(12.0) - 6)  # every token's embedding
    collapsed = probe_model(tiny_lm, tokens)["layers"][0]["quantities"]["hidden_centered"]
    assert collapsed["erank"] == [0.0]


def test_final_hidden_states_are_what_the_head_reads_pooled_over_the_batch(tiny_lm, tokens):
    seen = []
    hook = tiny_lm.head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    probe = probe_model(tiny_lm, tokens)
    hook.remove()
    h = seen[0].reshape(-1, seen[0].shape[-1])  # [B*T, D]: pooled, not per sample
    want = rank_metrics(h, center=True)
    assert probe["final_hidden"]["erank"] == pytest.approx(float(want["erank"]), rel=1e-5)
    assert probe["final_hidden"]["rank_eps"] == float(want["rank_eps"])
    del tiny_lm.head  # a model without an output head: no final figure, no error
    tiny_lm.forward = lambda tokens: tiny_lm.blocks[1](tiny_lm.blocks[0](tiny_lm.emb(tokens)))
    assert "final_hidden" not in probe_model(tiny_lm, tokens)


def test_eval_mode_during_probe_and_modes_restored(tiny_lm, tokens):
    tiny_lm.train()
    tiny_lm.frozen.eval()
    probe_model(tiny_lm, tokens)
    assert all(seen is False for b in tiny_lm.blocks for seen in b.training_seen)
    assert tiny_lm.training and tiny_lm.blocks[0].training and tiny_lm.drop.training
    assert not tiny_lm.frozen.training


def test_hooks_removed_on_success_and_on_error(tiny_lm, tokens):
    probe_model(tiny_lm, tokens)
    assert all(not b._forward_pre_hooks for b in tiny_lm.blocks)
    tiny_lm.train()
    with pytest.raises(IndexError):  # the model's own error, let through
        probe_model(tiny_lm, tokens + 100)  # token ids beyond the vocabulary
    assert all(not b._forward_pre_hooks for b in tiny_lm.blocks)
    assert tiny_lm.training


def test_spectra_on_request(tiny_lm, tokens):
    layer = probe_model(tiny_lm, tokens, with_spectra=True)["layers"][1]
    spectra = layer["spectra"]
    assert set(spectra) == set(layer["quantities"])
    assert spectra["mixing"].shape == (H, T)
    assert spectra["past_future"].shape == (H, T // 2)
    assert spectra["qk"].shape == (H, D) and spectra["value"].shape == (1, H * K)
    assert spectra["inference.v"].shape == (1, min(T, H * K))
    assert torch.all(spectra["mixing"][:, :-1] >= spectra["mixing"][:, 1:])  # descending


def test_model_without_blocks_is_an_error_naming_it():
    with pytest.raises(ValueError, match="Sequential has no probeable blocks"):
        probe_model(nn.Sequential(nn.Linear(3, 3)), torch.zeros(1, 3))


def test_bad_eps_fails_before_running(tiny_lm, tokens):
    with pytest.raises(ValueError, match="eps"):
        probe_model(tiny_lm, tokens, eps=1.0)
    assert all(not b.training_seen for b in tiny_lm.blocks)


def test_block_never_called_is_an_error(tiny_lm, tokens):
    class Skipping(nn.Module):  # owns both blocks, runs only the first
        def __init__(self):
            super().__init__()
            self.inner = tiny_lm

        def forward(self, t):
            return tiny_lm.blocks[0](tiny_lm.emb(t))

    with pytest.raises(ValueError, match=r"never called .*inner\.blocks\.1"):
        probe_model(Skipping(), tokens)


def test_blocks_found_by_duck_typing_not_descending(tiny_attention_cls):
    class Outer(tiny_attention_cls):  # a probeable block built around another one
        def __init__(self):
            super().__init__()
            self.inner = tiny_attention_cls()

    model = nn.Sequential(nn.Linear(D, D), Outer(), tiny_attention_cls())
    assert [n for n, _ in probeable_blocks(model)] == ["1", "2"]
    assert not is_probeable(model[0]) and is_probeable(model[2])


def test_a_bare_block_is_a_model(tiny_attention_cls):
    torch.manual_seed(0)
    block = tiny_attention_cls()
    probe = probe_model(block, torch.randn(2, 6, D))
    assert len(probe["layers"]) == 1 and probe["layers"][0]["name"] == ""
    assert probe["layers"][0]["budget"]["seq_len"] == 6


def test_batch_size_and_the_shape_of_each_measured_matrix(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    assert probe["batch_size"] == tokens.shape[0]
    shapes = {q: m["shape"] for q, m in probe["layers"][0]["quantities"].items()}
    assert shapes == {"mixing": [T, T], "mixing_centered": [T, T], "past_future": [T // 2, T // 2],
                      "qk": [D, D], "value": [D, H * K], "inference.k": [T, K],
                      "inference.v": [T, H * K], "hidden_centered": [T, D]}


def test_rank_eps_max_is_the_largest_sample_s(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    alone = [probe_model(tiny_lm, tokens[b:b + 1]) for b in range(tokens.shape[0])]
    raised = 0
    for i, layer in enumerate(probe["layers"]):
        for q, m in layer["quantities"].items():
            per_sample = [a["layers"][i]["quantities"][q]["rank_eps"] for a in alone]
            assert m["rank_eps_max"] == [max(v) for v in zip(*per_sample, strict=True)], q
            assert all(hi >= mean for hi, mean in zip(m["rank_eps_max"], m["rank_eps"],
                                                      strict=True)), q
            raised += m["rank_eps_max"] != m["rank_eps"]
    assert raised  # some sample exceeds the mean somewhere, or the test shows nothing


def _prefix_probe(model, tokens, t, **kwargs):
    return probe_model(model, tokens[:, :t], **kwargs)


class _WithOperator(nn.Module):
    """A model whose blocks also offer mixing_operator (softmax queries and keys)."""

    def __init__(self, tiny_lm):
        super().__init__()
        self.lm = tiny_lm
        for block in tiny_lm.blocks:
            block.mixing_operator = lambda x, b=block: AttentionMixing(
                b._split(b.wq(x)), b._split(b.wk(x)), b.k ** -0.5)

    def forward(self, tokens):
        return self.lm(tokens)


@pytest.mark.parametrize("matfree", [False, True])
def test_past_future_lengths_equal_a_probe_of_the_prefix(tiny_lm, matfree):
    tokens = torch.randint(0, 16, (3, 32), generator=torch.Generator().manual_seed(2))
    model = _WithOperator(tiny_lm) if matfree else tiny_lm
    kwargs = {"matfree_from": 8 if matfree else None}
    probe = probe_model(model, tokens, **kwargs)
    for i, layer in enumerate(probe["layers"]):
        lengths = layer["past_future_lengths"]
        assert [e["seq_len"] for e in lengths] == [8, 16, 32]
        for entry in lengths:
            short = _prefix_probe(model, tokens, entry["seq_len"], **kwargs)
            want = short["layers"][i]["quantities"]["past_future"]
            assert entry["rank_eps"] == want["rank_eps"], entry["seq_len"]
            assert entry["rank_eps_max"] == want["rank_eps_max"], entry["seq_len"]
            assert entry["lower_bound"] is False
    ranks = [e["rank_eps"] for e in probe["layers"][0]["past_future_lengths"]]
    assert ranks[0] != ranks[-1]  # the lengths really differ here


def test_prefix_lengths_from_eight_tokens(tiny_lm, tokens):
    assert prefix_lengths(40) == [10, 20, 40] and prefix_lengths(31) == [15, 31]
    assert prefix_lengths(8) == [8] and prefix_lengths(7) == []
    layer = probe_model(tiny_lm, tokens)["layers"][0]  # T = 10: only T itself
    assert [e["seq_len"] for e in layer["past_future_lengths"]] == [T]


def test_every_layer_has_head_statistics(tiny_lm, tokens):
    probe = probe_model(tiny_lm, tokens)
    for layer in probe["layers"]:
        heads = layer["heads"]
        assert list(heads) == ["first_token_mass", "diagonal_mass", "centered_energy",
                               "raw_erank"]
        assert all(len(v) == H for v in heads.values())
        assert heads["raw_erank"] == layer["quantities"]["mixing"]["erank"]
        assert all(0 <= v <= 1 for name in ("first_token_mass", "diagonal_mass",
                                            "centered_energy") for v in heads[name])
