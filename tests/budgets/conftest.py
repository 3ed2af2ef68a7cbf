"""Fakes shared by the budgets tests: a tiny probeable model (budgets must not depend on
zoo) and hand-written probe layers for the report and verdict tests."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from budgets import METRICS, RankBudget


class TinyAttention(nn.Module):
    """Causal softmax attention keeping the whole probe contract, in ~40 lines."""

    kind = "tiny"

    def __init__(self, d_model: int = 12, n_heads: int = 2, head_dim: int = 4):
        super().__init__()
        self.h, self.k = n_heads, head_dim
        self.wq = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, d_model, bias=False)
        for lin in (self.wq, self.wk):  # peaky attention, so heads differ visibly
            nn.init.normal_(lin.weight, std=1.0)
        self.training_seen: list[bool] = []

    def _split(self, y):  # [B, T, H*K] -> [B, H, T, K]
        return y.unflatten(-1, (self.h, self.k)).transpose(1, 2)

    def _probs(self, q, k, offset: int = 0):
        T, S = q.shape[-2], k.shape[-2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.k)  # [B, H, T, S]
        mask = torch.ones(T, S, dtype=torch.bool).tril(offset)
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)

    def forward(self, x, cache=None):
        self.training_seen.append(self.training)
        q, k, v = (self._split(w(x)) for w in (self.wq, self.wk, self.wv))
        pos = 0
        if cache is not None:
            pos, T = cache["pos"], x.shape[1]
            cache["k"][:, :, pos:pos + T], cache["v"][:, :, pos:pos + T] = k, v
            cache["pos"] = pos + T
            k, v = cache["k"][:, :, :pos + T], cache["v"][:, :, :pos + T]
        y = self._probs(q, k, offset=pos) @ v  # [B, H, T, K]
        return self.wo(y.transpose(1, 2).flatten(-2))

    def init_cache(self, batch, max_len):
        z = torch.zeros(batch, self.h, max_len, self.k)
        return {"k": z.clone(), "v": z.clone(), "pos": 0}

    def budget(self, seq_len):
        d = self.wq.in_features
        return RankBudget(block=self.kind, seq_len=seq_len, n_heads=self.h, mixing=seq_len // 2,
                          logits=self.k, value_path=min(d, self.h * self.k),
                          inference=min(seq_len, self.h * self.k))

    def mixing_matrices(self, x):
        return self._probs(self._split(self.wq(x)), self._split(self.wk(x)))

    def weight_matrices(self):
        wq = self.wq.weight.unflatten(0, (self.h, self.k))  # [H, K, D]
        wk = self.wk.weight.unflatten(0, (self.h, self.k))
        return {"qk": wq.transpose(-1, -2) @ wk, "value": self.wv.weight.T}  # [H, D, D], [D, H*K]

    def inference_state(self, cache):
        n = cache["pos"]
        v = cache["v"][:, :, :n].transpose(1, 2).flatten(-2)  # [B, T, H*K]
        return {"k": cache["k"][:, :, :n], "v": v}  # [B, H, T, K], [B, T, H*K]


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 16, d_model: int = 12, n_layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(TinyAttention(d_model) for _ in range(n_layers))
        self.drop = nn.Dropout(0.5)
        self.frozen = nn.LayerNorm(d_model)  # kept in eval mode by its owner
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        h = self.emb(tokens)
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.drop(self.frozen(h)))


@pytest.fixture
def tiny_lm():
    torch.manual_seed(0)
    return TinyLM()


@pytest.fixture
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 16, (3, 10), generator=g)  # [B, T]


@pytest.fixture
def tiny_attention_cls():
    return TinyAttention


def build_quantity(rank_eps, erank=None):
    """A probe quantity: the given rank_eps per head, every other metric filled in."""
    out = {name: [1.0] * len(rank_eps) for name in METRICS}
    out["rank_eps"] = [float(r) for r in rank_eps]
    out["erank"] = [float(e) for e in (erank or rank_eps)]
    return out


def build_fake_layer(i, value_path=8, inference=16):
    budget = RankBudget(block="fake", seq_len=32, n_heads=2, mixing=16, logits=4,
                        value_path=value_path, inference=inference)
    quantity = build_quantity
    return {
        "layer": i, "name": f"blocks.{i}", "block": "fake", "budget": budget.to_dict(),
        "quantities": {
            "mixing": quantity([1, 1]),
            "mixing_centered": quantity([5, 7], erank=[3.0, 4.0]),
            "past_future": quantity([6, 10]),
            "qk": quantity([4, 3]),
            "value": quantity([6]),
            "inference.k": quantity([12, 8]),
            "inference.v": quantity([9]),
        },
    }


def build_fake_variants():
    fake_layer = build_fake_layer
    probe = {"seq_len": 32, "eps": 0.1, "layers": [fake_layer(0), fake_layer(1, value_path=0)]}
    return {
        "softmax": {"probe": probe, "step": 100, "params": 1234, "metrics": {"loss": 2.5}},
        "other": {"probe": {**probe, "layers": probe["layers"][:1]}, "step": 7, "params": 99},
    }


@pytest.fixture
def quantity():
    """quantity(rank_eps, erank=None) -> one probe quantity (every metric per head)."""
    return build_quantity


@pytest.fixture
def fake_layer():
    """fake_layer(i, value_path=8, inference=16) -> a probe layer with every quantity."""
    return build_fake_layer


@pytest.fixture
def fake_variants():
    """fake_variants() -> two variants' probes, as build_report takes them."""
    return build_fake_variants
