"""The HF probe's per-head, residual-stream and per-KV-head figures (budgets.hf.probe), on tiny
random models built in memory (nothing downloaded), exact and matrix-free."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

from budgets import rank_metrics  # noqa: E402
from budgets.hf.probe import probe_hf_model  # noqa: E402

B, T, H, G, K, D = 2, 64, 4, 2, 8, 32
FIGURES = ("past_future_lengths", "heads", "residual", "kv_heads")


def _model(family: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "GPT2":
        config = transformers.GPT2Config(n_embd=D, n_layer=2, n_head=H, vocab_size=64,
                                         n_positions=128, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = getattr(transformers, f"{family}Config")(
            hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=H,
            num_key_value_heads=G, head_dim=K, vocab_size=64, max_position_embeddings=128,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    model.set_attn_implementation("eager")
    return model.eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))  # [B, T]


def _close(a, b, where: str) -> None:
    """JSON-like a == b, floats to 1e-4 relative (the matrix-free path works in fp32)."""
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and b is not None:
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6), where
    else:
        assert a == b or (b is None and "raw_erank" in where), where


@pytest.mark.parametrize("family, extra", [("Llama", {}), ("Mistral", {"sliding_window": 24}),
                                           ("GPT2", {})])
def test_figures_equal_on_the_exact_and_the_matrix_free_path(family, extra):
    model, ids = _model(family, **extra), _ids()
    exact, _ = probe_hf_model(model, ids, matfree_from=None)
    free, _ = probe_hf_model(model, ids, matfree_from=16)
    assert exact["batch_size"] == free["batch_size"] == B
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        for name in FIGURES:
            _close(a[name], b[name], f"layer {a['layer']} {name}")
        assert [e["seq_len"] for e in a["past_future_lengths"]] == [16, 32, 64]
        assert a["kv_heads"]["rope"] is (family != "GPT2")
        # rank_eps_max: the largest sample's, never below the mean
        for q in ("past_future", "inference.k"):
            m = a["quantities"][q]
            assert all(hi >= lo for hi, lo in zip(m["rank_eps_max"], m["rank_eps"], strict=True))


def test_keys_before_rope_read_the_rank_of_a_low_rank_projection():
    model, ids, r = _model("Llama"), _ids(), 2
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:  # each KV head's W_K of rank r, equal singular values
            U = torch.linalg.qr(torch.randn(G, K, r, generator=g)).Q  # [G, K, r]
            V = torch.linalg.qr(torch.randn(G, D, r, generator=g)).Q  # [G, D, r]
            layer.self_attn.k_proj.weight.copy_((U @ V.mT).reshape(G * K, D))
    keys = []
    hook = model.model.layers[0].self_attn.k_proj.register_forward_hook(
        lambda m, args, out: keys.append(out))
    for matfree_from in (None, 16):
        probe, _ = probe_hf_model(model, ids, matfree_from=matfree_from)
        kv = probe["layers"][0]["kv_heads"]
        assert kv["k_pre_rope"]["rank_eps_max"] == [float(r)] * G
        assert min(kv["k"]["rank_eps"]) > r  # RoPE turns each token by its own angles
        pre = keys[-1].reshape(B, T, G, K).transpose(1, 2)  # [B, G, T, K]
        want = rank_metrics(pre, 0.1)["erank"].mean(0)
        assert kv["k_pre_rope"]["erank"] == pytest.approx(want.tolist(), rel=1e-5)
    hook.remove()


def test_residual_is_the_decoder_layer_input_and_finds_a_massive_token():
    model, ids = _model("Llama"), _ids()
    hook = model.model.embed_tokens.register_forward_hook(
        lambda m, args, h: h.index_put((torch.tensor([1]), torch.tensor([9])), h[1, 9] * 400.0))
    inputs = {}

    def keep(i):
        def hook(module, args, kwargs):
            inputs[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    hooks = [layer.register_forward_pre_hook(keep(i), with_kwargs=True)
             for i, layer in enumerate(model.model.layers)]
    try:
        for matfree_from in (None, 16):
            inputs.clear()
            probe, _ = probe_hf_model(model, ids, matfree_from=matfree_from)
            for i, layer in enumerate(probe["layers"]):
                residual = layer["residual"]
                assert [(m["sample"], m["position"]) for m in residual["massive"]] == [(1, 9)]
                want = rank_metrics(inputs[i], center=True)["erank"].mean()
                assert residual["centered_erank"] == pytest.approx(float(want), rel=1e-5)
    finally:
        for h in (hook, *hooks):
            h.remove()


def test_only_the_layers_asked_for_carry_figures():
    probe, _ = probe_hf_model(_model("Llama"), _ids(), layers=[1])
    (layer,) = probe["layers"]
    assert layer["layer"] == 1 and all(name in layer for name in FIGURES)
