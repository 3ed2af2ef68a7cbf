"""The residual stream and the per-KV-head keys and values (budgets/probe/streams.py), alone and
through probe_model on fakes that keep the block contract (tests/budgets/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from budgets import probe_model, rank_metrics
from budgets.probe.blocks import residual_owner
from budgets.probe.streams import MASSIVE_LIMIT, kv_head_figures, residual_figures


def _stream(B=3, T=16, D=12, seed=0) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def test_a_planted_massive_activation_is_found_at_its_sample_and_position():
    h = _stream()
    h[1, 5] *= 500.0
    r = residual_figures(h, 0.1)
    assert r["n_massive"] == 1 and len(r["massive"]) == 1
    (m,) = r["massive"]
    assert (m["sample"], m["position"]) == (1, 5)
    assert m["norm"] == pytest.approx(float(h[1, 5].norm()), rel=1e-6)
    assert m["ratio"] == pytest.approx(m["norm"] / r["norm_median"])
    assert r["norm_median"] == pytest.approx(float(h.norm(dim=-1).flatten().median()), rel=1e-6)
    assert residual_figures(_stream(), 0.1)["massive"] == []  # none planted: none found


def test_the_ratio_threshold_is_an_argument():
    h = _stream()
    median = h.norm(dim=-1).median()
    h[0, 3] *= 10 * median / h[0, 3].norm()  # ~10x the median: massive at 5, not at 20
    assert residual_figures(h, 0.1)["massive"] == []
    assert [(m["sample"], m["position"]) for m in residual_figures(h, 0.1, ratio=5)["massive"]
            ] == [(0, 3)]
    with pytest.raises(ValueError, match="ratio.*got 0"):
        residual_figures(h, 0.1, ratio=0)


def test_massive_tokens_listed_largest_first_and_capped():
    h = _stream(B=2, T=64)
    h = h / h.norm(dim=-1, keepdim=True)  # every token of norm 1, then some of 100-200
    h[0, :MASSIVE_LIMIT + 5] *= torch.linspace(100, 200, MASSIVE_LIMIT + 5)[:, None]
    r = residual_figures(h, 0.1)
    assert r["n_massive"] == MASSIVE_LIMIT + 5 and len(r["massive"]) == MASSIVE_LIMIT
    norms = [m["norm"] for m in r["massive"]]
    assert norms == sorted(norms, reverse=True)
    assert r["massive"][0]["position"] == MASSIVE_LIMIT + 4


def test_residual_centered_erank_is_per_sample_then_the_mean():
    h = _stream()
    want = rank_metrics(h, center=True)["erank"].mean()
    assert residual_figures(h, 0.1)["centered_erank"] == pytest.approx(float(want), rel=1e-6)


def test_kv_heads_measure_each_head_per_sample():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(3, 2, 20, 8, generator=g)
    k[:, 1] = k[:, 1, :, :2] @ torch.randn(2, 8, generator=g)  # head 1: rank 2
    v = torch.randn(3, 2, 20, 6, generator=g)
    out = kv_head_figures({"k": k, "v": v, "k_pre_rope": k[..., :8]}, 0.1)
    assert (out["n_kv_heads"], out["head_dim"], out["v_head_dim"]) == (2, 8, 6) and out["rope"]
    for name, A in (("k", k), ("v", v)):
        m = rank_metrics(A, 0.1)  # [B, G]
        assert out[name]["rank_eps"] == pytest.approx(m["rank_eps"].mean(0).tolist())
        assert out[name]["rank_eps_max"] == m["rank_eps"].amax(0).tolist()
        assert out[name]["erank"] == pytest.approx(m["erank"].mean(0).tolist(), rel=1e-5)
    assert out["k"]["rank_eps_max"][1] == 2.0
    assert "k_pre_rope" not in kv_head_figures({"k": k, "v": v}, 0.1)
    with pytest.raises(ValueError, match="missing \\['v'\\]"):
        kv_head_figures({"k": k}, 0.1)


def test_pooled_rank_is_that_of_every_sample_stacked():
    g = torch.Generator().manual_seed(1)
    # each sample of rank 2, in its own 2 directions: per sample 2, pooled 6
    k = torch.stack([torch.randn(20, 2, generator=g) @ torch.randn(2, 8, generator=g)
                     for _ in range(3)])[:, None]  # [B, 1, T, K]
    out = kv_head_figures({"k": k, "v": k}, 0.01)
    stacked = rank_metrics(k.transpose(0, 1).reshape(1, 60, 8).double(), 0.01)["rank_eps"]
    assert out["k"]["rank_eps_max"] == [2.0]
    assert out["k"]["rank_eps_pooled"] == stacked.tolist() == [6.0]


class _Layer(nn.Module):
    """norm -> block -> add, as a decoder layer holds its mixer."""

    def __init__(self, block: nn.Module, d_model: int = 12):
        super().__init__()
        self.norm, self.mixer = nn.LayerNorm(d_model), block

    def forward(self, h):
        return h + self.mixer(self.norm(h))


class _NormedLM(nn.Module):
    def __init__(self, block_cls, vocab=16, d_model=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(_Layer(block_cls(d_model)) for _ in range(2))

    def forward(self, tokens):
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        return h


def test_residual_is_the_input_of_the_module_list_item(tiny_attention_cls, tiny_lm):
    model = _NormedLM(tiny_attention_cls)
    assert residual_owner(model, "layers.1.mixer") == "layers.1"
    assert residual_owner(tiny_lm, "blocks.0") == "blocks.0"  # the block is the item itself
    assert residual_owner(nn.Sequential(tiny_attention_cls()), "0") is None


def test_probe_finds_a_planted_massive_activation_behind_the_norm(tiny_attention_cls, tokens):
    torch.manual_seed(0)
    model = _NormedLM(tiny_attention_cls)
    model.emb.register_forward_hook(lambda m, args, h: h.index_put((torch.tensor([2]),
                                                                    torch.tensor([7])),
                                                                   h[2, 7] * 300.0))
    probe = probe_model(model, tokens)
    for layer in probe["layers"]:  # the stream carries the token through both layers
        found = [(m["sample"], m["position"]) for m in layer["residual"]["massive"]]
        assert found == [(2, 7)], layer["layer"]
    seen = []
    model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model(tokens)
    want = rank_metrics(seen[0], center=True)["erank"].mean()
    assert probe["layers"][0]["residual"]["centered_erank"] == pytest.approx(float(want),
                                                                             rel=1e-5)
    # the block reads the normed stream, where the token is no larger than the rest
    assert probe["layers"][0]["quantities"]["hidden_centered"]["erank"][0] != pytest.approx(
        float(want), rel=1e-2)


def test_no_residual_without_a_module_list(tiny_attention_cls):
    x = torch.randn(2, 10, 12)
    layer = probe_model(nn.Sequential(tiny_attention_cls()), x)["layers"][0]
    assert "residual" not in layer and "kv_heads" not in layer  # (no key_value_heads either)
