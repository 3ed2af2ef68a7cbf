"""The Mamba-2 (SSD) block keeps the block contract: causal, cached, rebuildable, budgeted."""

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


def test_future_tokens_do_not_change_past_outputs():
    block = make_block()
    x = make_x()
    x2 = x.clone()
    x2[:, 9:] = torch.randn_like(x2[:, 9:])
    y, y2 = block(x), block(x2)
    torch.testing.assert_close(y[:, :9], y2[:, :9], atol=1e-12, rtol=0)
    assert not torch.allclose(y[:, 9:], y2[:, 9:])


def test_output_rebuilt_from_mixing_matrices_and_value_path():
    """y == readout(M @ values, x): readout adds D * x, gates with silu(z), norms, projects."""
    block = make_block(dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    M = block.mixing_matrices(x)  # [B, H, T, T]
    assert M.shape == (2, 4, 21, 21) and M.dtype == torch.float32
    assert torch.all(M.triu(1) == 0)
    y = block.readout(M @ block.value_heads(x), x)
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "chunked", "reference"])
def test_prefill_then_decode_equals_parallel_forward(backend):
    """The cache carries the conv state (last d_conv - 1 inputs) and the SSM state."""
    block = make_block(backend=backend)
    x = make_x(T=15)
    cache = block.init_cache(batch=2, max_len=15)
    pieces = [block(x[:, :5], cache=cache)]  # prefill
    pieces += [block(x[:, t:t + 1], cache=cache) for t in range(5, 15)]  # one token at a time
    assert block.backend == f"{'reference' if backend == 'auto' else backend}+reference"
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == 15


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


def test_declared_caps_hold_on_random_weights():
    block, T = make_block(), 21
    declared = block.budget(seq_len=T)
    weights = block.weight_matrices()
    assert weights["qk"].shape == (4, 16, 16)
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= declared.logits == 6
    assert weights["value"].shape == (16, 32)
    assert int(torch.linalg.matrix_rank(weights["value"])) <= declared.value_path == 16
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)["state"]
    assert state.shape == (2, 4, 8, 6)  # [B, H, P, N]
    assert int(torch.linalg.matrix_rank(state).max()) <= declared.inference == min(6, 8)
    assert declared.cache_elements == cache.ssm_state[0].numel() + cache.conv_state[0].numel()
    assert declared.params == sum(p.numel() for p in block.parameters())


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


@pytest.mark.parametrize("kwargs, message", [
    ({"d_state": 0}, r"d_state must be a positive int, got 0"),
    ({"n_heads": 3}, r"n_heads \(3\) must divide d_inner = expand \* d_model \(2 \* 16 = 32\)"),
    ({"n_groups": 3}, r"n_groups \(3\) must divide n_heads \(4\)"),
    ({"dt_min": 0.5, "dt_max": 0.1}, r"dt_min \(0.5\) must not exceed dt_max \(0.1\)"),
    ({"dt_min": -1.0}, r"dt_min must be a positive number, got -1.0"),
    ({"backend": "triton"}, r"unknown ssd backend 'triton'"),
    ({"conv_backend": "fft"}, r"unknown causal_conv backend 'fft'"),
    ({"d_sate": 8}, r"'d_sate'; did you mean 'd_state'"),
], ids=["zero-state", "heads-divide-inner", "groups-divide-heads", "dt-range", "negative-dt",
        "unknown-backend", "unknown-conv-backend", "unknown-key"])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build("ssm", **{"d_model": 16, "n_heads": 4, **kwargs})


@pytest.mark.parametrize("x, message", [
    (torch.randn(2, 12, 15, dtype=torch.float64), r"\[B, T, 16\], got \(2, 12, 15\)"),
    (torch.ones(2, 12, 16, dtype=torch.long), "floating-point x, got torch.int64"),
    (torch.randn(2, 0, 16, dtype=torch.float64), "at least one token"),
], ids=["width", "integer", "empty"])
def test_bad_input_names_shape_or_dtype(x, message):
    with pytest.raises(ValueError, match=message):
        make_block()(x)


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
