"""The softmax block keeps the block contract: causal, cached, rebuildable, budgeted."""

import pytest
import torch

import zoo

VARIANTS = {"mha": None, "gqa": 2, "mqa": 1}


def make_block(n_kv_heads=None, dtype=torch.float64, backend="auto", seed=0, **kw):
    torch.manual_seed(seed)
    block = zoo.build("softmax", d_model=32, n_heads=4, n_kv_heads=n_kv_heads, backend=backend,
                      **kw)
    return block.to(dtype)


def make_x(B=2, T=12, D=32, dtype=torch.float64, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_block_matches_reference_outputs_and_grads(variant):
    fused = make_block(VARIANTS[variant], backend="sdpa")
    ref = make_block(VARIANTS[variant], backend="reference")
    ref.load_state_dict(fused.state_dict())
    x = make_x().requires_grad_()
    cot = torch.randn(2, 12, 32, dtype=torch.float64)
    y_f, y_r = fused(x), ref(x)
    assert (fused.backend, ref.backend) == ("sdpa", "reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-12, rtol=1e-10)
    grads_f = torch.autograd.grad(y_f, [x, *fused.parameters()], cot)
    grads_r = torch.autograd.grad(y_r, [x, *ref.parameters()], cot)
    for a, b in zip(grads_f, grads_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_future_tokens_do_not_change_past_outputs(variant):
    block = make_block(VARIANTS[variant])
    x = make_x()
    x2 = x.clone()
    x2[:, 7:] = torch.randn_like(x2[:, 7:])
    y, y2 = block(x), block(x2)
    torch.testing.assert_close(y[:, :7], y2[:, :7], atol=1e-12, rtol=0)
    assert not torch.allclose(y[:, 7:], y2[:, 7:])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_output_rebuilt_from_mixing_matrices_and_value_path(variant):
    block = make_block(VARIANTS[variant], dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    P = block.mixing_matrices(x)  # [B, H, T, T]
    assert P.shape == (2, 4, 12, 12) and P.dtype == torch.float32
    mixed = P @ block.value_heads(x)  # [B, H, T, V]
    y = block.o_proj(mixed.transpose(1, 2).reshape(2, 12, -1))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_prefill_then_decode_equals_parallel_forward(variant, backend):
    block = make_block(VARIANTS[variant], backend=backend)
    x = make_x(T=15)
    cache = block.init_cache(batch=2, max_len=15)
    pieces = [block(x[:, :5], cache=cache)]  # prefill
    pieces += [block(x[:, t:t + 1], cache=cache) for t in range(5, 15)]  # one token at a time
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == 15


def test_cache_overflow_names_the_lengths():
    block = make_block()
    cache = block.init_cache(batch=2, max_len=4)
    with pytest.raises(ValueError, match="max_len 4"):
        block(make_x(T=5), cache=cache)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_declared_caps_hold_on_random_weights(variant):
    block = make_block(VARIANTS[variant])
    T, G, K = 12, block.config.kv_heads, block.config.k_dim
    declared = block.budget(seq_len=T)
    weights = block.weight_matrices()
    assert weights["qk"].shape == (4, 32, 32)
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= declared.logits == K
    assert int(torch.linalg.matrix_rank(weights["value"])) <= declared.value_path == min(32, G * K)
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)
    assert state["k"].shape == (2, T, G * K)
    assert int(torch.linalg.matrix_rank(state["k"]).max()) <= declared.inference
    assert declared.cache_elements == 2 * T * G * K
    assert declared.params == sum(p.numel() for p in block.parameters())


def test_gqa_and_mqa_shrink_the_cache_and_the_parameters():
    budgets = {v: make_block(g).budget(64) for v, g in VARIANTS.items()}
    assert budgets["mha"].cache_elements == 2 * budgets["gqa"].cache_elements
    assert budgets["gqa"].cache_elements == 2 * budgets["mqa"].cache_elements
    assert budgets["mha"].params > budgets["gqa"].params > budgets["mqa"].params


@pytest.mark.parametrize("kwargs, message", [
    ({"d_model": 512, "n_heads": 6}, r"n_heads \(6\) must divide d_model \(512\)"),
    ({"d_model": 32, "n_heads": 4, "n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
    ({"d_model": 32, "n_heads": 0}, r"n_heads must be a positive int, got 0"),
    ({"d_model": 15, "n_heads": 5, "rope": True}, r"even head_dim, got 3"),
    ({"d_model": 32, "n_heads": 4, "backend": "fast"}, r"unknown attention backend 'fast'"),
    ({"d_model": 32, "n_heads": 4, "n_kv_head": 2}, r"'n_kv_head'; did you mean 'n_kv_heads'"),
], ids=["heads-divide-width", "kv-heads-divide-heads", "zero-heads", "odd-rope-dim",
        "unknown-backend", "unknown-key"])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build("softmax", **kwargs)


def test_unknown_block_name_is_named():
    with pytest.raises(ValueError, match="'softmaxx'; did you mean 'softmax'"):
        zoo.build("softmaxx", d_model=32, n_heads=4)


@pytest.mark.parametrize("x, message", [
    (torch.randn(2, 12, 31, dtype=torch.float64), r"\[B, T, 32\], got \(2, 12, 31\)"),
    (torch.randn(12, 32, dtype=torch.float64), r"got \(12, 32\)"),
    (torch.ones(2, 12, 32, dtype=torch.long), "floating-point x, got torch.int64"),
    (torch.randn(2, 12, 32, dtype=torch.float32), "x is torch.float32 but the weights are"),
], ids=["width", "rank", "integer", "dtype-mismatch"])
def test_bad_input_names_shape_or_dtype(x, message):
    with pytest.raises(ValueError, match=message):
        make_block()(x)


def test_explicit_cuda_backend_on_cpu_raises_with_reason():
    block = make_block(backend="flash_attn")
    with pytest.raises(RuntimeError, match="flash_attn"):
        block(make_x())


def test_bf16_autocast_forward_is_close_to_fp32():
    block = make_block(dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x)
    torch.testing.assert_close(y.float(), block(x), atol=5e-2, rtol=5e-2)


def test_variants_build_and_registry_lists_softmax():
    assert "softmax" in zoo.names()
    for label, kwargs in zoo.block_class("softmax").variants(d_model=32, n_heads=4):
        assert zoo.build("softmax", d_model=32, n_heads=4, **kwargs).budget(8).n_heads == 4, label


def test_quadratic_allocation_check_catches_the_reference_path(quadratic_allocations):
    """The check the linear-time blocks rely on does see a T x T tensor when one exists."""
    block = make_block(dtype=torch.float32, backend="reference")
    x = make_x(B=1, T=64, dtype=torch.float32).requires_grad_()
    assert (1, 4, 64, 64) in quadratic_allocations(block, x)
