"""The capture of any transformers causal LM (budgets/hf/capture.py,
budgets/capture/projections.py): on tiny random models of many types (tests/hf_tiny.py,
built offline), the captured P and the model's logits equal eager attention's, the
projections found reproduce the captured keys, queries and values, and the probe runs on
both paths."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

from budgets.capture.attention import AttentionCall, attend  # noqa: E402
from budgets.hf.capture import (  # noqa: E402
    TRANSFORMED_ATTENTION,
    capture,
    transformed,
    transformers_attention,
)
from budgets.hf.probe import hf_layer_maps, probe_hf_model  # noqa: E402
from tests.hf_tiny import ATTENTION_TYPES, MLA_TYPES, VOCAB, tiny_model  # noqa: E402

B, T = 2, 24


def _ids(T: int = T) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=ATTENTION_TYPES)
def model(request):
    return tiny_model(request.param)


@torch.no_grad()
def test_captured_probabilities_and_logits_equal_eager(model):
    ids = _ids()
    eager = model(input_ids=ids, output_attentions=True)
    calls: list[AttentionCall] = []
    with capture(model, calls.append, keep_probs=True):
        captured = model(input_ids=ids)
    assert model.config._attn_implementation == "eager"  # restored
    assert len(calls) == len(eager.attentions) == model.config.num_hidden_layers
    torch.testing.assert_close(captured.logits, eager.logits, rtol=0, atol=1e-5)
    for call, P in zip(calls, eager.attentions, strict=True):
        torch.testing.assert_close(call.probs, P, rtol=0, atol=1e-6)


@torch.no_grad()
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_transformed_keys_and_values_reach_the_models_own_attention(model_type):
    """Passed through unchanged, the logits are the model's; keys zeroed, attention turns
    uniform; either way the model's implementation and the interface are restored."""
    model, ids = tiny_model(model_type), _ids()
    before = model(input_ids=ids).logits
    seen = []

    def same(module, key, value):
        seen.append(module)
        return key, value

    with transformed(model, same, "the test"):
        kept = model(input_ids=ids).logits
    torch.testing.assert_close(kept, before, rtol=0, atol=1e-6)
    assert len(set(seen)) == model.config.num_hidden_layers
    with transformed(model, lambda module, k, v: (torch.zeros_like(k), v), "the test"):
        uniform = model(input_ids=ids).logits
    assert (uniform - before).abs().max() > 1e-3
    assert model.config._attn_implementation == "eager"
    assert TRANSFORMED_ATTENTION not in transformers_attention()[0]


@torch.no_grad()
def test_the_projections_found_give_the_captured_heads(model):
    ids = _ids()
    layers = hf_layer_maps(model, ids)
    calls: list[AttentionCall] = []
    inputs = {}
    hooks = [layer.module.register_forward_pre_hook(
        lambda m, a, kw: inputs.__setitem__(m, a[0] if a else kw["hidden_states"]),
        with_kwargs=True) for layer in layers]
    try:
        with capture(model, calls.append):
            model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    for layer, call in zip(layers, calls, strict=True):
        x = inputs[call.module]  # [B, T, D]
        assert layer.out is not None  # W_O: every type has one
        H, G, K, V = layer.shape
        if layer.v is None:  # MLA: values come from a latent, named as not measured
            assert model.config.model_type in MLA_TYPES and "W_V" in layer.missing()
            continue
        if layer.v.through is None:  # values: a linear of x (gemma4's pass a norm after it)
            v = x @ layer.v.weight().T + (0 if layer.v.bias() is None else layer.v.bias())
            torch.testing.assert_close(v.view(B, T, G, V).transpose(1, 2), call.value)
        if layer.k.through is None:  # keys before RoPE: a linear of x
            k = x @ layer.k.weight().T + (0 if layer.k.bias() is None else layer.k.bias())
            want = call.key_pre if call.rope else call.key
            torch.testing.assert_close(k.view(B, T, G, K).transpose(1, 2), want)


def test_windows_softcap_and_sinks_are_read_from_the_calls():
    calls: list[AttentionCall] = []
    model = tiny_model("gemma3_text")
    with torch.no_grad(), capture(model, calls.append):
        model(input_ids=_ids())
    assert [c.window for c in calls] == [8] * 5 + [None]  # five local layers, one global
    calls.clear()
    with torch.no_grad(), capture(gemma2 := tiny_model("gemma2"), calls.append):
        gemma2(input_ids=_ids())
    assert [c.softcap for c in calls] == [5.0, 5.0]
    calls.clear()
    with torch.no_grad(), capture(oss := tiny_model("gpt_oss"), calls.append):
        oss(input_ids=_ids())
    assert all(c.sinks is not None and c.sinks.shape == (4,) for c in calls)


def test_attention_in_blocks_of_rows_equals_one_block(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4 // n, 16, 8, generator=g, dtype=torch.float64)
               for n in (1, 2, 2))
    call = AttentionCall(torch.nn.Identity(), q, k, v, 0.3, window=5, softcap=2.0,
                         sinks=torch.randn(4, generator=g, dtype=torch.float64))
    whole = attend(call, keep_probs=True)
    P = call.probs
    # 3 rows a block
    monkeypatch.setattr("budgets.capture.attention.CHUNK_ELEMENTS", 2 * 4 * 16 * 3)
    torch.testing.assert_close(attend(call, keep_probs=True), whole)
    torch.testing.assert_close(call.probs, P)
    # an independent fp64 reference: logits, soft-cap, the band mask, the sink column
    S = 2.0 * torch.tanh(q @ k.repeat_interleave(2, 1).mT * 0.3 / 2.0)
    t, s = torch.arange(16)[:, None], torch.arange(16)[None, :]
    S = S.masked_fill((s > t) | (s <= t - 5), float("-inf"))
    sink = call.sinks.view(1, 4, 1, 1).expand(2, 4, 16, 1)
    want = torch.softmax(torch.cat([S, sink], -1), -1)[..., :-1]
    torch.testing.assert_close(P, want)
    assert (P.sum(-1) < 1).all()  # the sink takes a share of every row


