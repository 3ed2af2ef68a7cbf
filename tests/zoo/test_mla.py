"""MLA: a latent KV path of rank R, decoded in the absorbed form from a cache of R + dr."""

import pytest
import torch

import zoo
from zoo.ops.attention import ATTENTION, AttnSpec

FUSED = [name for name in ATTENTION.names() if name != "reference"]
QUERIES = {"full-q": None, "low-rank-q": 12}
DEVICE_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_block(q_lora_rank=None, kv_lora_rank=6, dtype=torch.float64, backend="auto", seed=0,
               device="cpu", **kw):
    torch.manual_seed(seed)
    block = zoo.build("mla", d_model=32, n_heads=4, kv_lora_rank=kv_lora_rank,
                      q_lora_rank=q_lora_rank, backend=backend, **kw)
    with torch.no_grad():  # non-trivial norm gains, so that folding them in is tested
        for p in block.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return block.to(device=device, dtype=dtype)


def make_x(B=2, T=12, D=32, dtype=torch.float64, seed=1, device="cpu"):
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("queries", list(QUERIES))
@pytest.mark.parametrize("name", FUSED)
def test_every_backend_matches_reference_outputs_and_grads(name, queries):
    c = make_block(QUERIES[queries]).config
    reason = ATTENTION.why_not(name, AttnSpec("cpu", torch.float64, c.qk_dim, c.qk_dim,
                                              c.n_heads, c.n_heads, None, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    fused = make_block(QUERIES[queries], backend=name)
    ref = make_block(QUERIES[queries], backend="reference")
    x = make_x().requires_grad_()
    cot = torch.randn(2, 12, 32, dtype=torch.float64)
    y_f, y_r = fused(x), ref(x)
    assert (fused.backend, ref.backend) == (name, "reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-12, rtol=1e-10)
    g_f = torch.autograd.grad(y_f, [x, *fused.parameters()], cot)
    g_r = torch.autograd.grad(y_r, [x, *ref.parameters()], cot)
    for a, b in zip(g_f, g_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunks", [[5] + [1] * 10, [1] * 15, [4, 3, 1, 7]],
                         ids=["prefill-then-steps", "steps-only", "chunks"])
@pytest.mark.parametrize("queries", list(QUERIES))
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_absorbed_decoding_equals_parallel_forward(backend, queries, chunks, monkeypatch):
    block = make_block(QUERIES[queries], backend=backend)
    x = make_x(T=sum(chunks))
    expected = block(x)
    # the absorbed form never rebuilds per-head keys or values from the latents
    monkeypatch.setattr(block, "_up", lambda latent: pytest.fail("per-head K/V were built"))
    cache = block.init_cache(batch=2, max_len=sum(chunks))
    pieces, t = [], 0
    for n in chunks:
        pieces.append(block(x[:, t:t + n], cache=cache))
        t += n
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-12, rtol=1e-10)


def test_cache_holds_only_the_latent_and_the_rope_key():
    block = make_block(kv_lora_rank=6, qk_rope_head_dim=4)
    R, dr, T = 6, 4, 9
    cache = block.init_cache(batch=2, max_len=T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)
    assert set(state) == {"latent", "rope_key"}
    assert state["latent"].shape == (2, T, R) and state["rope_key"].shape == (2, T, dr)
    cached_per_token = sum(t[0].numel() for t in (cache.latent, cache.rope_key)) // T
    assert cached_per_token == R + dr
    declared = block.budget(T)
    assert declared.cache_elements == T * (R + dr)
    # the latent is exactly what the block projects (after the norm)
    latent, rope_key = block.latents(make_x(T=T), 0)
    torch.testing.assert_close(state["latent"], latent)
    torch.testing.assert_close(state["rope_key"], rope_key)


def test_cache_is_smaller_than_mha_at_matched_width():
    T = 64
    mla = zoo.build("mla", d_model=64, n_heads=4, kv_lora_rank=16).budget(T)
    mha = zoo.build("softmax", d_model=64, n_heads=4).budget(T)
    assert mla.cache_elements == T * (16 + 8)
    assert mha.cache_elements == T * 2 * 64
    assert mla.cache_elements < mha.cache_elements


def test_cache_overflow_names_the_lengths():
    block = make_block()
    cache = block.init_cache(batch=2, max_len=4)
    with pytest.raises(ValueError, match="max_len 4"):
        block(make_x(T=5), cache=cache)


@pytest.mark.parametrize("queries", list(QUERIES))
def test_output_rebuilt_from_mixing_matrices_and_value_path(queries):
    block = make_block(QUERIES[queries], dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    P = block.mixing_matrices(x)  # [B, H, T, T]
    assert P.shape == (2, 4, 12, 12) and P.dtype == torch.float32
    mixed = P @ block.value_heads(x)  # [B, H, T, dv]
    y = block.o_proj(mixed.transpose(1, 2).reshape(2, 12, -1))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("queries", list(QUERIES))
def test_declared_caps_go_through_the_latent(queries):
    """Value path R (met exactly by random weights), logits dn + dr, a state of R + dr
    (that the ranks stay within the caps is the contract's, tests/zoo/test_contract.py)."""
    block = make_block(QUERIES[queries], kv_lora_rank=5)
    c, T = block.config, 12
    declared = block.budget(seq_len=T)
    assert (declared.value_path, declared.logits) == (5, c.nope_dim + c.rope_dim)
    assert declared.inference == min(T, 5 + c.rope_dim)
    weights = block.weight_matrices()
    assert weights["value"].shape == (32, 4 * 8)
    assert int(torch.linalg.matrix_rank(weights["value"])) == declared.value_path


def test_weight_matrices_rebuild_the_value_path():
    """value = W_UV diag(g) W_DKV: on unit-rms latents it equals the block's own values."""
    block = make_block()
    x = make_x(T=5)
    latent_raw = x @ block.kv_down.weight[:6].T  # [B, T, R] before the norm
    rms = latent_raw.pow(2).mean(-1, keepdim=True).add(block.kv_norm.eps).sqrt()
    v_from_weights = (x / rms) @ block.weight_matrices()["value"].double()  # [B, T, H*dv]
    v_block = block.value_heads(x).transpose(1, 2).reshape(2, 5, -1)
    torch.testing.assert_close(v_from_weights, v_block, atol=1e-6, rtol=1e-6)


def test_explicit_head_dims_need_no_divisible_width():
    block = zoo.build("mla", d_model=30, n_heads=4, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=6, kv_lora_rank=10)
    assert block(torch.randn(1, 5, 30)).shape == (1, 5, 30)


def test_variants_build_and_registry_lists_the_block():
    assert "mla" in zoo.names()
    for label, kwargs in zoo.block_class("mla").variants(d_model=32, n_heads=4):
        block = zoo.build("mla", d_model=32, n_heads=4, **kwargs)
        assert block.budget(64).value_path == kwargs["kv_lora_rank"], label


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("backend", ["auto", "sdpa", "flex"])
def test_cuda_block_matches_reference_and_decodes(backend):
    torch.manual_seed(0)
    kw = {"d_model": 128, "n_heads": 4, "kv_lora_rank": 32, "qk_rope_head_dim": 16}
    fused = zoo.build("mla", backend=backend, **kw).to(device="cuda", dtype=torch.bfloat16)
    ref = zoo.build("mla", backend="reference", **kw).to("cuda")
    ref.load_state_dict({k: v.float() for k, v in fused.state_dict().items()})
    x = make_x(T=64, D=128, device="cuda")
    x_f, x_r = x.bfloat16().requires_grad_(), x.float().requires_grad_()
    y_f, y_r = fused(x_f), ref(x_r)
    torch.testing.assert_close(y_f.float(), y_r, atol=3e-2, rtol=3e-2)
    cot = torch.randn_like(y_r)
    (g_f,) = torch.autograd.grad(y_f, x_f, cot.bfloat16())
    (g_r,) = torch.autograd.grad(y_r, x_r, cot)
    torch.testing.assert_close(g_f.float(), g_r, atol=5e-2, rtol=5e-2)
    fused32, x = fused.float(), x.float()
    cache = fused32.init_cache(2, 64)
    with torch.no_grad():
        pieces = [fused32(x[:, :20], cache=cache)]
        pieces += [fused32(x[:, t:t + 1], cache=cache) for t in range(20, 64)]
        torch.testing.assert_close(torch.cat(pieces, 1), fused32(x), atol=2e-3, rtol=2e-3)
