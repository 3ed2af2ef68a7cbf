"""The delta-rule block (DeltaNet, Gated DeltaNet, KDA) and its kernels: the chunked WY/UT
path against the per-token recurrence and the closed-form M in fp64 (outputs, final states,
all gradients), decoding through the cache, rank K, its config and its budget.

The block contract (causality, decoding, caps, bad input) is checked on its registry row in
tests/zoo/test_contract.py; the closed form itself in tests/budgets/mixing/test_delta.py.
"""

import pytest
import torch
import torch.nn.functional as F

import budgets
import zoo
from budgets.mixing.delta import delta_mixing
from zoo.ops.delta import DELTA, DeltaSpec, chunked_delta, recurrent_delta
from zoo.ops.registry import BackendUnavailable

H, K, V = 3, 4, 5
NAMES = {"none": "DeltaNet", "scalar": "GDN", "channel": "KDA"}
GATES = list(NAMES)
# (gate, regime): gates at g = 0 and random log-sigmoid gates
KINDS = [pytest.param("none", "-", id="DeltaNet")] + [
    pytest.param(gate, regime, id=f"{NAMES[gate]}-{regime}")
    for gate in ("scalar", "channel") for regime in ("g=0", "log-sigmoid")]
# (T, chunk, with an initial state)
CASES = {"chunk-multiple": (24, 8, False), "ragged-initial-state": (27, 8, True),
         "shorter-than-chunk": (5, 8, True), "one-token": (1, 8, True)}
# d_model 16, 2 key heads of K = 4, 4 value heads of V = 6 (two per key head)
CONFIG = {"d_model": 16, "n_heads": 2, "key_dim": 4, "value_dim": 6, "n_v_heads": 4,
          "chunk_size": 8}


def op_inputs(T, gate, regime="log-sigmoid", initial=False, seed=0):
    """q, k, v, beta, the log gate and an initial state (or None), fp64, requiring grad."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(2, H, T, K, generator=g, dtype=torch.float64), dim=-1) / K ** 0.5
    k = F.normalize(torch.randn(2, H, T, K, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(2, H, T, V, generator=g, dtype=torch.float64)
    beta = torch.rand(2, H, T, generator=g, dtype=torch.float64)
    shape = {"none": None, "scalar": (2, H, T), "channel": (2, H, T, K)}[gate]
    log_gate = None
    if shape is not None:
        raw = torch.randn(*shape, generator=g, dtype=torch.float64)
        log_gate = F.logsigmoid(raw) if regime == "log-sigmoid" else 0 * raw
    s0 = torch.randn(2, H, K, V, generator=g, dtype=torch.float64) if initial else None
    tensors = [t for t in (q, k, v, beta, log_gate, s0) if t is not None]
    for t in tensors:
        t.requires_grad_()
    return (q, k, v, beta, log_gate), s0, tensors


def grads_of(fn, args, s0, wrt, chunk):
    o, state = fn(*args, initial_state=s0, chunk_size=chunk)
    cot = torch.cos(torch.arange(o.numel(), dtype=o.dtype)).view_as(o)  # a fixed cotangent
    return o, state, torch.autograd.grad([o, state], wrt, [cot, torch.ones_like(state)])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("gate, regime", KINDS)
def test_chunked_equals_recurrence_and_closed_form_fp64(gate, regime, case):
    T, chunk, initial = CASES[case]
    args, s0, wrt = op_inputs(T, gate, regime, initial)
    o_r, s_r, g_r = grads_of(recurrent_delta, args, s0, wrt, chunk)
    o_c, s_c, g_c = grads_of(chunked_delta, args, s0, wrt, chunk)
    torch.testing.assert_close(o_c, o_r, atol=1e-13, rtol=1e-11)
    torch.testing.assert_close(s_c, s_r, atol=1e-13, rtol=1e-11, msg="final state differs")
    names = ["q", "k", "v", "beta"] + (["gate"] if gate != "none" else []) + ["initial state"]
    for a, b, name in zip(g_c, g_r, names, strict=False):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{name} differs")
    if not initial:  # M mixes a sequence from a zero state
        q, k, v, beta, log_gate = args
        torch.testing.assert_close(delta_mixing(q, k, beta, log_gate) @ v, o_r,
                                   atol=1e-13, rtol=1e-11)


def test_chunked_is_stable_under_strong_decay():
    """Log gates near -60 per token: a chunk's decay underflows, nothing overflows."""
    (q, k, v, beta, g), s0, wrt = op_inputs(40, "channel", initial=True)
    g = 60 * g.detach().requires_grad_()
    o, s = chunked_delta(q, k, v, beta, g, initial_state=s0, chunk_size=16)
    o_r, s_r = recurrent_delta(q, k, v, beta, g, initial_state=s0)
    torch.testing.assert_close(o, o_r, atol=1e-13, rtol=1e-11)
    grads = torch.autograd.grad(o.sum() + s.sum(), [q, k, v, beta, g, s0])
    assert all(torch.isfinite(d).all() for d in grads)