@pytest.mark.parametrize("case", ["causal", "window-mask", "softcap", "sinks"])
def test_the_fused_attention_output_equals_the_rows_one(case):
    """`fused` (the matrix-free probe): SDPA where it computes the same attention (no mask
    but causality, or SDPA's boolean mask), the rows' path where it cannot (soft-capping,
    sinks); the same P V either way."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4 // n, 16, 8, generator=g) for n in (1, 2, 2))
    t, s = torch.arange(16)[:, None], torch.arange(16)[None, :]
    extra = {"window-mask": dict(window=5, mask=((s <= t) & (s > t - 5)).expand(2, 1, 16, 16)),
             "softcap": dict(softcap=2.0),
             "sinks": dict(sinks=torch.randn(4, generator=g))}.get(case, {})
    call = AttentionCall(torch.nn.Identity(), q, k, v, 0.3, **extra)
    rows = attend(call, keep_probs=False)
    torch.testing.assert_close(attend(call, keep_probs=False, fused=True), rows, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("model_type", ["gemma3_text", "gpt_oss", "phi", "gpt_neox"])
def test_matrix_free_ranks_equal_the_exact_path(model_type):
    model, ids = tiny_model(model_type), _ids(48)
    exact, loss_exact = probe_hf_model(model, ids, matfree_from=None)
    free, loss_free = probe_hf_model(model, ids, matfree_from=16)
    assert loss_free == pytest.approx(loss_exact, abs=1e-5)  # its own P V: sinks hold
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["kind"] == b["kind"] and a["budget"] == b["budget"]
        for q in ("past_future", "mixing"):
            assert b["quantities"][q]["rank_eps"] == a["quantities"][q]["rank_eps"], q
            assert b["quantities"][q]["stable_rank"] == pytest.approx(
                a["quantities"][q]["stable_rank"], rel=1e-4), q


def test_each_layer_knows_its_kind_and_caps():
    probe, _ = probe_hf_model(tiny_model("gemma3_text"), _ids(32), matfree_from=None)
    kinds = [layer["kind"]["label"] for layer in probe["layers"]]
    assert kinds == ["sliding W=8"] * 5 + ["global"]
    caps = [layer["budget"]["mixing"] for layer in probe["layers"]]
    assert caps == [8 - 1] * 5 + [32 // 2]  # a window's past->future cap is W - 1
    moe, _ = probe_hf_model(tiny_model("mixtral"), _ids(), matfree_from=None)
    assert all(layer["kind"]["moe"] for layer in moe["layers"])
    assert not any(layer["kind"]["moe"] for layer in probe["layers"])


def test_mla_names_what_it_does_not_measure():
    probe, _ = probe_hf_model(tiny_model("deepseek_v3"), _ids(), matfree_from=None)
    for layer in probe["layers"]:
        assert "W_Q, W_K, W_V" in layer["not_measured"][0]
        assert "qk" not in layer["quantities"] and "out" in layer["quantities"]


@torch.no_grad()
def test_mla_cache_rows_are_its_latent():
    """An MLA layer's inference rows are the latent and rotary key an MLA cache holds, capped
    by min(T, R + dr), read here from the model's own cache after a prefill: transformers
    caches deepseek_v3's latent from 5.15 on; before, it cached the expanded keys and
    values, each head's key ending with the shared rotary key, and the latent is then
    kv_b_proj's input."""
    model, ids = tiny_model("deepseek_v3"), _ids()
    probe, _ = probe_hf_model(model, ids, with_spectra=True, matfree_from=None)
    latents = []  # what each layer's kv_b_proj expands, [B, T, R]
    hooks = [layer.self_attn.kv_b_proj.register_forward_pre_hook(
        lambda m, args: latents.append(args[0].reshape(B, T, -1)))
        for layer in model.model.layers]
    try:
        cache = model(input_ids=ids, use_cache=True).past_key_values
    finally:
        for h in hooks:
            h.remove()
    c = model.config
    width = c.kv_lora_rank + c.qk_rope_head_dim
    for layer, cached, latent in zip(probe["layers"], cache.layers, latents, strict=True):
        q = layer["quantities"]
        assert "inference.k" not in q and "inference.v" not in q
        assert layer["budget"]["inference"] == min(T, width)
        assert layer["budget"]["cache_elements"] == T * width
        if cached.keys.shape[1] == 1:  # the latent [B, 1, T, R], the rotary key [B, 1, T, dr]
            rows = cached.keys[:, 0], cached.values[:, 0]
        else:  # keys [B, H, T, dn + dr]
            rows = latent, cached.keys[:, 0, :, -c.qk_rope_head_dim:]
        for row, x in zip(("inference.latent", "inference.rope_key"), rows, strict=True):
            x = x.double()  # [B, T, R] / [B, T, dr]
            assert q[row]["shape"] == list(x.shape[1:])
            want = torch.linalg.svdvals(x).mean(0)  # fp64, the batch's mean spectrum
            torch.testing.assert_close(layer["spectra"][row][0].double(), want,
                                       rtol=1e-4, atol=1e-5)
