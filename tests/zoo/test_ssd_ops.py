"""The SSD scan and the causal conv: every backend against its reference, outputs and grads."""

import pytest
import torch

from zoo.ops.conv import CONV, ConvSpec
from zoo.ops.ssd import SSD, SSDSpec, reference_ssd, segsum, ssd_mixing_matrix

# (T, chunk_size, with an initial state)
CASES = {
    "chunk-multiple": (24, 8, False),
    "ragged-tail": (27, 8, False),
    "ragged-initial-state": (27, 8, True),
    "shorter-than-chunk": (5, 8, True),
    "one-token": (1, 8, True),
}
H, G, P, N = 4, 2, 3, 5


def make_inputs(T, initial, dtype=torch.float64, device="cpu", seed=0, decay=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, H, P, generator=g, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(2, T, H, generator=g, dtype=torch.float64))
    A = -decay * torch.exp(torch.randn(H, generator=g, dtype=torch.float64))
    B = torch.randn(2, T, G, N, generator=g, dtype=torch.float64)
    C = torch.randn(2, T, G, N, generator=g, dtype=torch.float64)
    s0 = torch.randn(2, H, P, N, generator=g, dtype=torch.float64) if initial else None
    tensors = [x, dt, A, B, C] + ([s0] if initial else [])
    tensors = [t.to(device=device, dtype=dtype).requires_grad_() for t in tensors]
    return tensors[:5], (tensors[5] if initial else None)


def run_with_grads(fn, inputs, s0, chunk_size, cot_y, cot_s):
    y, state = fn(*inputs, initial_state=s0, chunk_size=chunk_size)
    wrt = [*inputs] + ([s0] if s0 is not None else [])
    return y, state, torch.autograd.grad([y, state], wrt, [cot_y, cot_s])


def ssd_backend_or_skip(name, device, dtype):
    reason = SSD.why_not(name, SSDSpec(device, dtype, H, P, G, N, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    return SSD.get(name)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("name", SSD.names())
def test_ssd_backend_matches_recurrence_fp64(name, case):
    T, chunk, initial = CASES[case]
    backend = ssd_backend_or_skip(name, "cpu", torch.float64)
    inputs, s0 = make_inputs(T, initial)
    cot_y = torch.randn(2, T, H, P, dtype=torch.float64)
    cot_s = torch.randn(2, H, P, N, dtype=torch.float64)
    y_ref, s_ref, g_ref = run_with_grads(reference_ssd, inputs, s0, chunk, cot_y, cot_s)
    y, s, g = run_with_grads(backend.fn, inputs, s0, chunk, cot_y, cot_s)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s, s_ref, atol=1e-12, rtol=1e-10, msg="final state differs")
    for got, want, what in zip(g, g_ref, ["x", "dt", "A", "B", "C", "initial state"],
                               strict=False):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9, msg=f"d{what} differs")


def test_recurrence_equals_the_materialized_semiseparable_matrix():
    (x, dt, A, B, C), _ = make_inputs(19, False)
    M = ssd_mixing_matrix(dt, A, B, C)  # [B, H, T, T]
    assert torch.all(M.triu(1) == 0)
    y = torch.einsum("bhts,bshp->bthp", M, x)
    torch.testing.assert_close(y, reference_ssd(x, dt, A, B, C)[0], atol=1e-12, rtol=1e-10)


def test_segsum_is_the_sum_over_the_segment():
    a = torch.randn(3, 7, dtype=torch.float64)
    s = segsum(a)  # [3, 7, 7]
    for i in range(7):
        for j in range(7):
            want = a[:, j + 1:i + 1].sum(-1) if j <= i else torch.full((3,), float("-inf"))
            torch.testing.assert_close(s[:, i, j], want.to(torch.float64))


def test_chunked_is_stable_under_strong_decay():
    """exp(cumsum_i - cumsum_j) overflows here (cumsum ~ -1e4); the segment sum does not."""
    (x, dt, A, B, C), s0 = make_inputs(64, True, decay=300.0)
    y, s = SSD.get("chunked").fn(x, dt, A, B, C, initial_state=s0, chunk_size=32)
    y_ref, s_ref = reference_ssd(x, dt, A, B, C, initial_state=s0)
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
    grads = torch.autograd.grad(y.sum() + s.sum(), [x, dt, A, B, C, s0])
    assert all(torch.isfinite(g_).all() for g_ in grads)


def test_chunked_gradcheck():
    (x, dt, A, B, C), s0 = make_inputs(5, True)
    chunked = SSD.get("chunked").fn
    assert torch.autograd.gradcheck(
        lambda *t: chunked(*t[:5], initial_state=t[5], chunk_size=2), (x, dt, A, B, C, s0),
        fast_mode=True)


# ---------------------------------------------------------------- causal conv

