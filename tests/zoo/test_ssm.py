"""The Mamba-2 (SSD) block: the chunked scan against the recurrence, rank N, its init.

The block contract (causality, decoding, caps, bad input and config) is checked on its
cases in tests/zoo/test_contract.py.
"""

import pytest
import torch

import budgets
import zoo

# d_model 16, expand 2: d_inner 32, 4 heads of P = 8; B and C in 2 groups of N = 6
CONFIG = {"d_model": 16, "n_heads": 4, "d_state": 6, "n_groups": 2, "chunk_size": 8}


def make_block(dtype=torch.float64, backend="auto", seed=0, **kw):
    torch.manual_seed(seed)
    block = zoo.build("ssm", **{**CONFIG, "backend": backend, **kw})
    with torch.no_grad():  # nonzero skip and norm weights, so the test sees them used
        block.D.uniform_(0.5, 1.5)
        block.norm_weight.uniform_(0.5, 1.5)
    return block.to(dtype)


def make_x(B=2, T=21, D=16, dtype=torch.float64, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("conv_backend", ["conv1d", "reference"])
def test_chunked_block_matches_the_recurrence(conv_backend):
    """T = 21 is not a multiple of the chunk (8): outputs and all gradients agree in fp64."""
    fast = make_block(backend="chunked", conv_backend=conv_backend)
    ref = make_block(backend="reference", conv_backend="reference")
    x = make_x().requires_grad_()
    cot = torch.randn(2, 21, 16, dtype=torch.float64)
    y_f, y_r = fast(x), ref(x)
    assert (fast.backend, ref.backend) == (f"chunked+{conv_backend}", "reference+reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-12, rtol=1e-10)
    grads_f = torch.autograd.grad(y_f, [x, *fast.parameters()], cot)
    grads_r = torch.autograd.grad(y_r, [x, *ref.parameters()], cot)
    names = ["x", *(n for n, _ in fast.named_parameters())]
    for a, b, name in zip(grads_f, grads_r, names, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{name} differs")


def test_output_rebuilt_from_mixing_matrices_and_value_path():
    """y == readout(M @ values, x): readout adds D * x, gates with silu(z), norms, projects."""
    block = make_block(dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    M = block.mixing_matrices(x)  # [B, H, T, T]
    assert M.shape == (2, 4, 21, 21) and M.dtype == torch.float32
    assert torch.all(M.triu(1) == 0)
    y = block.readout(M @ block.value_heads(x), x)
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-4)


def test_decode_from_a_short_prefill_uses_the_zero_padded_conv_state():
    """A prefill shorter than the conv (2 < d_conv - 1 = 3 tokens) still decodes exactly."""
    block = make_block()
    x = make_x(T=6)
    cache = block.init_cache(batch=2, max_len=6)
    pieces = [block(x[:, :2], cache=cache)]
    pieces += [block(x[:, t:t + 1], cache=cache) for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("d_state", [3, 6])
def test_past_future_block_has_rank_at_most_N(d_state):
    """The semiseparable property: M[T/2:, :T/2] factors through the N-dim state."""
    T = 64
    block = make_block(dtype=torch.float32, d_state=d_state, dt_min=0.01, dt_max=0.05,
                       a_init_max=2.0)  # slow decay: the past block is not numerically zero
    assert block.budget(T).mixing == d_state
    M = block.mixing_matrices(make_x(T=T, dtype=torch.float32))
    rank = budgets.rank_metrics(M[..., T // 2:, :T // 2])["numerical_rank"]  # [B, H]
    assert int(rank.max()) <= d_state
    assert int(rank.min()) >= 2  # not trivially low: the cap is what binds


def test_declared_caps_are_the_state_size():
    """Logits N, value path min(D, d_inner), a state of P x N per head plus the conv's
    inputs (that the ranks stay within the caps is the contract's,
    tests/zoo/test_contract.py)."""
    block, T = make_block(), 21
    declared = block.budget(seq_len=T)
    assert block.weight_matrices()["value"].shape == (16, 32)
    assert declared.logits == 6
    assert declared.value_path == 16
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)["state"]
    assert state.shape == (2, 4, 8, 6)  # [B, H, P, N]
    assert declared.inference == min(6, 8)
    assert declared.cache_elements == cache.ssm_state[0].numel() + cache.conv_state[0].numel()


def test_probe_reads_the_block():
    block = make_block(dtype=torch.float32)
    x = make_x(T=32, dtype=torch.float32)
    layer = budgets.probe_model(torch.nn.Sequential(block), x)["layers"][0]
    q = layer["quantities"]
    assert {"past_future", "qk", "value", "inference.state"} <= set(q)
    assert max(q["past_future"]["numerical_rank"]) <= layer["budget"]["mixing"] == 6
    assert max(q["qk"]["numerical_rank"]) <= layer["budget"]["logits"]
    assert max(q["inference.state"]["numerical_rank"]) <= layer["budget"]["inference"]


def test_training_path_never_allocates_a_T_by_T_tensor(quadratic_allocations):
    T = 256  # every width of the block is below T, so two dims >= T can only be T x T
    block = make_block(dtype=torch.float32, chunk_size=32)
    x = make_x(B=1, T=T, dtype=torch.float32).requires_grad_()
    quadratic = quadratic_allocations(block, x)
    assert block.backend == "chunked+conv1d"
    assert not quadratic, f"T x T tensors on the training path: {quadratic[:3]}"


def test_initialization_follows_mamba2():
    block = zoo.build("ssm", d_model=16, n_heads=4)
    dt = torch.nn.functional.softplus(block.dt_bias)
    assert torch.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001))
    A = -torch.exp(block.A_log)
    assert torch.all((A <= -1.0) & (A >= -16.0))
    assert torch.all(block.D == 1)


def test_cache_of_another_configuration_is_refused():
    cache = make_block(d_state=4).init_cache(2, 8)
    with pytest.raises(ValueError, match=r"ssm cache holds a state of shape \(2, 4, 8, 4\)"):
        make_block()(make_x(T=3), cache=cache)


@pytest.mark.parametrize("kwargs, name", [({"backend": "mamba_ssm"}, "ssd backend 'mamba_ssm'"),
                                          ({"conv_backend": "causal_conv1d"},
                                           "causal_conv backend 'causal_conv1d'")],
                         ids=["mamba_ssm", "causal_conv1d"])
def test_explicit_cuda_backend_on_cpu_raises_with_reason(kwargs, name):
    with pytest.raises(RuntimeError, match=f"{name} cannot serve"):
        make_block(**kwargs)(make_x())


def test_variants_build_and_registry_lists_ssm():
    assert "ssm" in zoo.names()
    for label, kwargs in zoo.block_class("ssm").variants(d_model=64, n_heads=4):
        block = zoo.build("ssm", d_model=64, n_heads=4, **kwargs)
        assert block.budget(128).mixing == kwargs["d_state"], label


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_block_on_cuda_under_bf16_autocast_matches_fp32(rel_err):
    """`auto` on CUDA: mamba-ssm and causal-conv1d when installed, else the torch paths."""
    block = make_block(dtype=torch.float32).cuda()
    ref = make_block(dtype=torch.float32, backend="chunked", conv_backend="conv1d").cuda()
    x = make_x(T=300, dtype=torch.float32).cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(x)
    y_ref = ref(x)
    assert rel_err(y, y_ref) < 3e-2, block.backend
    (g,) = torch.autograd.grad(y.float().square().sum(), x)
    (g_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    assert rel_err(g, g_ref) < 5e-2, block.backend
    cache = block.init_cache(2, 300)
    with torch.no_grad():
        steps = [block(x[:, :290], cache=cache)]
        steps += [block(x[:, t:t + 1], cache=cache) for t in range(290, 300)]
        torch.testing.assert_close(torch.cat(steps, 1), y_ref, atol=1e-3, rtol=1e-3)
