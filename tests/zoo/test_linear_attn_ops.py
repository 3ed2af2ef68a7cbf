"""Every linear-attention backend against the quadratic reference: outputs, states, grads."""

import pytest
import torch

from zoo.ops.linear_attn import (
    LINEAR_ATTN,
    LinearAttnSpec,
    linear_attn_matrix,
    reference_linear_attn,
)

# (T, chunk_size, with an initial state)
CASES = {
    "chunk-multiple": (24, 8, False),
    "ragged-tail": (27, 8, False),
    "ragged-initial-state": (27, 8, True),
    "shorter-than-chunk": (5, 8, True),
    "one-token": (1, 8, True),
}


def make_inputs(T, initial, dtype=torch.float64, device="cpu", F=5, V=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(2, 3, T, F, generator=g, dtype=torch.float64)  # positive, like phi(q)
    k = torch.rand(2, 3, T, F, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, T, V, generator=g, dtype=torch.float64)
    s0 = torch.randn(2, 3, F, V, generator=g, dtype=torch.float64) if initial else None
    tensors = [q, k, v] + ([s0] if initial else [])
    tensors = [t.to(device=device, dtype=dtype).requires_grad_() for t in tensors]
    return tensors[:3], (tensors[3] if initial else None)


def run_with_grads(fn, qkv, s0, chunk_size, cot_o, cot_s):
    o, state = fn(*qkv, initial_state=s0, chunk_size=chunk_size)
    inputs = [*qkv] + ([s0] if s0 is not None else [])
    grads = torch.autograd.grad([o, state], inputs, [cot_o, cot_s])
    return o, state, grads


def backend_or_skip(name, device, dtype):
    reason = LINEAR_ATTN.why_not(name, LinearAttnSpec(device, dtype, 5, 3, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    return LINEAR_ATTN.get(name)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("name", LINEAR_ATTN.names())
def test_backend_matches_reference_fp64(name, case):
    T, chunk, initial = CASES[case]
    backend = backend_or_skip(name, "cpu", torch.float64)
    qkv, s0 = make_inputs(T, initial)
    cot_o, cot_s = torch.randn(2, 3, T, 3, dtype=torch.float64), torch.randn(2, 3, 5, 3,
                                                                          dtype=torch.float64)
    o_ref, s_ref, g_ref = run_with_grads(reference_linear_attn, qkv, s0, chunk, cot_o, cot_s)
    o, s, g = run_with_grads(backend.fn, qkv, s0, chunk, cot_o, cot_s)
    torch.testing.assert_close(o, o_ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s, s_ref, atol=1e-12, rtol=1e-10, msg="final state differs")
    for got, want, what in zip(g, g_ref, ["q", "k", "v", "initial state"], strict=False):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10, msg=f"d{what} differs")


def test_chunks_continue_from_the_state():
    """Two calls, the second starting from the first's state, equal one call."""
    (q, k, v), _ = make_inputs(27, False)
    chunked = LINEAR_ATTN.get("chunked").fn
    o1, s1 = chunked(q[:, :, :10], k[:, :, :10], v[:, :, :10], chunk_size=4)
    o2, s2 = chunked(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], initial_state=s1, chunk_size=4)
    o, s = chunked(q, k, v, chunk_size=4)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s2, s, atol=1e-12, rtol=1e-10)


def test_kernel_matrix_is_the_causal_masked_product():
    (q, k, v), _ = make_inputs(9, False)
    A = linear_attn_matrix(q, k)  # [B, H, T, T]
    assert torch.all(A.triu(1) == 0)
    torch.testing.assert_close(A[0, 1, 6, 2], q[0, 1, 6] @ k[0, 1, 2])
    torch.testing.assert_close(reference_linear_attn(q, k, v)[0], A @ v)


def test_chunked_gradcheck():
    (q, k, v), s0 = make_inputs(5, True, F=2, V=2)
    chunked = LINEAR_ATTN.get("chunked").fn
    assert torch.autograd.gradcheck(
        lambda q, k, v, s0: chunked(q, k, v, initial_state=s0, chunk_size=3), (q, k, v, s0),
        fast_mode=True)


def test_auto_picks_chunked_on_cpu_and_explicit_fla_names_the_reason():
    spec = LinearAttnSpec("cpu", torch.float32, 16, 17, True)
    assert LINEAR_ATTN.resolve("auto", spec).name == "chunked"
    with pytest.raises(RuntimeError, match="fla"):
        LINEAR_ATTN.resolve("fla", spec)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dims", [(16, 17), (153, 16)], ids=["F=16-V=17", "taylor-F=153-V=16"])
@pytest.mark.parametrize("case", ["ragged-tail", "ragged-initial-state"])
@pytest.mark.parametrize("name", [n for n in LINEAR_ATTN.names() if n != "reference"])
def test_backend_matches_reference_cuda(name, case, dims, dtype):
    T, chunk, initial = CASES[case]
    T, (F, V) = T * 10, dims  # several of fla's 64-token chunks, and a ragged tail
    backend = backend_or_skip(name, "cuda", dtype)
    qkv, s0 = make_inputs(T, initial, dtype=dtype, device="cuda", F=F, V=V)
    qkv[0] = (qkv[0].detach() / F).requires_grad_()  # keep q . k of order 1
    if s0 is not None:
        s0 = s0.detach().float().requires_grad_()  # states stay fp32
    cot_o = torch.randn(2, 3, T, V, device="cuda")
    cot_s = torch.randn(2, 3, F, V, device="cuda")
    ref_in = [t.detach().double().requires_grad_() for t in qkv]
    s0_ref = None if s0 is None else s0.detach().double().requires_grad_()
    o_ref, s_ref, g_ref = run_with_grads(reference_linear_attn, ref_in, s0_ref, chunk,
                                         cot_o.double(), cot_s.double())
    o, s, g = run_with_grads(backend.fn, qkv, s0, chunk, cot_o.to(dtype), cot_s)
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # TF32 / bf16 inputs, relative Frobenius
    for got, want, what in zip([o, s, *g], [o_ref, s_ref, *g_ref],
                               ["o", "state", "dq", "dk", "dv", "dstate"], strict=False):
        err = (got.double() - want).norm() / want.norm()
        assert err < tol, f"{name} {what}: relative error {err:.2e} >= {tol}"
