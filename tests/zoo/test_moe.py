"""MoE-routed attention (MoA): top-k of E heads per token, fused cost growing with k, not E."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import zoo
from zoo.ops.attention import ATTENTION, AttnSpec

FUSED = [name for name in ATTENTION.names() if name != "reference"]
DEVICE_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_block(n_heads=4, top_k=2, dtype=torch.float64, backend="auto", seed=0, device="cpu",
               **kw):
    torch.manual_seed(seed)
    block = zoo.build("moe", d_model=32, n_heads=n_heads, top_k=top_k, backend=backend, **kw)
    return block.to(device=device, dtype=dtype)


def make_x(B=2, T=12, D=32, dtype=torch.float64, seed=1, device="cpu"):
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("name", ["reference", *FUSED])
def test_fused_path_matches_dense_reference_outputs_and_grads(name, top_k):
    reason = ATTENTION.why_not(name, AttnSpec("cpu", torch.float64, 8, 8, top_k, 1, None, True))
    if reason:
        pytest.skip(f"{name}: {reason}")
    block = make_block(top_k=top_k, backend=name)
    x = make_x().requires_grad_()
    cot = torch.randn(2, 12, 32, dtype=torch.float64)
    y_fused, y_dense = block(x), block.dense_forward(x)
    assert block.backend == name
    torch.testing.assert_close(y_fused, y_dense, atol=1e-12, rtol=1e-10)
    params = [x, *block.parameters()]
    g_fused = torch.autograd.grad(y_fused, params, cot)
    g_dense = torch.autograd.grad(y_dense, params, cot)
    for (pname, _), a, b in zip([("x", x), *block.named_parameters()], g_fused, g_dense,
                                strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{pname} differs")
    assert g_fused[1].abs().sum() > 0  # the router learns from the main loss, even at k = 1


@pytest.mark.parametrize("top_k", [1, 3])
def test_each_token_uses_exactly_k_heads(top_k):
    block = make_block(n_heads=6, top_k=top_k, head_dim=8)
    x = make_x()
    experts, gates = block.routing(x)  # [B, T, k]
    assert experts.shape == gates.shape == (2, 12, top_k)
    for row in experts.reshape(-1, top_k).tolist():
        assert len(set(row)) == top_k
    assert torch.all(gates[..., :-1] >= gates[..., 1:])  # largest first
    y = block(x)
    b, t = 1, 7
    chosen = set(experts[b, t].tolist())
    with torch.no_grad():  # heads the token did not choose cannot change its output ...
        for e in set(range(6)) - chosen:
            block.q_experts[e].normal_()
            block.o_experts[e].normal_()
        torch.testing.assert_close(block(x)[b, t], y[b, t], atol=1e-12, rtol=0)
        block.o_experts[min(chosen)].normal_()  # ... and each chosen head does
        assert not torch.allclose(block(x)[b, t], y[b, t])


def test_aux_loss_is_finite_has_gradients_and_is_the_switch_balance():
    block = make_block(n_heads=4, top_k=2, aux_loss_weight=0.1)
    x = make_x()
    block(x)
    aux = block.aux_loss
    assert aux.dim() == 0 and torch.isfinite(aux) and aux.requires_grad
    (grad,) = torch.autograd.grad(aux, block.router.weight)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    probs = torch.softmax(x @ block.router.weight.T, -1)  # [B, T, E]
    experts = probs.topk(2, -1).indices
    share = torch.stack([(experts == e).double().mean() for e in range(4)])  # f_e
    expected = 4 * (share * probs.mean((0, 1))).sum()
    torch.testing.assert_close(block.balance.double(), expected)
    torch.testing.assert_close(aux, 0.1 * block.balance)


def test_aux_loss_reads_one_at_perfect_balance():
    block = make_block(n_heads=4, top_k=1, aux_loss_weight=1.0)
    with torch.no_grad():
        block.router.weight.zero_()
        block.router.weight[torch.arange(4), torch.arange(4)] = 50.0  # token i -> head i
    x = torch.zeros(1, 4, 32, dtype=torch.float64)
    x[0, torch.arange(4), torch.arange(4)] = 1.0
    block(x)
    torch.testing.assert_close(block.aux_loss.item(), 1.0, atol=1e-6, rtol=0)


def test_routing_is_deterministic_for_a_fixed_seed():
    x = make_x()
    a, b, c = make_block(seed=3), make_block(seed=3), make_block(seed=4)
    assert torch.equal(a.routing(x)[0], b.routing(x)[0])
    assert torch.equal(a(x), b(x))
    assert not torch.equal(a.routing(x)[0], c.routing(x)[0])


def fused_flops(n_heads, top_k, T=32):
    block = make_block(n_heads=n_heads, top_k=top_k, head_dim=8, backend="reference",
                       dtype=torch.float32)
    x = make_x(T=T, dtype=torch.float32)
    with FlopCounterMode(display=False) as counter:
        block(x)
    return counter.get_total_flops()


def test_fused_cost_grows_with_k_not_with_e():
    B, T, D = 2, 32, 32
    router = {E: 2 * B * T * D * E for E in (4, 16)}  # the router's D x E is the only E term
    assert fused_flops(16, 2) - fused_flops(4, 2) == router[16] - router[4]
    flops = {k: fused_flops(8, k) for k in (1, 2, 4)}
    assert flops[1] < flops[2] < flops[4]
    per_head = flops[2] - flops[1]
    assert flops[4] - flops[2] == 2 * per_head  # linear in k


@pytest.mark.parametrize("top_k", [1, 3])
def test_output_rebuilt_from_mixing_matrices_routing_and_value_path(top_k):
    block = make_block(n_heads=4, top_k=top_k, dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    P = block.mixing_matrices(x)  # [B, k, T, T]
    assert P.shape == (2, top_k, 12, 12) and P.dtype == torch.float32
    torch.testing.assert_close(P.sum(-1), torch.ones(2, top_k, 12))
    assert torch.all(P.triu(1) == 0)
    experts, gates = block.routing(x)  # [B, T, k]
    o = P @ block.value_heads(x)  # [B, k, T, V]
    w_o = block.o_experts[experts]  # [B, T, k, D, V]
    y = torch.einsum("btk,btkdv,bktv->btd", gates, w_o, o)
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


def test_declared_caps_are_those_of_k_heads_over_one_kv_head():
    """k query heads over the one shared key/value head (that the ranks stay within the
    caps is the contract's, tests/zoo/test_contract.py)."""
    block = make_block(n_heads=4, top_k=2)
    T, K = 12, 8
    declared = block.budget(T)
    assert (declared.n_heads, declared.logits, declared.value_path) == (2, K, K)
    assert declared.cache_elements == 2 * T * K
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)
    assert state["k"].shape == state["v"].shape == (2, T, K)


def test_variants_build_and_registry_lists_the_block():
    assert "moe" in zoo.names()
    for label, kwargs in zoo.block_class("moe").variants(d_model=32, n_heads=4):
        block = zoo.build("moe", d_model=32, n_heads=4, **kwargs)
        assert block.budget(64).n_heads == kwargs["top_k"], label


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("backend", ["auto", "sdpa", "flex"])
def test_cuda_fused_path_matches_dense_reference(backend):
    torch.manual_seed(0)
    block = zoo.build("moe", d_model=128, n_heads=8, top_k=2, head_dim=32,
                      backend=backend).to("cuda")
    x = make_x(T=64, D=128, dtype=torch.float32, device="cuda").requires_grad_()
    y_f, y_d = block(x), block.dense_forward(x)
    torch.testing.assert_close(y_f, y_d, atol=2e-3, rtol=2e-3)
    cot = torch.randn_like(y_d)
    (g_f,) = torch.autograd.grad(y_f, x, cot)
    (g_d,) = torch.autograd.grad(y_d, x, cot)
    torch.testing.assert_close(g_f, g_d, atol=2e-3, rtol=2e-3)
