"""The FlexAttention backend: CUDA for training; on CPU inference only (no backward there)."""

import pytest
import torch

import zoo
from zoo.ops.attention import ATTENTION, AttnSpec, reference_attention

# (H, G, Tq, Tk, window)
SHAPES = {
    "mha-causal": (4, 4, 24, 24, None),
    "gqa-window": (4, 2, 24, 24, 7),
    "mqa-window-chunk": (4, 1, 6, 24, 5),
    "gqa-decode-window": (4, 2, 1, 24, 9),
    "mha-W1": (4, 4, 24, 24, 1),
}
DEVICE_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_qkv(H, G, Tq, Tk, dtype, device="cpu", K=16, V=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, Tq, K, generator=g, dtype=torch.float64)
    k = torch.randn(2, G, Tk, K, generator=g, dtype=torch.float64)
    v = torch.randn(2, G, Tk, V, generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def test_flex_refuses_cpu_training_with_the_reason():
    reason = ATTENTION.why_not("flex", AttnSpec("cpu", torch.float32, 16, 16, 4, 4, 8, True))
    assert reason and "no backward on CPU" in reason
    assert ATTENTION.why_not("flex", AttnSpec("cpu", torch.float32, 16, 16, 4, 4, 8, False)) \
        is None
    block = zoo.build("sliding_window", d_model=32, n_heads=2, window=4, backend="flex")
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        block(torch.randn(1, 6, 32))


def test_flex_refuses_small_heads_and_fp64_on_cuda():
    assert "head dims >= 16" in flex_reason(torch.bfloat16, 8)
    assert "fp16, bf16 or fp32" in flex_reason(torch.float64, 16)
    assert flex_reason(torch.bfloat16, 16) == ""


def flex_reason(dtype, head_dim):
    spec = AttnSpec("cuda", dtype, head_dim, head_dim, 4, 2, 8, True)
    return ATTENTION.get("flex").unsupported(spec) or ""


def test_auto_takes_flex_on_cuda_for_windows_only():
    """Resolution logic only (no kernel runs): a window goes to flex unless flash-attn loads;
    full causal attention skips flex for SDPA."""
    first = "flash_attn" if ATTENTION.get("flash_attn").unavailable() is None else "flex"
    windowed = AttnSpec("cuda", torch.bfloat16, 64, 64, 8, 2, 128, True)
    assert ATTENTION.resolve("auto", windowed).name == first
    full = AttnSpec("cuda", torch.bfloat16, 64, 64, 8, 2, None, True)
    assert ATTENTION.resolve("auto", full).name in {"flash_attn", "sdpa"}
    assert ATTENTION.resolve("flex", full).name == "flex"  # asked for by name: it serves
    cpu = AttnSpec("cpu", torch.float32, 64, 64, 8, 2, 128, False)
    assert ATTENTION.resolve("auto", cpu).name == "sdpa"


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_flex_inference_matches_reference_on_cpu(shape):
    H, G, Tq, Tk, window = SHAPES[shape]
    q, k, v = make_qkv(H, G, Tq, Tk, torch.float64, V=8)
    with torch.no_grad():
        o = ATTENTION.get("flex").fn(q, k, v, window=window, scale=0.25)
    torch.testing.assert_close(o, reference_attention(q, k, v, window=window, scale=0.25),
                               atol=1e-12, rtol=1e-10)


@pytest.mark.slow
def test_sliding_window_block_decodes_with_flex_on_cpu():
    torch.manual_seed(0)
    block = zoo.build("sliding_window", d_model=32, n_heads=4, window=5, backend="flex").double()
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    with torch.no_grad():
        cache = block.init_cache(2, 16)
        pieces = [block(x[:, :7], cache=cache)]
        pieces += [block(x[:, t:t + 1], cache=cache) for t in range(7, 16)]
        expected = zoo.build("sliding_window", d_model=32, n_heads=4, window=5,
                             backend="reference").double()
        expected.load_state_dict(block.state_dict())
        torch.testing.assert_close(torch.cat(pieces, 1), expected(x), atol=1e-12, rtol=1e-10)
    assert block.backend == "flex"


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_flex_matches_reference_on_cuda_outputs_and_grads(shape, dtype):
    H, G, Tq, Tk, window = SHAPES[shape]
    q, k, v = (t.requires_grad_() for t in make_qkv(H, G, Tq, Tk, dtype, "cuda", V=32))
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o = ATTENTION.get("flex").fn(q, k, v, window=window, scale=0.25)
    o_ref = reference_attention(*ref, window=window, scale=0.25)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(o.float(), o_ref, atol=tol, rtol=tol)
    cot = torch.randn_like(o_ref)
    grads = torch.autograd.grad(o, (q, k, v), cot.to(dtype))
    grads_ref = torch.autograd.grad(o_ref, ref, cot)
    for got, want, what in zip(grads, grads_ref, "qkv", strict=True):
        torch.testing.assert_close(got.float(), want, atol=2.5 * tol, rtol=2.5 * tol,
                                   msg=f"d{what} differs")


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_flex_serves_chunks_with_grads_and_sinks_for_inference_on_cuda(dtype):
    """Chunks through the block mask (outputs and gradients); sinks through the returned
    log-sum-exp, without gradients (flex_unsupported refuses them with grad)."""
    q, k, v = (t.requires_grad_() for t in make_qkv(4, 2, 24, 24, dtype, "cuda", V=32))
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o = ATTENTION.get("flex").fn(q, k, v, window=None, scale=0.25, chunk=7)
    o_ref = reference_attention(*ref, window=None, scale=0.25, chunk=7)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(o.float(), o_ref, atol=tol, rtol=tol)
    cot = torch.randn_like(o_ref)
    for got, want in zip(torch.autograd.grad(o, (q, k, v), cot.to(dtype)),
                         torch.autograd.grad(o_ref, ref, cot), strict=True):
        torch.testing.assert_close(got.float(), want, atol=2.5 * tol, rtol=2.5 * tol)
    sinks = torch.linspace(-1, 1, 4, device="cuda")
    with torch.no_grad():
        o = ATTENTION.get("flex").fn(q, k, v, window=5, scale=0.25, chunk=7, sinks=sinks)
        o_ref = reference_attention(*ref, window=5, scale=0.25, chunk=7, sinks=sinks)
    torch.testing.assert_close(o.float(), o_ref, atol=tol, rtol=tol)
