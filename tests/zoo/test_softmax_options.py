"""The softmax options 2026 models use: sinks, an output gate, chunks, NoPE (and MLA's).

Each option, on every backend that serves it, against the reference in fp64 (outputs and
gradients); the mixing matrices rebuilding y; prefill + decoding equal to the parallel
forward across chunk boundaries; the chunked past->future cap against the realized rank
and the mask; bad values refused in one line.
"""

import pytest
import torch

import budgets
import zoo
from zoo.ops.attention import ATTENTION, AttnSpec
from zoo.ops.attention.reference import causal_band
from zoo.ops.attention.vendor import flash_attn_unsupported, xformers_unsupported

# (block, config over d_model 32 and 4 heads)
OPTIONS = {
    "sinks": ("softmax", {"sinks": True}),
    "gate-headwise": ("softmax", {"output_gate": "headwise"}),
    "gate-elementwise": ("softmax", {"output_gate": "elementwise"}),
    "chunk": ("softmax", {"chunk": 5}),
    "nope": ("softmax", {"rope": False}),
    "all-gqa": ("softmax", {"sinks": True, "output_gate": "headwise", "chunk": 4,
                            "n_kv_heads": 2, "rope": False}),
    "window-sinks-gate": ("sliding_window", {"window": 4, "sinks": True, "n_kv_heads": 1,
                                             "output_gate": "elementwise"}),
    "mla-sinks-nope": ("mla", {"kv_lora_rank": 6, "sinks": True, "rope": False}),
}
CASES = [pytest.param(*OPTIONS[name], id=name) for name in OPTIONS]
FUSED = [name for name in ATTENTION.names() if name != "reference"]
TOL = {"atol": 1e-12, "rtol": 1e-10}


def build(name, config, backend="reference", dtype=torch.float64):
    torch.manual_seed(0)
    block = zoo.build(name, d_model=32, n_heads=4, backend=backend, **config)
    if block.sinks is not None:  # away from zero, one per head
        with torch.no_grad():
            block.sinks.uniform_(-1.5, 1.5)
    return block.to(dtype)


def make_x(T=14, B=2, dtype=torch.float64, seed=1):
    return torch.randn(B, T, 32, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("name, config", CASES)
def test_every_serving_backend_equals_the_reference_in_fp64(name, config, backend):
    fused, ref = build(name, config, backend), build(name, config)
    x = make_x().requires_grad_()
    with torch.no_grad():
        spec = AttnSpec.of(*fused.project(x)[:3], window=getattr(fused, "window", None),
                           chunk=config.get("chunk"), sinks=fused.sinks)
    with_grad = ATTENTION.why_not(backend, AttnSpec(**{**vars(spec), "needs_grad": True}))
    without = ATTENTION.why_not(backend, AttnSpec(**{**vars(spec), "needs_grad": False}))
    if without is not None:
        pytest.skip(f"{backend} cannot serve here: {without}")
    if with_grad is not None:  # flex on CPU, or sinks on flex: inference only
        with torch.no_grad():
            torch.testing.assert_close(fused(x), ref(x), **TOL)
        assert fused.backend == backend
        return
    cot = torch.randn(2, 14, 32, dtype=torch.float64)
    y_f, y_r = fused(x), ref(x)
    assert (fused.backend, ref.backend) == (backend, "reference")
    torch.testing.assert_close(y_f, y_r, **TOL)
    grads_f = torch.autograd.grad(y_f, [x, *fused.parameters()], cot)
    grads_r = torch.autograd.grad(y_r, [x, *ref.parameters()], cot)
    for (pname, _), a, b in zip([("x", x), *fused.named_parameters()], grads_f, grads_r,
                                strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, p=pname: f"{p}: {m}")


@pytest.mark.parametrize("name, config", CASES)
def test_mixing_matrices_rebuild_the_output(name, config):
    """y = o_proj(M @ V); with an elementwise gate, which no per-head M can carry,
    y = o_proj(output_gates(x) * (M @ V))."""
    block = build(name, config, dtype=torch.float32)
    x = make_x(dtype=torch.float32)
    M = block.mixing_matrices(x)  # [B, H, T, T]
    mixed = M @ block.value_heads(x)  # [B, H, T, V]
    if config.get("output_gate") == "elementwise":
        mixed = block.output_gates(x) * mixed
    y = block.o_proj(mixed.transpose(1, 2).reshape(2, 14, -1))
    torch.testing.assert_close(y, block(x), atol=1e-5, rtol=1e-5)


CHUNKS = {"steps": [3] + [1] * 11, "pieces": [2, 6, 1, 3, 1, 1]}  # 14 tokens each


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("feed", list(CHUNKS))
@pytest.mark.parametrize("name, config", CASES)
def test_prefill_then_decode_equals_the_parallel_forward(name, config, feed, backend):
    """Chunks of 4 or 5 put boundaries at 4/5, 8/10, 12 inside the decoded stretch, and
    the pieces' appends cross them too."""
    block = build(name, config, backend)
    x = make_x()
    cache = block.init_cache(batch=2, max_len=14)
    pieces, t = [], 0
    for n in CHUNKS[feed]:
        pieces.append(block(x[:, t:t + n], cache=cache))
        t += n
    assert block.backend == backend and cache.length == 14
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), **TOL)


