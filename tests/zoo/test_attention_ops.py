"""Every attention backend against the eager reference: outputs and gradients."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from zoo.ops.attention import ATTENTION, AttnSpec, attention_probs, reference_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (H, G, Tq, Tk, window)
SHAPES = {
    "mha-prefill": (4, 4, 24, 24, None),
    "gqa-prefill": (4, 2, 24, 24, None),
    "mqa-prefill": (4, 1, 24, 24, None),
    "mha-chunk": (4, 4, 5, 24, None),
    "gqa-decode": (4, 2, 1, 24, None),
    "gqa-window": (4, 2, 24, 24, 7),
    "mqa-window-chunk": (4, 1, 6, 24, 5),
}


def make_qkv(H, G, Tq, Tk, dtype, device="cpu", K=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, Tq, K, generator=g, dtype=torch.float64)
    k = torch.randn(2, G, Tk, K, generator=g, dtype=torch.float64)
    v = torch.randn(2, G, Tk, K, generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v)]


def run_with_grads(fn, q, k, v, window, cotangent):
    o = fn(q, k, v, window=window, scale=0.25)
    grads = torch.autograd.grad(o, (q, k, v), cotangent)
    return o, grads


def backend_or_skip(name, device, dtype, spec_args):
    reason = ATTENTION.why_not(name, AttnSpec(device, dtype, 16, 16, *spec_args, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    return ATTENTION.get(name)


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("name", ATTENTION.names())
def test_backend_matches_reference_fp64_cpu(name, shape):
    H, G, Tq, Tk, window = SHAPES[shape]
    backend = backend_or_skip(name, "cpu", torch.float64, (H, G, window))
    q, k, v = make_qkv(H, G, Tq, Tk, torch.float64)
    cot = torch.randn(2, H, Tq, 16, dtype=torch.float64)
    o_ref, g_ref = run_with_grads(reference_attention, q, k, v, window, cot)
    o, g = run_with_grads(backend.fn, q, k, v, window, cot)
    torch.testing.assert_close(o, o_ref, atol=1e-12, rtol=1e-10)
    for got, want, what in zip(g, g_ref, "qkv", strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10, msg=f"d{what} differs")


@pytest.mark.parametrize("shape", ["mha-prefill", "gqa-window", "mqa-window-chunk"])
def test_cpu_flash_kernel_matches_math_kernel(shape):
    """torch ships two independent CPU kernels; the fused one must agree with MATH."""
    H, G, Tq, Tk, window = SHAPES[shape]
    q, k, v = make_qkv(H, G, Tq, Tk, torch.float64)
    cot = torch.randn(2, H, Tq, 16, dtype=torch.float64)
    sdpa = ATTENTION.get("sdpa").fn
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_flash, g_flash = run_with_grads(sdpa, q, k, v, window, cot)
        assert "Flash" in sdpa(q, k, v, window=window, scale=0.25).grad_fn.name()
    with sdpa_kernel(SDPBackend.MATH):
        o_math, g_math = run_with_grads(sdpa, q, k, v, window, cot)
    torch.testing.assert_close(o_flash, o_math, atol=1e-12, rtol=1e-10)
    for a, b in zip(g_flash, g_math, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_identity_values_expose_the_bottom_right_band(window):
    """With v = I the output is the attention pattern itself: check who sees whom."""
    Tq, Tk = 3, 6
    q = torch.zeros(1, 1, Tq, 4, dtype=torch.float64)  # equal scores: uniform over visible keys
    k = torch.zeros(1, 1, Tk, 4, dtype=torch.float64)
    v = torch.eye(Tk, dtype=torch.float64)[None, None]
    for name in ("reference", "sdpa"):
        pattern = ATTENTION.get(name).fn(q, k, v, window=window, scale=1.0)[0, 0]  # [Tq, Tk]
        for i in range(Tq):
            pos = Tk - Tq + i
            visible = [j for j in range(Tk) if j <= pos and (window is None or j > pos - window)]
            expected = torch.zeros(Tk, dtype=torch.float64)
            expected[visible] = 1 / len(visible)
            torch.testing.assert_close(pattern[i], expected, msg=f"{name}, query {i}")


def test_reference_gradcheck():
    q, k, v = make_qkv(2, 1, 4, 6, torch.float64, K=4)
    assert torch.autograd.gradcheck(
        lambda q, k, v: reference_attention(q, k, v, window=3, scale=0.5), (q, k, v))


def test_probs_are_row_stochastic_and_causal():
    q, k, _ = make_qkv(4, 2, 10, 10, torch.float64)
    p = attention_probs(q, k, window=None, scale=0.25)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 10, dtype=torch.float64))
    assert torch.all(p.triu(1) == 0)


def test_explicit_backend_that_cannot_serve_names_the_reason():
    spec = AttnSpec("cpu", torch.float32, 16, 16, 4, 4, None, True)
    with pytest.raises(RuntimeError, match="flash_attn"):
        ATTENTION.resolve("flash_attn", spec)
    with pytest.raises(ValueError, match="'nope'"):
        ATTENTION.resolve("nope", spec)
    assert ATTENTION.resolve("auto", spec).name == "sdpa"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("name", ATTENTION.names())
def test_backend_matches_reference_bf16_cuda(name, shape):
    H, G, Tq, Tk, window = SHAPES[shape]
    backend = backend_or_skip(name, "cuda", torch.bfloat16, (H, G, window))
    q, k, v = make_qkv(H, G, Tq, Tk, torch.bfloat16, device="cuda")
    cot = torch.randn(2, H, Tq, 16, device="cuda", dtype=torch.bfloat16)
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o_ref, g_ref = run_with_grads(reference_attention, *ref, window, cot.float())
    o, g = run_with_grads(backend.fn, q, k, v, window, cot)
    torch.testing.assert_close(o.float(), o_ref, atol=2e-2, rtol=2e-2)
    for got, want in zip(g, g_ref, strict=True):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
