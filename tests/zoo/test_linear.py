"""The linear-attention block: feature maps, paths against the quadratic reference, rank F.

The block contract (causality, decoding, caps, bad input and config) is checked on its
cases in tests/zoo/test_contract.py.
"""

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
def test_declared_caps_are_the_feature_dim(fmap):
    """Logits and mixing capped by F, a state of F x V per head (that the ranks stay within
    the caps is the contract's, tests/zoo/test_contract.py)."""
    block = make_block(fmap)
    c, T = block.config, 21
    declared = block.budget(seq_len=T)
    weights = block.weight_matrices()
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= c.k_dim <= declared.logits
    assert declared.logits == c.f_dim
    assert declared.value_path == 32
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)["state"]
    assert state.shape == (2, 4, c.f_dim, c.head_dim)
    assert declared.inference == min(c.f_dim, 8)
    assert declared.cache_elements == 4 * c.f_dim * (c.head_dim + 1) == cache.state[0].numel()


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