def test_a_chunked_cache_holds_one_chunk_and_rolls_past_max_len():
    block = build("softmax", {"chunk": 4, "n_kv_heads": 2})
    x = make_x(T=11)
    cache = block.init_cache(batch=2, max_len=4)  # C keys: it never fills
    out = [block(x[:, t:t + 1], cache=cache) for t in range(11)]
    torch.testing.assert_close(torch.cat(out, dim=1), block(x), **TOL)
    assert cache.k.shape[-2] == 4
    state = block.inference_state(cache)  # tokens 8, 9, 10: the last chunk's
    assert state["k"].shape == (2, 3, 2 * 8)
    declared = block.budget(11)
    assert declared.inference == 3 and declared.cache_elements == 2 * 4 * 2 * 8
    small = block.init_cache(batch=2, max_len=3)  # smaller than a chunk: it cannot roll
    with pytest.raises(ValueError, match="max_len 3 .*smaller than the chunk 4"):
        block(x[:, :4], cache=small)


# (T, C, the cap): h = 12; boundaries at h give 0, else min(h mod C, C - h mod C)
CHUNK_CAPS = [(24, 6, 0), (24, 12, 0), (24, 5, 2), (24, 7, 2), (24, 16, 4), (24, 30, 12),
              (25, 8, 4), (24, 1, 0)]


@pytest.mark.parametrize("T, C, cap", CHUNK_CAPS)
def test_chunked_cap_is_what_the_mask_allows_and_what_a_block_realizes(T, C, cap):
    h = T // 2
    assert budgets.past_future_cap(T, chunk=C) == cap
    allowed = causal_band(T, T, None, "cpu", chunk=C)[h:, :h]  # [T - h, h]
    support = torch.rand(T - h, h, dtype=torch.float64) * allowed
    assert int(torch.linalg.matrix_rank(support)) == cap  # a generic matrix there fills it
    block = build("softmax", {"chunk": C}, dtype=torch.float32)
    declared = block.budget(T)
    assert declared.mixing == cap
    M = block.mixing_matrices(make_x(T=T, dtype=torch.float32))  # [B, H, T, T]
    assert (M[..., h:, :h][..., ~allowed] == 0).all()  # nothing crosses a chunk boundary
    realized = torch.linalg.matrix_rank(M[..., h:, :h].double())  # [B, H]
    assert int(realized.max()) == int(realized.min()) == cap


def test_the_probe_reads_a_chunked_block_within_its_cap_exactly_and_matrix_free():
    block = build("softmax", {"chunk": 5, "n_kv_heads": 1, "sinks": True}, dtype=torch.float32)
    x = make_x(T=24, dtype=torch.float32)
    exact, matfree = (budgets.probe_model(torch.nn.Sequential(block), x, matfree_from=m)
                      ["layers"][0]["quantities"]["past_future"] for m in (None, 16))
    assert max(exact["numerical_rank"]) == block.budget(24).mixing == 2
    for metric in ("rank_eps", "erank"):  # the operator's M is mixing_matrices'
        torch.testing.assert_close(torch.tensor(matfree[metric]), torch.tensor(exact[metric]),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name, config", [OPTIONS[n] for n in ("sinks", "window-sinks-gate",
                                                                "mla-sinks-nope")])
