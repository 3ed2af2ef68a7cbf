"""The sliding-window block: a band of W keys, O(T W) kernels, a rolling cache of W entries."""

import pytest
import torch

import zoo
from zoo.ops.attention import ATTENTION, AttnSpec, reference_attention
from zoo.ops.attention.banded import banded_sdpa, block_size, worth_blocking
from zoo.ops.attention.reference import causal_band

KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}
FUSED = [name for name in ATTENTION.names() if name != "reference"]
DEVICE_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_block(window=5, n_kv_heads=None, dtype=torch.float64, backend="auto", seed=0,
               device="cpu", **kw):
    torch.manual_seed(seed)
    block = zoo.build("sliding_window", d_model=32, n_heads=4, n_kv_heads=n_kv_heads,
                      window=window, backend=backend, **kw)
    return block.to(device=device, dtype=dtype)


def make_x(B=2, T=12, D=32, dtype=torch.float64, seed=1, device="cpu"):
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.to(device=device, dtype=dtype)


def skip_unless_serves(name, device, dtype, n_kv_heads, window, needs_grad=True, head_dim=8):
    G, K = n_kv_heads or 4, head_dim
    reason = ATTENTION.why_not(name, AttnSpec(device, dtype, K, K, 4, G, window, needs_grad))
    if reason:
        pytest.skip(f"{name}: {reason}")


def outputs_and_grads(block, x, cot):
    y = block(x)
    return y, torch.autograd.grad(y, [x, *block.parameters()], cot)