def test_chunked_gradcheck():
    (q, k, v, beta, g), s0, _ = op_inputs(5, "channel", initial=True)
    assert torch.autograd.gradcheck(
        lambda *t: chunked_delta(*t[:5], initial_state=t[5], chunk_size=2),
        (q, k, v, beta, g, s0), fast_mode=True)


# ---------------------------------------------------------------- the block

def make_block(gate="scalar", dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    block = zoo.build("delta", **{**CONFIG, "gate": gate, **kw})
    with torch.no_grad():  # a norm weight away from one, so the test sees it used
        block.norm_weight.uniform_(0.5, 1.5)
    return block.to(dtype)


def make_x(B=2, T=21, dtype=torch.float64, seed=1):
    return torch.randn(B, T, 16, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_chunked_block_matches_the_recurrence_with_all_gradients(gate):
    """T = 21 is not a multiple of the chunk (8): outputs and every gradient agree in fp64."""
    fast = make_block(gate, backend="chunked")
    ref = make_block(gate, backend="reference", conv_backend="reference")
    x = make_x().requires_grad_()
    cot = torch.randn(2, 21, 16, dtype=torch.float64)
    y_f, y_r = fast(x), ref(x)
    assert (fast.backend, ref.backend) == ("chunked+conv1d", "reference+reference")
    torch.testing.assert_close(y_f, y_r, atol=1e-13, rtol=1e-11)
    names = ["x", *(n for n, _ in fast.named_parameters())]
    grads = zip(torch.autograd.grad(y_f, [x, *fast.parameters()], cot),
                torch.autograd.grad(y_r, [x, *ref.parameters()], cot), names, strict=True)
    for a, b, name in grads:
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=f"d{name} differs")


@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_output_is_the_closed_form_mixing_of_the_value_path(gate):
    """y == readout(M @ v, x) with M from the block's own q, k, beta and gate: 1e-14 in
    fp64; mixing_matrices (fp32, by the contract) to fp32's precision."""
    block, x = make_block(gate), make_x()
    q, k, v, beta, g, _ = block.project(x)
    assert q.shape == (2, 4, 21, 4) and v.shape == (2, 4, 21, 6)
    assert g is None or g.shape == {"scalar": (2, 4, 21), "channel": (2, 4, 21, 4)}[gate]
    y = block.readout(delta_mixing(q, k, beta, g) @ v, x)
    torch.testing.assert_close(y, block(x), atol=1e-13, rtol=1e-11)
    M = block.mixing_matrices(x)
    assert M.shape == (2, 4, 21, 21) and M.dtype == torch.float32
    torch.testing.assert_close(block.readout(M.double() @ block.value_heads(x), x), block(x),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_past_future_rank_is_at_most_k_and_the_operator_gives_it(gate):
    block, x = make_block(gate, dtype=torch.float32), make_x(T=24, dtype=torch.float32)
    M, f = block.mixing_matrices(x), block.mixing_operator(x)
    past_future = M[..., 12:, :12]  # 12 x 12, K = 4
    assert int(torch.linalg.matrix_rank(past_future).max()) <= 4
    torch.testing.assert_close(f.L @ f.R.mT, past_future, atol=1e-6, rtol=1e-5)
    assert block.budget(24).mixing == 4


@pytest.mark.parametrize("chunks", [[2, 1, 1, 4, 1], [6] + [1] * 6, [1] * 8],
                         ids=["prefill-shorter-than-conv", "prefill-then-steps", "steps"])
@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_prefill_and_one_token_steps_equal_the_parallel_forward(gate, chunks):
    """The cache carries the conv state (the last d_conv - 1 = 3 inputs) and S."""
    block = make_block(gate)
    x = make_x(T=sum(chunks))
    cache = block.init_cache(2, sum(chunks))
    pieces, t = [], 0
    for n in chunks:
        pieces.append(block(x[:, t:t + n], cache=cache))
        t += n
    assert block.backend == "reference+reference"  # the last step: one token under auto
    torch.testing.assert_close(torch.cat(pieces, 1), block(x), atol=1e-13, rtol=1e-11)
    assert cache.state.shape == (2, 4, 4, 6) and cache.conv_state.shape == (2, 40, 3)
    assert set(block.inference_state(cache)) == {"state", "conv"}


def test_chunked_block_allocates_no_t_by_t(quadratic_allocations):
    block = make_block("channel", dtype=torch.float32, chunk_size=16)
    assert quadratic_allocations(block, make_x(B=1, T=96, dtype=torch.float32)) == []


def test_a_long_probe_is_matrix_free():
    block, T = make_block("scalar", dtype=torch.float32), 64
    probe = budgets.probe_model(block, make_x(B=1, T=T, dtype=torch.float32), matfree_from=T)
    rank = probe["layers"][0]["quantities"]["past_future"]["rank_eps_max"]
    assert probe["matfree"]["from"] == T and max(rank) <= 4


# ---------------------------------------------------------------- config, budget, presets

@pytest.mark.parametrize("kwargs, message", [
    ({"gate": "vector"}, r"gate 'vector' unknown; known: \['none', 'scalar', 'channel'\]"),
    ({"output_gate": "relu"}, r"output_gate 'relu' unknown"),
    ({"n_v_heads": 3}, r"n_v_heads \(3\) must be a multiple of n_heads \(2\)"),
    ({"d_conv": 1}, r"d_conv \(1\) must be at least 2"),
    ({"key_dim": 0}, r"delta.key_dim must be a positive int, got 0"),
    ({"d_model": 15, "key_dim": None}, r"n_heads \(2\) must divide d_model \(15\)"),
    ({"backend": "triton"}, r"unknown delta backend 'triton'"),
    ({"dt_min": 0.5, "dt_max": 0.1}, r"dt_min \(0.5\) must not exceed dt_max \(0.1\)"),
    ({"gates": "none"}, r"unknown delta key 'gates'; did you mean 'gate'"),
], ids=["gate", "output-gate", "value-heads", "conv-width", "zero-K", "heads-divide-width",
        "backend", "dt-range", "unknown-key"])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build("delta", **{**CONFIG, **kwargs})


def test_budget_is_the_tables_column_with_the_conv_state():
    block = make_block("channel")
    b = block.budget(64)
    conv_dim = 2 * 2 * 4 + 4 * 6  # q and k of 2 heads x K = 4, v of 4 heads x V = 6
    assert (b.n_heads, b.mixing, b.logits, b.value_path, b.inference) == (4, 4, 4, 16, 4)
    assert b.cache_elements == 4 * 4 * 6 + conv_dim * 3
    assert b.params == block.param_count()
    assert block.cache_slots()[0].columns == 2 * 6  # a key head's state: two value heads


def test_presets_are_deltanet_gdn_and_kda():
    labels = [label for label, _ in zoo.block_class("delta").variants(64, 4)]
    assert labels == ["delta (DeltaNet)", "delta (GDN)", "delta (KDA)"]
    kda = zoo.build("delta", d_model=64, n_heads=4, **dict(
        zoo.block_class("delta").variants(64, 4))["delta (KDA)"])
    assert kda.log_gate(torch.randn(1, 3, 64)).shape == (1, 4, 3, 16)  # one per key channel
    assert zoo.facts_of("delta").sizing.describe(kda.config) == "K=16, V=16"


# ---------------------------------------------------------------- fla

def test_fla_is_opt_in_and_names_why_not_on_cpu():
    spec = DeltaSpec("cpu", torch.float32, K, V, "scalar", True)
    assert DELTA.resolve("auto", spec).name == "chunked"
    with pytest.raises(BackendUnavailable, match="fla"):
        DELTA.resolve("fla", spec)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("gate", GATES, ids=NAMES.get)
def test_fla_matches_the_chunked_path_cuda(gate, rel_err):
    reason = DELTA.why_not("fla", DeltaSpec("cuda", torch.float32, 64, 64, gate, True))
    if reason:
        pytest.skip(f"fla: {reason}")
    torch.manual_seed(0)
    T = 200
    q = F.normalize(torch.randn(2, 4, T, 64, device="cuda"), dim=-1) / 8
    k = F.normalize(torch.randn(2, 4, T, 64, device="cuda"), dim=-1)
    v, beta = torch.randn(2, 4, T, 64, device="cuda"), torch.rand(2, 4, T, device="cuda")
    shape = {"none": None, "scalar": (2, 4, T), "channel": (2, 4, T, 64)}[gate]
    g = None if shape is None else F.logsigmoid(torch.randn(*shape, device="cuda"))
    args = [t for t in (q, k, v, beta, g) if t is not None]
    for t in args:
        t.requires_grad_()
    want = chunked_delta(*(t.double() for t in (q, k, v, beta)),
                         None if g is None else g.double())
    got = DELTA.get("fla").fn(q, k, v, beta, g)
    assert rel_err(got[0], want[0]) < 5e-3 and rel_err(got[1], want[1]) < 5e-3
