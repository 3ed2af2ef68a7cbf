"""The probe of a model of one's own (budgets/probe/own.py) through the SDPA capture
(budgets/capture/sdpa.py): a nanoGPT-style model written here, its P against an eager
reference from the same weights in fp64, what the capture cannot read named, and the
same figures as the attention-interface capture on tiny Hugging Face models."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import budgets
from budgets.capture.sdpa import capture_sdpa
from budgets.probe.own import logits_of, probe_torch_model, report_of_model

B, T, V = 2, 32, 64


class Attention(nn.Module):
    """GPT-2's causal self-attention, as nanoGPT writes it with SDPA; `eager` computes the
    same attention by hand (the reference), `dropout` attends with dropout in training."""

    def __init__(self, D: int, H: int, dropout: float = 0.0):
        super().__init__()
        self.H, self.dropout, self.eager = H, dropout, False
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        B_, T_, D = x.shape
        q, k, v = (t.view(B_, T_, self.H, -1).transpose(1, 2)
                   for t in self.c_attn(x).split(D, dim=2))  # [B, H, T, K] each
        if self.eager:
            logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [B, H, T, T]
            causal = torch.ones(T_, T_, dtype=torch.bool).tril()
            self.P = logits.masked_fill(~causal, float("-inf")).softmax(-1)
            y = self.P @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0)
        return self.c_proj(y.transpose(1, 2).reshape(B_, T_, D))


class Block(nn.Module):
    def __init__(self, D: int, H: int, attention: nn.Module | None = None):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = attention if attention is not None else Attention(D, H)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Mean(nn.Module):
    """A token mixer that is not SDPA: a causal running mean (a custom kernel's stand-in)."""

    def forward(self, x):
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


class GPT(nn.Module):
    def __init__(self, D: int = 32, H: int = 4, L: int = 3, blocks=None):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.h = nn.ModuleList(blocks or [Block(D, H) for _ in range(L)])
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)), None  # (logits, loss), as nanoGPT returns


def _tokens() -> torch.Tensor:
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT().eval()


def test_each_layer_s_p_is_the_eager_reference_s(gpt):
    probe, loss = probe_torch_model(gpt.double(), _tokens())
    for block in gpt.h:
        block.attn.eager = True
    with torch.no_grad():
        logits = gpt(_tokens())[0]
    assert loss == pytest.approx(float(F.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                       _tokens()[:, 1:].flatten())))
    assert [ly["name"] for ly in probe["layers"]] == [f"h.{i}.attn" for i in range(3)]
    for layer, block in zip(probe["layers"], gpt.h, strict=True):
        want = budgets.rank_metrics(block.attn.P[..., T // 2:, :T // 2])["rank_eps"].mean(0)
        assert layer["quantities"]["past_future"]["rank_eps"] == pytest.approx(want.tolist())
        # the fused c_attn's rows were found: W_Q W_K^T, W_V and W_O are measured
        assert {"qk", "value", "out", "inference.k", "inference.v"} <= set(layer["quantities"])
    assert "unread_calls" not in probe and "unmeasured_mixers" not in probe


def test_the_report_has_every_layer_by_its_kind_exact_and_matrix_free(gpt):
    exact = report_of_model(gpt, _tokens(), name="gpt")
    free = report_of_model(gpt, _tokens(), name="gpt", matfree_from=16)
    for report in (exact, free):
        assert [k["kind"] for k in report["kinds"]] == ["global no RoPE"]
        assert report["kinds"][0]["layers"] == [0, 1, 2]
    assert free["source"]["matfree"]["from"] == 16 and "matfree" not in exact["source"]


def test_what_the_capture_cannot_read_is_named(gpt):
    gpt.h[1].attn = Mean()  # a layer attending by no SDPA call
    gpt.h[2].attn.dropout = 0.1
    gpt.h[2].attn.train()  # attention dropout in training: P is random
    probe, _ = probe_torch_model(gpt, _tokens())
    assert [ly["name"] for ly in probe["layers"]] == ["h.0.attn"]
    assert probe["unread_calls"] == ["Attention: dropout_p=0.1 (attention dropout: P is random)"]
    assert [(m["layer"], m["class"]) for m in probe["unmeasured_mixers"]] == [
        (1, "Block"), (2, "Block")]


def test_flex_attention_calls_are_named_not_misread(gpt):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")

    class Flex(nn.Module):
        def __init__(self, attention: Attention):
            super().__init__()
            self.c_attn, self.c_proj, self.H = attention.c_attn, attention.c_proj, attention.H

        def forward(self, x):
            B_, T_, D = x.shape
            q, k, v = (t.view(B_, T_, self.H, -1).transpose(1, 2)
                       for t in self.c_attn(x).split(D, dim=2))
            mask = flex.create_block_mask(lambda b, h, i, j: i >= j, None, None, T_, T_,
                                          device="cpu")
            return self.c_proj(flex.flex_attention(q, k, v, block_mask=mask)
                               .transpose(1, 2).reshape(B_, T_, D))

    gpt.h[2].attn = Flex(gpt.h[2].attn)
    with warnings.catch_warnings():  # torch may warn of flex_attention without compile
        warnings.simplefilter("ignore")
        probe, _ = probe_torch_model(gpt, _tokens())
    assert [ly["name"] for ly in probe["layers"]] == ["h.0.attn", "h.1.attn"]
    assert probe["unread_calls"] == [
        "1 flex_attention call: FlexAttention's score_mod and block mask are not read"]


@pytest.mark.parametrize("mask, window", [
    ("causal", None), ("window", 8), ("causal_float", None)], ids=str)
def test_masks_written_out_read_as_causal_or_a_window(mask, window):
    q = torch.randn(1, 2, T, 8, generator=torch.Generator().manual_seed(1))
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    if mask == "window":
        seen &= ~torch.ones(T, T, dtype=torch.bool).tril(-window)
    given = seen if mask != "causal_float" else torch.zeros(T, T).masked_fill(~seen, -1e30)
    calls = []
    module = nn.Module()
    with capture_sdpa(module, calls.append, keep_probs=True), torch.no_grad():
        module.forward = lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=given)
        module()
    (call,) = calls
    assert call.window == window and call.mask is None
    want = (q @ q.mT / 8 ** 0.5).masked_fill(~seen, float("-inf")).softmax(-1)
    torch.testing.assert_close(call.probs, want)


def test_repeated_kv_heads_are_read_as_the_model_s_groups():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, T, 8, generator=g)
    k, v = (torch.randn(1, 2, T, 8, generator=g) for _ in range(2))
    calls, module = [], nn.Module()
    module.forward = lambda: F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    with capture_sdpa(module, calls.append), torch.no_grad():
        module()
    assert calls[0].key.shape[1] == 2 and torch.equal(calls[0].key, k)


