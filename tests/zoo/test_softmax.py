"""The softmax block: fused kernels against the reference, GQA/MQA caches and caps.

The block contract (causality, decoding, caps, bad input and config) is checked on its
cases in tests/zoo/test_contract.py.
"""

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
def test_output_rebuilt_from_mixing_matrices_and_value_path(variant):
    block = make_block(VARIANTS[variant], dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    P = block.mixing_matrices(x)  # [B, H, T, T]
    assert P.shape == (2, 4, 12, 12) and P.dtype == torch.float32
    mixed = P @ block.value_heads(x)  # [B, H, T, V]
    y = block.o_proj(mixed.transpose(1, 2).reshape(2, 12, -1))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


def test_cache_overflow_names_the_lengths():
    block = make_block()
    cache = block.init_cache(batch=2, max_len=4)
    with pytest.raises(ValueError, match="max_len 4"):
        block(make_x(T=5), cache=cache)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_declared_caps_follow_the_kv_heads(variant):
    """Logits K, value path min(D, G*K), a cache of G*K keys per token (that the ranks
    stay within the caps is the contract's, tests/zoo/test_contract.py)."""
    block = make_block(VARIANTS[variant])
    T, G, K = 12, block.config.kv_heads, block.config.k_dim
    declared = block.budget(seq_len=T)
    assert declared.logits == K
    assert declared.value_path == min(32, G * K)
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)
    assert state["k"].shape == (2, T, G * K)
    assert declared.cache_elements == 2 * T * G * K


def test_gqa_and_mqa_shrink_the_cache_and_the_parameters():
    budgets = {v: make_block(g).budget(64) for v, g in VARIANTS.items()}
    assert budgets["mha"].cache_elements == 2 * budgets["gqa"].cache_elements
    assert budgets["gqa"].cache_elements == 2 * budgets["mqa"].cache_elements
    assert budgets["mha"].params > budgets["gqa"].params > budgets["mqa"].params


def test_unknown_block_name_is_named():
    with pytest.raises(ValueError, match="'softmaxx'; did you mean 'softmax'"):
        zoo.build("softmaxx", d_model=32, n_heads=4)


def test_explicit_cuda_backend_on_cpu_raises_with_reason():
    block = make_block(backend="flash_attn")
    with pytest.raises(RuntimeError, match="flash_attn"):
        block(make_x())


def test_variants_build_and_registry_lists_softmax():
    assert "softmax" in zoo.names()
    for label, kwargs in zoo.block_class("softmax").variants(d_model=32, n_heads=4):
        assert zoo.build("softmax", d_model=32, n_heads=4, **kwargs).budget(8).n_heads == 4, label


def test_quadratic_allocation_check_catches_the_reference_path(quadratic_allocations):
    """The check the linear-time blocks rely on does see a T x T tensor when one exists."""
    block = make_block(dtype=torch.float32, backend="reference")
    x = make_x(B=1, T=64, dtype=torch.float32).requires_grad_()
    assert (1, 4, 64, 64) in quadratic_allocations(block, x)