def test_rows_with_sinks_sum_to_less_than_one(name, config):
    """(An elementwise gate is outside M: these rows are the softmax's alone.)"""
    x = make_x(dtype=torch.float32)
    rows = build(name, config, dtype=torch.float32).mixing_matrices(x).sum(-1)  # [B, H, T]
    assert bool((rows < 1 - 1e-4).all()) and bool((rows > 0).all())
    plain = {k: v for k, v in config.items() if k != "sinks"}
    rows = build(name, plain, dtype=torch.float32).mixing_matrices(x).sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_options_cost_what_they_add():
    """Sinks add H parameters, a gate D*H or D*H*V and its FLOPs; no cap moves."""
    plain = build("softmax", {}).budget(64)
    for config, extra in (({"sinks": True}, 4), ({"output_gate": "headwise"}, 32 * 4),
                          ({"output_gate": "elementwise"}, 32 * 32), ({"rope": False}, 0)):
        b = build("softmax", config).budget(64)
        assert b.params == plain.params + extra and b.caps() == plain.caps(), config
        gate = extra if "output_gate" in config else 0
        assert b.flops_per_token == plain.flops_per_token + 2 * gate, config
    chunked = build("softmax", {"chunk": 16}).budget(64)
    assert chunked.flops_per_token < plain.flops_per_token  # each query sees <= 16 keys


@pytest.mark.parametrize("Tq, window, chunk", [(160, 8, None), (160, None, 24), (5, None, 24)],
                         ids=["banded-window", "chunks-folded", "chunk-mask"])
def test_sdpa_long_paths_take_sinks_exactly(Tq, window, chunk):
    """The window's blocks (banded.py) and the prefill's folded chunks carry the sink key
    too; a short query run (decoding) takes the chunk mask."""
    from zoo.ops.attention import reference_attention, sdpa_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, Tq, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 160, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    args = dict(window=window, scale=0.3, chunk=chunk, sinks=sinks)
    a, b = sdpa_attention(q, k, v, **args), reference_attention(q, k, v, **args)
    torch.testing.assert_close(a, b, **TOL)
    for ga, gb in zip(torch.autograd.grad(a.sum(), [q, k, v, sinks]),
                      torch.autograd.grad(b.sum(), [q, k, v, sinks]), strict=True):
        torch.testing.assert_close(ga, gb, **TOL)


def test_backends_that_cannot_serve_refuse_with_the_reason():
    spec = AttnSpec("cuda", torch.bfloat16, 64, 64, 8, 2, None, True)
    chunked = AttnSpec(**{**vars(spec), "chunk": 128})
    sinks = AttnSpec(**{**vars(spec), "sinks": True})
    for refuse in (flash_attn_unsupported, xformers_unsupported):
        assert "chunk=128" in refuse(chunked) and "sink" in refuse(sinks)
    assert "inference only" in ATTENTION.get("flex").unsupported(sinks)
    assert ATTENTION.get("sdpa").unsupported(chunked) is None
    cpu = AttnSpec("cpu", torch.float32, 8, 8, 4, 2, None, True, chunk=4, sinks=True)
    assert ATTENTION.resolve("auto", cpu).name == "sdpa"


@pytest.mark.parametrize("name, kwargs, message", [
    ("softmax", {"chunk": 0}, r"chunk \(C, tokens per attention chunk\) must be an int >= 1, "
                              r"got 0"),
    ("softmax", {"chunk": 2.5}, r"softmax.chunk must be int or null, got 2.5"),
    ("softmax", {"output_gate": "sigmoid"},
     r"output_gate 'sigmoid' unknown; known: \['none', 'headwise', 'elementwise'\]"),
    ("softmax", {"sinks": "yes"}, r"softmax.sinks must be bool, got 'yes'"),
    ("sliding_window", {"chunk": 4}, r"sliding_window.chunk must be null, got 4"),
    ("mla", {"sinks": 1}, r"mla.sinks must be bool, got 1"),
], ids=["chunk-0", "chunk-float", "gate-name", "sinks-str", "window-chunk", "mla-sinks-int"])
def test_bad_values_are_refused_naming_them(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build(name, d_model=32, n_heads=4, **kwargs)