def test_a_forward_without_logits_is_a_clear_error():
    with pytest.raises(ValueError, match="no logits"):
        logits_of({"hidden": torch.zeros(1)})


def test_x_transformers_model_gives_its_own_attention_maps():
    """A model from a package, x-transformers' decoder with flash attention (SDPA): the
    attention sits in a weightless Attend helper, its projections in the module around
    it; P equals the maps the package itself returns on its non-flash path, in fp64."""
    x_transformers = pytest.importorskip("x_transformers", reason="pip install x-transformers")
    torch.manual_seed(0)
    model = x_transformers.TransformerWrapper(
        num_tokens=V, max_seq_len=T, attn_layers=x_transformers.Decoder(
            dim=32, depth=2, heads=4, attn_flash=True)).eval().double()
    probe, _ = probe_torch_model(model, _tokens())
    for module in model.modules():
        if hasattr(module, "flash"):
            module.flash = False  # the package's own einsum path returns its maps
    with torch.no_grad():
        _, maps = model(_tokens(), return_attn=True)
    assert len(probe["layers"]) == len(maps) == 2 and "unmeasured_mixers" not in probe
    for layer, P in zip(probe["layers"], maps, strict=True):
        want = budgets.rank_metrics(P[..., T // 2:, :T // 2])["rank_eps"].mean(0)
        assert layer["quantities"]["past_future"]["rank_eps"] == pytest.approx(want.tolist())
        assert {"qk", "value", "out"} <= set(layer["quantities"])


transformers = pytest.importorskip("transformers", reason="the HF comparison needs it")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "gpt2"])
def test_sdpa_capture_equals_the_interface_capture(model_type):
    """A tiny HF model read through its SDPA calls and through transformers' attention
    interface: the same layers, the same figures (GQA expanded before SDPA, a window
    passed as a mask, RoPE recorded by the modeling module's rotary function)."""
    from budgets.hf.probe import probe_hf_model
    from tests.hf_tiny import tiny_model

    model = tiny_model(model_type)
    ids = torch.randint(3, 128, (B, 24), generator=torch.Generator().manual_seed(1))
    want, want_loss = probe_hf_model(model, ids)
    model.set_attn_implementation("sdpa")
    got, loss = probe_torch_model(model, ids, forward=lambda m, x: m(input_ids=x,
                                                                     use_cache=False))
    assert loss == pytest.approx(want_loss, abs=1e-6)
    for a, b in zip(want["layers"], got["layers"], strict=True):
        assert a["name"] == b["name"] and a["kind"] == b["kind"]
        assert set(a["quantities"]) == set(b["quantities"])
        for q, figures in a["quantities"].items():
            for metric, value in figures.items():
                assert b["quantities"][q][metric] == pytest.approx(value, abs=1e-4), (q, metric)