def make_conv(T, W=4, Cc=6, initial=False, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, Cc, T, generator=g, dtype=torch.float64)
    w = torch.randn(Cc, W, generator=g, dtype=torch.float64)
    b = torch.randn(Cc, generator=g, dtype=torch.float64)
    s0 = torch.randn(2, Cc, W - 1, generator=g, dtype=torch.float64) if initial else None
    tensors = [t.to(device=device, dtype=dtype).requires_grad_() for t in (x, w, b)]
    if initial:
        s0 = s0.to(device=device, dtype=dtype).requires_grad_()
    return tensors, s0


@pytest.mark.parametrize("activation", [None, "silu"], ids=["linear", "silu"])
@pytest.mark.parametrize("case", ["T=9", "T=9-initial-state", "T=2-initial-state"])
@pytest.mark.parametrize("name", CONV.names())
def test_conv_backend_matches_reference_fp64(name, case, activation):
    reason = CONV.why_not(name, ConvSpec("cpu", torch.float64, 4, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    T = int(case.split("-")[0][2:])
    (x, w, b), s0 = make_conv(T, initial="initial" in case)
    wrt = [x, w, b] + ([s0] if s0 is not None else [])
    cot_y, cot_s = torch.randn(2, 6, T, dtype=torch.float64), torch.randn(2, 6, 3,
                                                                         dtype=torch.float64)
    results = []
    for fn in (CONV.get("reference").fn, CONV.get(name).fn):
        y, s = fn(x, w, b, initial_state=s0, activation=activation)
        results.append((y, s, torch.autograd.grad([y, s], wrt, [cot_y, cot_s])))
    (y_ref, s_ref, g_ref), (y, s, g) = results
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    for got, want in zip(g, g_ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_conv_continues_from_its_state_and_is_causal():
    (x, w, b), _ = make_conv(11)
    conv = CONV.get("conv1d").fn
    y, s = conv(x, w, b, activation="silu")
    y1, s1 = conv(x[..., :4], w, b, activation="silu")
    y2, s2 = conv(x[..., 4:], w, b, initial_state=s1, activation="silu")
    torch.testing.assert_close(torch.cat([y1, y2], -1), y, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s2, s)
    torch.testing.assert_close(s, x[..., -3:])


def test_explicit_cuda_backends_name_the_reason_on_cpu():
    with pytest.raises(RuntimeError, match="mamba_ssm"):
        SSD.resolve("mamba_ssm", SSDSpec("cpu", torch.float32, H, P, G, N, True))
    with pytest.raises(RuntimeError, match="causal_conv1d"):
        CONV.resolve("causal_conv1d", ConvSpec("cpu", torch.float32, 4, True))
    assert SSD.resolve("auto", SSDSpec("cpu", torch.float32, H, P, G, N, True)).name == "chunked"
    assert CONV.resolve("auto", ConvSpec("cpu", torch.float32, 4, True)).name == "conv1d"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", [n for n in SSD.names() if n != "reference"])
def test_ssd_backend_matches_reference_cuda(name, dtype, rel_err):
    backend = ssd_backend_or_skip(name, "cuda", dtype)
    T = 200
    inputs, s0 = make_inputs(T, True, dtype=dtype, device="cuda")
    inputs[2] = inputs[2].detach().float().requires_grad_()  # A stays fp32
    s0 = s0.detach().float().requires_grad_()
    cot_y = torch.randn(2, T, H, P, device="cuda")
    cot_s = torch.randn(2, H, P, N, device="cuda")
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    s0_ref = s0.detach().double().requires_grad_()
    y_ref, s_ref, g_ref = run_with_grads(SSD.get("chunked").fn, ref_in, s0_ref, 64,
                                         cot_y.double(), cot_s.double())
    y, s, g = run_with_grads(backend.fn, inputs, s0, 64, cot_y.to(dtype), cot_s)
    tol = 5e-3 if dtype == torch.float32 else 3e-2
    for got, want, what in zip([y, s, *g], [y_ref, s_ref, *g_ref],
                               ["y", "state", "dx", "ddt", "dA", "dB", "dC", "dstate"],
                               strict=True):
        assert rel_err(got, want) < tol, f"{name} {what}: relative error {rel_err(got, want)}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name", [n for n in CONV.names() if n != "reference"])
def test_conv_backend_matches_reference_cuda(name, initial, rel_err):
    reason = CONV.why_not(name, ConvSpec("cuda", torch.float32, 4, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    (x, w, b), s0 = make_conv(300, Cc=64, initial=initial, dtype=torch.float32, device="cuda")
    y_ref, s_ref = CONV.get("reference").fn(x, w, b, initial_state=s0, activation="silu")
    y, s = CONV.get(name).fn(x, w, b, initial_state=s0, activation="silu")
    assert rel_err(y, y_ref.double()) < 1e-5 and rel_err(s, s_ref.double()) < 1e-6
    wrt = [x, w, b] + ([s0] if initial else [])
    for got, want in zip(torch.autograd.grad(y.square().sum(), wrt),
                         torch.autograd.grad(y_ref.square().sum(), wrt), strict=True):
        assert rel_err(got, want.double()) < 1e-4