# (window, T): short sequences take the masked SDPA call, long ones the blocked band path
CASES = {"W1": (1, 12), "W5": (5, 12), "W-over-T": (40, 12), "W5-blocked": (5, 150),
         "W70-blocked-ragged": (70, 211)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", list(KV_HEADS))
@pytest.mark.parametrize("name", FUSED)
def test_every_backend_matches_reference_outputs_and_grads(name, variant, case):
    window, T = CASES[case]
    skip_unless_serves(name, "cpu", torch.float64, KV_HEADS[variant], window)
    fused = make_block(window, KV_HEADS[variant], backend=name)
    ref = make_block(window, KV_HEADS[variant], backend="reference")
    x = make_x(T=T).requires_grad_()
    cot = torch.randn(2, T, 32, dtype=torch.float64)
    (y_f, g_f), (y_r, g_r) = outputs_and_grads(fused, x, cot), outputs_and_grads(ref, x, cot)
    assert (fused.backend, ref.backend) == (name, "reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-12, rtol=1e-10)
    for a, b in zip(g_f, g_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("T, W, G", [(128 + 1, 1, 4), (200, 3, 2), (257, 64, 1), (300, 100, 2),
                                     (64 * 5, 64, 4)],
                         ids=["W1", "W3-gqa", "W64-mqa-ragged", "W100-gqa", "exact-blocks"])
def test_blocked_band_matches_reference_outputs_and_grads(T, W, G):
    assert worth_blocking(T, T, W), "the case must take the blocked path"
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, G, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, G, T, 6, generator=g, dtype=torch.float64, requires_grad=True)
    cot = torch.randn(1, 4, T, 6, generator=g, dtype=torch.float64)
    o_b = banded_sdpa(q, k, v, window=W, scale=0.3)
    o_r = reference_attention(q, k, v, window=W, scale=0.3)
    torch.testing.assert_close(o_b, o_r, atol=1e-12, rtol=1e-10)
    g_b = torch.autograd.grad(o_b, (q, k, v), cot)
    g_r = torch.autograd.grad(o_r, (q, k, v), cot)
    for a, b, what in zip(g_b, g_r, "qkv", strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{what} differs")


def test_blocked_path_is_taken_only_for_long_prefill():
    W = 16
    C = block_size(W)
    assert worth_blocking(2 * C + W, 2 * C + W, W)
    assert not worth_blocking(2 * C + W - 1, 2 * C + W - 1, W)  # too short to pay off
    assert not worth_blocking(1, 1000, W)  # decode steps keep the masked call
    assert not worth_blocking(1000, 1000, None)  # full causal is SDPA's own is_causal


@pytest.mark.parametrize("window", [1, 4, 9])
def test_mixing_weights_are_zero_outside_the_band(window):
    block = make_block(window, dtype=torch.float32)
    P = block.mixing_matrices(make_x(T=16, dtype=torch.float32))  # [B, H, T, T]
    band = causal_band(16, 16, window, "cpu")
    assert P.shape == (2, 4, 16, 16) and P.dtype == torch.float32
    assert torch.all(P[..., ~band] == 0)
    assert torch.all(P[..., band] > 0)
    torch.testing.assert_close(P.sum(-1), torch.ones(2, 4, 16))


@pytest.mark.parametrize("window", [2, 5, 8])
def test_past_future_block_rank_is_at_most_w_minus_1(window):
    T = 32
    block = make_block(window)
    P = block.mixing_matrices(make_x(T=T)).double()
    declared = block.budget(T).mixing
    ranks = torch.linalg.matrix_rank(P[..., T // 2:, :T // 2])  # [B, H]
    assert declared == window - 1
    assert int(ranks.max()) <= declared
    assert int(ranks.min()) == window - 1  # random inputs reach the cap: it is tight


def test_output_rebuilt_from_mixing_matrices_and_value_path():
    block = make_block(4, n_kv_heads=2, dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    mixed = block.mixing_matrices(x) @ block.value_heads(x)  # [B, H, T, V]
    y = block.o_proj(mixed.transpose(1, 2).reshape(2, 12, -1))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


def test_window_covering_the_sequence_equals_softmax():
    sw = make_block(window=12)
    torch.manual_seed(0)
    full = zoo.build("softmax", d_model=32, n_heads=4).double()
    full.load_state_dict(sw.state_dict())
    x = make_x(T=12)
    torch.testing.assert_close(sw(x), full(x), atol=1e-12, rtol=1e-10)
    assert not torch.allclose(make_block(window=11)(x), full(x))


@pytest.mark.parametrize("chunks", [[6] + [1] * 11, [1] * 14, [3, 7, 1, 1, 2, 9]],
                         ids=["prefill-past-W-then-steps", "steps-only", "mixed-chunks"])
@pytest.mark.parametrize("backend, variant", [("sdpa", "mha"), ("sdpa", "mqa"),
                                              ("reference", "gqa")])
def test_decoding_well_past_the_window_equals_parallel_forward(backend, variant, chunks):
    W, T = 4, sum(chunks)
    block = make_block(W, KV_HEADS[variant], backend=backend)
    x = make_x(T=T)
    cache = block.init_cache(batch=2, max_len=T)
    assert cache.k.shape[2] == W  # memory bounded by W, not T
    pieces, t = [], 0
    for n in chunks:
        pieces.append(block(x[:, t:t + n], cache=cache))
        t += n
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == T
    # the state is the live window: the last W keys and values, in order
    state = block.inference_state(cache)
    _, k, v = block.project(x)  # [B, G, T, K]
    G = block.config.kv_heads
    torch.testing.assert_close(state["k"], k[:, :, -W:].transpose(1, 2).reshape(2, W, G * 8))
    torch.testing.assert_close(state["v"], v[:, :, -W:].transpose(1, 2).reshape(2, W, G * 8))


def test_rolling_cache_streams_past_max_len_when_it_holds_the_window():
    block = make_block(window=3)
    x = make_x(T=20)
    cache = block.init_cache(batch=2, max_len=3)
    steps = [block(x[:, t:t + 1], cache=cache) for t in range(20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), block(x), atol=1e-12, rtol=1e-10)


def test_cache_shorter_than_the_window_overflows_with_the_lengths_named():
    block = make_block(window=8)
    cache = block.init_cache(batch=2, max_len=4)
    block(make_x(T=3), cache=cache)
    with pytest.raises(ValueError, match=r"3 cached \+ 2 new > max_len 4"):
        block(make_x(T=2), cache=cache)


@pytest.mark.parametrize("T", [3, 12, 40])
def test_declared_caps_hold_and_the_cache_is_bounded_by_w(T):
    W, G, K = 6, 2, 8
    block = make_block(W, n_kv_heads=G)
    declared = block.budget(seq_len=T)
    assert declared.mixing == min(W - 1, T // 2)
    assert declared.inference == min(T, W, G * K)
    assert declared.cache_elements == 2 * min(T, W) * G * K
    assert declared.params == sum(p.numel() for p in block.parameters())
    cache = block.init_cache(2, T)
    block(make_x(T=T), cache=cache)
    state = block.inference_state(cache)
    assert state["k"].shape == (2, min(T, W), G * K)
    assert int(torch.linalg.matrix_rank(state["k"]).max()) <= declared.inference
    weights = block.weight_matrices()
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= declared.logits == K
    softmax = zoo.build("softmax", d_model=32, n_heads=4, n_kv_heads=G).budget(T)
    assert declared.flops_per_token <= softmax.flops_per_token


def test_variants_build_and_registry_lists_the_block():
    assert "sliding_window" in zoo.names()
    labels = []
    for label, kwargs in zoo.block_class("sliding_window").variants(d_model=32, n_heads=4):
        block = zoo.build("sliding_window", d_model=32, n_heads=4, **kwargs)
        assert block.budget(1024).mixing == kwargs["window"] - 1, label
        labels.append(label)
    assert len(set(labels)) == len(labels)


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("name", ["flex", "sdpa", "flash_attn", "xformers"])
def test_cuda_backends_match_reference_outputs_and_grads(name):
    W, T = 40, 300
    dtype = torch.bfloat16
    skip_unless_serves(name, "cuda", dtype, 2, W, head_dim=32)
    torch.manual_seed(0)
    fused = zoo.build("sliding_window", d_model=128, n_heads=4, n_kv_heads=2, window=W,
                      backend=name).to(device="cuda", dtype=dtype)
    ref = zoo.build("sliding_window", d_model=128, n_heads=4, n_kv_heads=2, window=W,
                    backend="reference").to("cuda")
    ref.load_state_dict({k: v.float() for k, v in fused.state_dict().items()})
    x = make_x(T=T, D=128, device="cuda")
    cot = torch.randn(2, T, 128, device="cuda")
    x_f = x.to(dtype).requires_grad_()
    x_r = x.float().requires_grad_()
    y_f, y_r = fused(x_f), ref(x_r)
    assert fused.backend == name
    torch.testing.assert_close(y_f.float(), y_r, atol=3e-2, rtol=3e-2)
    (gx_f,) = torch.autograd.grad(y_f, x_f, cot.to(dtype))
    (gx_r,) = torch.autograd.grad(y_r, x_r, cot)
    torch.testing.assert_close(gx_f.float(), gx_r, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@DEVICE_GPU
@pytest.mark.parametrize("backend", ["auto", "flex", "sdpa"])
def test_cuda_decoding_past_the_window_equals_parallel_forward(backend):
    skip_unless_serves(backend if backend != "auto" else "sdpa", "cuda", torch.float32, 2, 8,
                       needs_grad=False, head_dim=16)
    block = make_block(8, n_kv_heads=2, dtype=torch.float32, backend=backend, device="cuda",
                       head_dim=16)
    x = make_x(T=40, dtype=torch.float32, device="cuda")
    cache = block.init_cache(2, 40)
    with torch.no_grad():
        pieces = [block(x[:, :12], cache=cache)]
        pieces += [block(x[:, t:t + 1], cache=cache) for t in range(12, 40)]
        torch.testing.assert_close(torch.cat(pieces, 1), block(x), atol=2e-3, rtol=2e-3)
