"""The linear-attention block keeps the block contract: causal, cached, rebuildable, budgeted."""

import pytest
import torch

import budgets
import zoo

# feature map -> extra config
MAPS = {
    "elu+1": {"feature_map": "elu+1"},
    "relu": {"feature_map": "relu"},
    "identity": {"feature_map": "identity", "normalize": False},
    "taylor": {"feature_map": "taylor", "feature_dim": 3},
    "elu+1-unnormalized": {"feature_map": "elu+1", "normalize": False},
}


def make_block(fmap="elu+1", dtype=torch.float64, backend="auto", seed=0, **kw):
    torch.manual_seed(seed)
    block = zoo.build("linear", d_model=32, n_heads=4, backend=backend, chunk_size=8,
                      **{**MAPS[fmap], **kw})
    return block.to(dtype)


def make_x(B=2, T=21, D=32, dtype=torch.float64, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("backend", ["chunked", "recurrent"])
@pytest.mark.parametrize("fmap", list(MAPS))
def test_block_paths_match_the_quadratic_reference(fmap, backend):
    """T = 21 is not a multiple of the chunk (8): outputs and all gradients agree in fp64."""
    fast = make_block(fmap, backend=backend)
    ref = make_block(fmap, backend="reference")
    x = make_x().requires_grad_()
    cot = torch.randn(2, 21, 32, dtype=torch.float64)
    y_f, y_r = fast(x), ref(x)
    assert (fast.backend, ref.backend) == (backend, "reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-12, rtol=1e-10)
    grads_f = torch.autograd.grad(y_f, [x, *fast.parameters()], cot)
    grads_r = torch.autograd.grad(y_r, [x, *ref.parameters()], cot)
    for a, b in zip(grads_f, grads_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_future_tokens_do_not_change_past_outputs():
    block = make_block()
    x = make_x()
    x2 = x.clone()
    x2[:, 9:] = torch.randn_like(x2[:, 9:])
    y, y2 = block(x), block(x2)
    torch.testing.assert_close(y[:, :9], y2[:, :9], atol=1e-12, rtol=0)
    assert not torch.allclose(y[:, 9:], y2[:, 9:])


@pytest.mark.parametrize("fmap", list(MAPS))
def test_output_rebuilt_from_mixing_matrices_and_value_path(fmap):
    block = make_block(fmap, dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    M = block.mixing_matrices(x)  # [B, H, T, T]
    assert M.shape == (2, 4, 21, 21) and M.dtype == torch.float32
    assert torch.all(M.triu(1) == 0)
    if block.config.normalize:  # rows sum to 1 (less where relu zeroes nearly every feature)
        sums = M.sum(-1)
        assert torch.all(sums <= 1 + 1e-5) and float(sums.median()) == pytest.approx(1, abs=1e-5)
    y = block.readout(M @ block.value_heads(x))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "chunked", "reference"])
@pytest.mark.parametrize("fmap", ["elu+1", "taylor", "identity"])
def test_prefill_then_decode_equals_parallel_forward(fmap, backend):
    block = make_block(fmap, backend=backend)
    x = make_x(T=15)
    cache = block.init_cache(batch=2, max_len=15)
    pieces = [block(x[:, :5], cache=cache)]  # prefill
    pieces += [block(x[:, t:t + 1], cache=cache) for t in range(5, 15)]  # one token at a time
    assert block.backend == ("recurrent" if backend == "auto" else backend)
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == 15


@pytest.mark.parametrize("fmap, F", [("elu+1", 4), ("taylor", 1 + 2 + 3)],
                         ids=["elu+1-F=4", "taylor-K=2-F=6"])
def test_past_future_block_has_rank_at_most_F(fmap, F):
    """The semiseparable property: M[T/2:, :T/2] = D^-1 phi(Q_future) phi(K_past)^T."""
    T = 64
    block = make_block(fmap, dtype=torch.float32, feature_dim=4 if fmap == "elu+1" else 2)
    assert block.config.f_dim == F and block.budget(T).mixing == F
    M = block.mixing_matrices(make_x(T=T, dtype=torch.float32))
    rank = budgets.rank_metrics(M[..., T // 2:, :T // 2])["numerical_rank"]  # [B, H]
    assert int(rank.max()) <= F
    assert int(rank.min()) >= 2  # not trivially low: the cap is what binds


def test_taylor_map_is_the_second_order_expansion_of_exp():
    block = make_block("taylor", feature_dim=5)
    q, k = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    u = (q * k).sum(-1) / 5 ** 0.5
    got = (block.feature_map(q) * block.feature_map(k)).sum(-1)
    torch.testing.assert_close(got, 1 + u + u ** 2 / 2)
    assert block.feature_map(q).shape[-1] == block.config.f_dim == 1 + 5 + 15


@pytest.mark.parametrize("fmap", ["elu+1", "taylor"])
def test_declared_caps_hold_on_random_weights(fmap):
    block = make_block(fmap)
    c, T = block.config, 21
    declared = block.budget(seq_len=T)
    weights = block.weight_matrices()
    assert weights["qk"].shape == (4, 32, 32)
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= c.k_dim <= declared.logits
    assert declared.logits == c.f_dim
    assert int(torch.linalg.matrix_rank(weights["value"])) <= declared.value_path == 32
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)["state"]
    assert state.shape == (2, 4, c.f_dim, c.head_dim)
    assert int(torch.linalg.matrix_rank(state).max()) <= declared.inference == min(c.f_dim, 8)
    assert declared.cache_elements == 4 * c.f_dim * (c.head_dim + 1) == cache.state[0].numel()
    assert declared.params == sum(p.numel() for p in block.parameters())


def test_probe_reads_the_block():
    """budgets' probe measures every quantity the block offers, each within its cap."""
    block = make_block(dtype=torch.float32, feature_dim=4)
    x = make_x(T=32, dtype=torch.float32)
    layer = budgets.probe_model(torch.nn.Sequential(block), x)["layers"][0]
    q = layer["quantities"]
    assert {"past_future", "qk", "value", "inference.state"} <= set(q)
    assert max(q["past_future"]["numerical_rank"]) <= layer["budget"]["mixing"] == 4
    assert max(q["inference.state"]["numerical_rank"]) <= layer["budget"]["inference"]


def test_training_path_never_allocates_a_T_by_T_tensor(quadratic_allocations):
    T = 256  # every width of the block is below T, so two dims >= T can only be T x T
    block = make_block(dtype=torch.float32)
    x = make_x(B=1, T=T, dtype=torch.float32).requires_grad_()
    quadratic = quadratic_allocations(block, x)
    assert block.backend == "chunked"
    assert not quadratic, f"T x T tensors on the training path: {quadratic[:3]}"


@pytest.mark.parametrize("kwargs, message", [
    ({"feature_map": "gelu"}, r"feature_map 'gelu' unknown; known: \['elu\+1', 'relu'"),
    ({"feature_dim": 0}, r"feature_dim must be a positive int, got 0"),
    ({"feature_map": "identity"}, r"normalize=True needs a positive feature map"),
    ({"eps": 0.0}, r"eps must be positive, got 0.0"),
    ({"chunk_size": -4}, r"chunk_size must be a positive int, got -4"),
    ({"n_heads": 5}, r"n_heads \(5\) must divide d_model \(32\)"),
    ({"backend": "triton"}, r"unknown linear_attn backend 'triton'"),
    ({"feature_mapp": "relu"}, r"'feature_mapp'; did you mean 'feature_map'"),
], ids=["unknown-map", "zero-feature-dim", "identity-normalized", "zero-eps", "negative-chunk",
        "heads-divide-width", "unknown-backend", "unknown-key"])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build("linear", **{"d_model": 32, "n_heads": 4, **kwargs})


@pytest.mark.parametrize("x, message", [
    (torch.randn(2, 12, 31, dtype=torch.float64), r"\[B, T, 32\], got \(2, 12, 31\)"),
    (torch.ones(2, 12, 32, dtype=torch.long), "floating-point x, got torch.int64"),
    (torch.randn(2, 12, 32, dtype=torch.float32), "x is torch.float32 but the weights are"),
], ids=["width", "integer", "dtype-mismatch"])
def test_bad_input_names_shape_or_dtype(x, message):
    with pytest.raises(ValueError, match=message):
        make_block()(x)


def test_cache_of_another_configuration_is_refused():
    cache = make_block("elu+1-unnormalized").init_cache(2, 8)
    with pytest.raises(ValueError, match=r"linear cache holds a state of shape \(2, 4, 8, 8\)"):
        make_block()(make_x(T=3), cache=cache)


def test_explicit_cuda_backend_on_cpu_raises_with_reason():
    with pytest.raises(RuntimeError, match="linear_attn backend 'fla' cannot serve"):
        make_block(backend="fla")(make_x())


def test_variants_build_and_registry_lists_linear():
    assert "linear" in zoo.names()
    labels = []
    for label, kwargs in zoo.block_class("linear").variants(d_model=64, n_heads=4):
        block = zoo.build("linear", d_model=64, n_heads=4, **kwargs)
        assert block.budget(8).n_heads == 4, label
        labels.append(label)
    assert labels == ["linear (elu+1)", "linear (Taylor, K=16)"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmap", ["elu+1", "taylor"])
def test_block_on_cuda_under_bf16_autocast_matches_the_reference(fmap, rel_err):
    """`auto` on CUDA: fla when installed, else the chunked torch path; bf16 vs fp32."""
    block = make_block(fmap, dtype=torch.float32).cuda()
    ref = make_block(fmap, dtype=torch.float32, backend="reference").cuda()
    x = make_x(T=300, dtype=torch.float32).cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(x)
    y_ref = ref(x)
    assert block.backend in ("fla", "chunked")
    assert rel_err(y, y_ref) < 3e-2, block.backend
    (g,) = torch.autograd.grad(y.float().square().sum(), x)
    (g_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    assert rel_err(g, g_ref) < 5e-2, block.backend
