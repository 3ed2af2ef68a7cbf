"""The block contract, checked on every registered block (a new block is covered on arrival).

Each check runs on a "small-caps" case of every registered block, and on the cases each
family's own tests chose (configs, seeds, inputs): the families' files keep only what is
theirs (kernels, caches, formulas, variants).
"""

import dataclasses
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import pytest
import torch

import budgets
import zoo
from zoo.facts import CACHE_KINDS, HF_KINDS, Check, Facts, Sizing
from zoo.registry import register, unregister
from zoo.sliding_window import SlidingWindowAttention

NAMES = zoo.names()

# Configs whose caps are small enough to bind at T_PROBE (below): every mixing cap that a
# config can set (window W - 1, feature dim F, state N) and every logits cap (K, F, N) is
# strictly below both sides of the matrix it bounds, so a probe that measured the wrong
# matrix could exceed it. A block missing here is built with its defaults.
SMALL_CAPS = {
    "softmax": {"n_kv_heads": 1},
    "sliding_window": {"window": 4},  # mixing: W - 1 = 3
    "linear": {"feature_dim": 4},  # mixing: F = 4
    "ssm": {"d_state": 4},  # mixing: N = 4
    "mla": {"kv_lora_rank": 4},
    "sparse": {"top_k": 4},  # the indexer's top 4 of up to 24 keys
}
# A full softmax over the past has an unbounded kernel: its mixing cap is T/2, a side of
# the past->future block itself, so no length makes it bind; for these the probe test
# asks instead that a random block realizes more than rank one there. So has a top-k
# selection: each query picks its own keys (budgets/mixing/sparse.py).
UNBOUNDED_MIXING = {"softmax", "mla", "moe", "sparse"}
T_PROBE = 24  # the past->future block M[12:, :12] is 12 x 12

# The config each family's cases start from, and the length of their inputs.
FAMILIES = {
    "softmax": ({"d_model": 32, "n_heads": 4}, 12),
    "sliding_window": ({"d_model": 32, "n_heads": 4, "window": 5}, 12),
    "linear": ({"d_model": 32, "n_heads": 4, "chunk_size": 8}, 21),
    "ssm": ({"d_model": 16, "n_heads": 4, "d_state": 6, "n_groups": 2, "chunk_size": 8}, 21),
    "mla": ({"d_model": 32, "n_heads": 4, "kv_lora_rank": 6}, 12),
    "moe": ({"d_model": 32, "n_heads": 4, "top_k": 2}, 12),
}
# Parameters that start at one (a skip, a norm's gains), drawn from U(0.5, 1.5) in the
# family cases: at one, a test could not tell whether they are used (or folded in).
GAINS = {"ssm": ("D", "norm_weight"), "mla": ("q_norm.weight", "kv_norm.weight")}
KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}
FEATURE_MAPS = {"elu+1": {"feature_map": "elu+1"},
                "taylor": {"feature_map": "taylor", "feature_dim": 3},
                "identity": {"feature_map": "identity", "normalize": False}}
QUERIES = {"full-q": None, "low-rank-q": 12}
# softmax's options together (tests/zoo/test_softmax_options.py checks each on its own)
OPTIONS = {"sinks": True, "output_gate": "elementwise", "chunk": 5, "n_kv_heads": 2}


def make_block(name, seed=0):
    torch.manual_seed(seed)
    return zoo.build(name, d_model=32, n_heads=4, **SMALL_CAPS.get(name, {})).to(torch.float64)


def make_x(B=2, T=13, seed=1, D=32):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@dataclass(frozen=True)
class Case:
    """One config of a registered block that the contract is checked on."""

    name: str  # the registered block
    label: str  # the case, in the test id
    config: dict  # zoo.build's keywords
    T: int = 13  # the length of the inputs
    gains: tuple = ()  # see GAINS

    def build(self, dtype=torch.float64):
        torch.manual_seed(0)
        block = zoo.build(self.name, **self.config)
        with torch.no_grad():
            for name, p in block.named_parameters():
                if name in self.gains:
                    p.uniform_(0.5, 1.5)
        return block.to(dtype)

    def x(self, T=None, dtype=torch.float64):
        return make_x(T=T or self.T, D=self.config["d_model"]).to(dtype)


def small_caps(name):
    """The case make_block builds (the probe test's), on inputs of 13 tokens."""
    return Case(name, "small-caps", {"d_model": 32, "n_heads": 4, **SMALL_CAPS.get(name, {})})


def family(name, label, **config):
    """A case of the family's own: its FAMILIES config updated with `config`."""
    base, T = FAMILIES[name]
    return Case(name, label, {**base, **config}, T, GAINS.get(name, ()))


def params(*rows):
    """pytest params of (case, *args) rows, with ids "<block>-<case>"."""
    return [pytest.param(case, *args, id=f"{case.name}-{case.label}") for case, *args in rows]


# ---------------------------------------------------------------- forward and decoding

CAUSAL = params(  # (case, the first token changed)
    *[(small_caps(name), 8) for name in NAMES],
    *[(family("softmax", variant, n_kv_heads=G), 7) for variant, G in KV_HEADS.items()],
    (family("softmax", "options", **OPTIONS), 7),
    (family("sliding_window", "W5"), 7),
    (family("linear", "elu+1"), 9),
    (family("ssm", "defaults"), 9),
    (family("mla", "defaults"), 7),
    (family("moe", "defaults"), 7),
)


@pytest.mark.parametrize("case, cut", CAUSAL)
def test_future_tokens_do_not_change_past_outputs(case, cut):
    block = case.build()
    x = case.x()
    x2 = x.clone()
    x2[:, cut:] = torch.randn_like(x2[:, cut:])
    y, y2 = block(x), block(x2)
    torch.testing.assert_close(y[:, :cut], y2[:, :cut], atol=1e-12, rtol=0)
    assert not torch.allclose(y[:, cut:], y2[:, cut:])


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_mixes_the_past_into_the_future(name):
    """Causal is not enough (a block that outputs zeros is causal): a change of the past
    must reach the output at the first position after it, in every sequence."""
    block = make_block(name)
    x = make_x()
    x2 = x.clone()
    x2[:, :8] = torch.randn_like(x2[:, :8])
    changed = (block(x)[:, 8] - block(x2)[:, 8]).abs().amax(dim=-1)  # [B]
    assert bool((changed > 1e-6).all()), (
        f"{name}: the output at position 8 ignores a changed past (largest change per "
        f"sequence {changed.tolist()})")


PREFILL_STEPS = [5] + [1] * 10  # a prefill, then one token at a time
DECODE = params(  # (case, the chunks fed, the backend the last step reports: None, unchecked)
    *[(small_caps(name), [6] + [1] * 7, None) for name in NAMES],
    *[(family("softmax", f"{variant}-{b}", n_kv_heads=G, backend=b), PREFILL_STEPS, b)
      for variant, G in KV_HEADS.items() for b in ("sdpa", "reference")],
    *[(family("sliding_window", f"W5-{b}", backend=b), PREFILL_STEPS, b)
      for b in ("sdpa", "reference")],
    *[(family("linear", f"{fmap}-{b}", backend=b, **FEATURE_MAPS[fmap]), PREFILL_STEPS,
       "recurrent" if b == "auto" else b)
      for fmap in FEATURE_MAPS for b in ("auto", "chunked", "reference")],
    # the cache carries the conv state (last d_conv - 1 inputs) and the SSM state
    *[(family("ssm", b, backend=b), PREFILL_STEPS,
       f"{'reference' if b == 'auto' else b}+reference") for b in ("auto", "chunked", "reference")],
    *[(family("mla", f"{queries}-sdpa", q_lora_rank=rank, backend="sdpa"), PREFILL_STEPS, "sdpa")
      for queries, rank in QUERIES.items()],
    *[(family("moe", f"{b}-{label}", backend=b), chunks, b) for b in ("sdpa", "reference")
      for label, chunks in {"steps": PREFILL_STEPS, "chunks": [3, 1, 6, 1]}.items()],
)


@pytest.mark.parametrize("case, chunks, backend", DECODE)
def test_prefill_then_decode_equals_parallel_forward(case, chunks, backend):
    block = case.build()
    T = sum(chunks)
    x = case.x(T=T)
    cache = block.init_cache(batch=2, max_len=T)
    pieces, t = [], 0
    for n in chunks:
        pieces.append(block(x[:, t:t + n], cache=cache))
        t += n
    if backend is not None:
        assert block.backend == backend
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == T


BF16 = params(
    *[(small_caps(name),) for name in NAMES],
    (family("softmax", "mha"),),
    (family("softmax", "options", **OPTIONS),),
    (family("mla", "low-rank-q", q_lora_rank=12),),
    (family("moe", "defaults"),),
)


@pytest.mark.parametrize("case", BF16)
def test_bf16_autocast_forward_is_close_to_fp32(case):
    block = case.build(torch.float32)
    x = case.x(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x)
    want = block(x)
    if case.name == "moe":
        # a token whose router probabilities nearly tie may go to another expert in bf16,
        # and its output is then another's (1 token of ~25 on 5 of seeds 0-59, AVX-512 and
        # AVX2 alike): the tokens routed alike are compared, and they are most
        with torch.autocast("cpu", dtype=torch.bfloat16):
            routed = block.routing(x)[0].sort(-1).values  # [B, T, k]
        same = (routed == block.routing(x)[0].sort(-1).values).all(-1)  # [B, T]
        assert same.float().mean() >= 0.9
        y, want = y[same], want[same]
    torch.testing.assert_close(y.float(), want, atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------- caps

CAPS = params(
    *[(small_caps(name),) for name in NAMES],
    *[(family("softmax", variant, n_kv_heads=G),) for variant, G in KV_HEADS.items()],
    (family("softmax", "options", **OPTIONS),),
    (family("sliding_window", "W5"),),
    *[(family("linear", fmap, **FEATURE_MAPS[fmap]),) for fmap in ("elu+1", "taylor")],
    (family("ssm", "defaults"),),
    *[(family("mla", queries, q_lora_rank=rank, kv_lora_rank=5),)
      for queries, rank in QUERIES.items()],
    (family("moe", "defaults"),),
)


@pytest.mark.parametrize("case", CAPS)
def test_declared_caps_hold_on_random_weights(case):
    """The weights' ranks and the state's after a prefill stay within the declared caps
    (each family's file checks that its caps are its formulas)."""
    block, T = case.build(), case.T
    c = block.config
    declared = block.budget(seq_len=T)
    weights = block.weight_matrices()
    assert weights["qk"].shape == (c.n_heads, c.d_model, c.d_model)
    assert int(torch.linalg.matrix_rank(weights["qk"]).max()) <= declared.logits
    assert int(torch.linalg.matrix_rank(weights["value"])) <= declared.value_path
    cache = block.init_cache(2, T)
    block(case.x(T=T), cache=cache)
    for name, state in block.inference_state(cache).items():
        assert int(torch.linalg.matrix_rank(state).max()) <= declared.inference, name
    assert declared.params == sum(p.numel() for p in block.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_answers_the_probe_within_its_caps(name):
    block = make_block(name).float()
    x = make_x(T=T_PROBE).float()
    T, h = T_PROBE, T_PROBE // 2
    declared = block.budget(seq_len=T)
    assert declared.block == name and declared.params == block.param_count()
    assert block.mixing_matrices(x).shape[-2:] == (T, T)
    layer = budgets.probe_model(torch.nn.Sequential(block), x, with_spectra=True)["layers"][0]
    q, spectra = layer["quantities"], layer["spectra"]

    # mixing: the past->future block M[h:, :h], (T - h) x h
    assert spectra["past_future"].shape[-1] == min(T - h, h), "past_future is not M[T/2:, :T/2]"
    realized = q["past_future"]["numerical_rank"]
    if name in UNBOUNDED_MIXING:
        assert declared.mixing == h, f"{name}: an unbounded kernel's cap is T/2"
    else:
        assert declared.mixing < min(T - h, h), (
            f"{name}: mixing cap {declared.mixing} does not bind at T = {T}; give the block a "
            f"config in SMALL_CAPS whose cap is below {min(T - h, h)}")
    assert max(realized) <= declared.mixing, (name, realized, declared.mixing)
    # a random block mixes the past into the future with more than rank one (an all-zero
    # block, e.g. the upper-right one of a causal matrix, would read 0)
    assert min(realized) >= min(2, declared.mixing), (name, realized)

    # logits: per-head W_Q W_K^T (or its SSM analogue) is D x D, its cap K (F, N) below D
    assert spectra["qk"].shape[-1] > declared.logits, f"{name}: the logits cap does not bind"
    assert 1 <= max(q["qk"]["numerical_rank"]) <= declared.logits, (name, q["qk"])

    # inference: the state after a prefill of the probe batch, not an empty cache
    inference = [n for n in q if n.startswith("inference.")]
    assert inference, f"{name}: inference_state() returned no matrices"
    for name_q in inference:
        assert 1 <= max(q[name_q]["numerical_rank"]) <= declared.inference, name_q
    assert isinstance(block.backend, str) and block.backend != "unresolved"


# ---------------------------------------------------------------- bad input and config

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("x, message", [
    (torch.randn(2, 5, 31, dtype=torch.float64), r"\[B, T, 32\], got \(2, 5, 31\)"),
    (torch.randn(12, 32, dtype=torch.float64), r"got \(12, 32\)"),
    (torch.ones(2, 5, 32, dtype=torch.long), "floating-point x, got torch.int64"),
    (torch.randn(2, 5, 32, dtype=torch.float32), "x is torch.float32 but the weights are"),
    (torch.randn(2, 0, 32, dtype=torch.float64), "at least one token"),
], ids=["width", "rank", "integer", "dtype-mismatch", "empty"])
def test_registered_block_names_bad_input(name, x, message):
    with pytest.raises(ValueError, match=message):
        make_block(name)(x)


# Per family: (case, keywords over {"d_model": <the family's>, "n_heads": 4}, message);
# every registered block also gets the misspelt and zero n_heads of bad_configs().
BAD_CONFIGS = {
    "softmax": [
        ("heads-divide-width", {"d_model": 512, "n_heads": 6},
         r"n_heads \(6\) must divide d_model \(512\)"),
        ("kv-heads-divide-heads", {"n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
        ("odd-rope-dim", {"d_model": 15, "n_heads": 5, "rope": True}, r"even head_dim, got 3"),
        ("unknown-backend", {"backend": "fast"}, r"unknown attention backend 'fast'"),
        ("unknown-key", {"n_kv_head": 2}, r"'n_kv_head'; did you mean 'n_kv_heads'"),
    ],
    "sliding_window": [
        ("W0", {"window": 0},
         r"window \(W, keys including the query itself\) must be an int >= 1, got 0"),
        ("W-negative", {"window": -3}, r"must be an int >= 1, got -3"),
        ("W-float", {"window": 2.5}, r"sliding_window.window must be int, got 2.5"),
        ("heads-divide-width", {"d_model": 30}, r"n_heads \(4\) must divide d_model \(30\)"),
        ("kv-heads", {"window": 4, "n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
        ("unknown-key", {"windw": 4}, r"'windw'; did you mean 'window'"),
    ],
    "linear": [
        ("unknown-map", {"feature_map": "gelu"},
         r"feature_map 'gelu' unknown; known: \['elu\+1', 'relu'"),
        ("zero-feature-dim", {"feature_dim": 0}, r"feature_dim must be a positive int, got 0"),
        ("identity-normalized", {"feature_map": "identity"},
         r"normalize=True needs a positive feature map"),
        ("zero-eps", {"eps": 0.0}, r"eps must be positive, got 0.0"),
        ("negative-chunk", {"chunk_size": -4}, r"chunk_size must be a positive int, got -4"),
        ("heads-divide-width", {"n_heads": 5}, r"n_heads \(5\) must divide d_model \(32\)"),
        ("unknown-backend", {"backend": "triton"}, r"unknown linear_attn backend 'triton'"),
        ("unknown-key", {"feature_mapp": "relu"}, r"'feature_mapp'; did you mean 'feature_map'"),
    ],
    "ssm": [
        ("zero-state", {"d_state": 0}, r"d_state must be a positive int, got 0"),
        ("heads-divide-inner", {"n_heads": 3},
         r"n_heads \(3\) must divide d_inner = expand \* d_model \(2 \* 16 = 32\)"),
        ("groups-divide-heads", {"n_groups": 3}, r"n_groups \(3\) must divide n_heads \(4\)"),
        ("dt-range", {"dt_min": 0.5, "dt_max": 0.1},
         r"dt_min \(0.5\) must not exceed dt_max \(0.1\)"),
        ("negative-dt", {"dt_min": -1.0}, r"dt_min must be a positive number, got -1.0"),
        ("unknown-backend", {"backend": "triton"}, r"unknown ssd backend 'triton'"),
        ("unknown-conv-backend", {"conv_backend": "fft"}, r"unknown causal_conv backend 'fft'"),
        ("unknown-key", {"d_sate": 8}, r"'d_sate'; did you mean 'd_state'"),
    ],
    "mla": [
        ("R-over-D", {"d_model": 256, "kv_lora_rank": 300},
         r"kv_lora_rank \(300\) must not exceed d_model \(256\)"),
        ("q-rank-over-D", {"d_model": 256, "q_lora_rank": 512},
         r"q_lora_rank \(512\) must not exceed d_model \(256\)"),
        ("heads-divide-width", {"d_model": 30}, r"n_heads \(4\) must divide d_model \(30\)"),
        ("R-zero", {"kv_lora_rank": 0}, r"mla.kv_lora_rank must be a positive"),
        ("odd-rope-dim", {"qk_rope_head_dim": 3}, r"even qk_rope_head_dim, got 3"),
        ("unknown-backend", {"backend": "fast"}, r"unknown attention backend 'fast'"),
        ("unknown-key", {"kv_rank": 8}, r"'kv_rank'; did you mean 'kv_lora_rank'"),
    ],
    "moe": [
        ("k-over-E", {"top_k": 5}, r"top_k \(5\) must not exceed n_heads \(4\)"),
        ("k-zero", {"top_k": 0}, r"moe.top_k must be a positive int, got 0"),
        ("heads-divide-width", {"n_heads": 5}, r"n_heads \(5\) must divide d_model \(32\)"),
        ("negative-aux-weight", {"aux_loss_weight": -1.0},
         r"aux_loss_weight must be >= 0, got -1.0"),
        ("unknown-key", {"topk": 2}, r"'topk'; did you mean 'top_k'"),
    ],
}


def bad_configs():
    for name in NAMES:
        d_model = FAMILIES[name][0]["d_model"] if name in FAMILIES else 32
        rows = [("misspelt-n_heads", {"n_hedas": 2}, "'n_hedas'; did you mean 'n_heads'"),
                ("zero-heads", {"n_heads": 0}, rf"{name}\.n_heads must be a positive int, got 0"),
                *BAD_CONFIGS.get(name, [])]
        for label, kwargs, message in rows:
            yield pytest.param(name, {"d_model": d_model, "n_heads": 4, **kwargs}, message,
                               id=f"{name}-{label}")


@pytest.mark.parametrize("name, kwargs, message", list(bad_configs()))
def test_bad_config_names_the_value(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build(name, **kwargs)


# ---------------------------------------------------------------- facts

def small_kwargs(name):
    """The keywords make_block builds the block with, d_model included."""
    return {"d_model": 32, "n_heads": 4, **SMALL_CAPS.get(name, {})}


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_declares_complete_facts(name):
    """What train reads about a block (zoo/facts.py) is whole: a knob of its config with
    ascending values, a legend naming it, a table cell from a built config, a valid cache
    kind with the report row its state is read from, checks that build, mirrors known."""
    facts, kw = zoo.facts_of(name), small_kwargs(name)
    fields = {f.name for f in dataclass_fields(zoo.block_class(name).Config)}
    s = facts.sizing
    for knob, values in (s.knob, s.values), s.state_knob:
        assert knob in fields, f"{name}: knob {knob!r} is not a config field"
        got = list(values(kw, 32, 16))
        assert got and all(isinstance(v, int) for v in got), (name, knob, got[:8])
        assert got == sorted(set(got)), f"{name}: {knob}'s values are not ascending"
    assert s.legend.startswith(f"{s.symbol} = {s.knob}"), s.legend  # says what it means
    cell = s.describe(zoo.build(name, **kw).config)
    assert isinstance(cell, str) and cell, name
    assert facts.cache in CACHE_KINDS
    assert facts.cache == "kv" or (facts.state_row or "").startswith("inference."), name
    for check in facts.checks:
        for n in (1, 2, 5):
            block = check.kwargs(n)
            assert block["block"] == name, (name, check.suffix)
            zoo.build(name, **{**kw, **{k: v for k, v in block.items() if k != "block"}})
            assert str(n) in check.suffix.format(n=n) and str(n) in check.text.format(n=n)
    assert len({c.advice for c in facts.checks}) == len(facts.checks), "one check per advice"
    assert set(facts.mirrors) <= set(HF_KINDS)


def test_checks_name_their_variants_apart_and_each_hf_kind_has_one_block():
    suffixes = [c.suffix for name in NAMES for c in zoo.facts_of(name).checks]
    assert len(suffixes) == len(set(suffixes)), suffixes
    mirrors = [k for name in NAMES for k in zoo.facts_of(name).mirrors]
    assert len(mirrors) == len(set(mirrors)), mirrors


class ToyWindow(SlidingWindowAttention):
    """A new block as a user would add one: its module's class and its facts, nothing
    else (its math is sliding_window's)."""

    facts = Facts(
        Sizing("window", lambda kw, D, T: range(2, T + 1), "W", "W = window: a toy",
               lambda c: f"toy W={c.window}"),
        cache="kv", mirrors=("sliding",),
        checks=(Check("cheaper_block", "toy_w{n}", lambda n: {"block": "toy", "window": n + 1},
                      "a toy window of W = {n} + 1"),))


@pytest.fixture
def toy(monkeypatch):
    """ToyWindow registered as "toy" (its one registry row), taking the sliding kind
    over from sliding_window for the test; unregistered afterwards."""
    sliding = zoo.block_class("sliding_window")
    monkeypatch.setattr(sliding, "facts", dataclasses.replace(sliding.facts, mirrors=()))
    register("toy")(ToyWindow)
    yield ToyWindow
    unregister("toy")


def test_a_new_block_is_one_module_and_one_registry_row(toy):
    from train.commands.blocks import blocks_document
    from train.commands.check.emit import candidates
    from train.commands.check.outcome import block_text
    from train.commands.pick import Constraints, pick_document
    from train.config.parse import parse_variant_check
    from train.hf import zoo_blocks
    from train.sizing.families import describe, shapes, sizing_table
    from train.sizing.match import state_knob

    # sizing: pick, blocks and match.state
    assert sizing_table()["toy"] is toy.facts.sizing and state_knob("toy")[0] == "window"
    assert "toy" in [s.block for s in shapes(64, 4)]
    doc = pick_document(Constraints(d_model=64, n_heads=4, n_layers=2, seq_len=32,
                                    cache_budget=8192, cache_dtype="bf16"))
    assert "toy" in {r["family"] for r in doc["candidates"]}
    rows = [r for r in blocks_document(64, 4, 32)["blocks"] if r["family"] == "toy"]
    assert rows and all(r["knobs"].startswith("toy W=") for r in rows)  # its presets
    assert describe("toy", zoo.build("toy", d_model=64, n_heads=4, window=5).config) == "toy W=5"
    # the advice checks: the emitted variants, the check record, the verdict's words
    assert candidates(3)["toy_w3"] == {"block": "toy", "window": 4}
    record = {"of": "mha", "advice": "cheaper_block", "state": 3}
    assert parse_variant_check(record, "variants.cheap", "toy") == record
    assert block_text("toy", "cheaper_block", 3) == "a toy window of W = 3 + 1"
    # the HF per-kind table
    assert zoo_blocks()["sliding"] == "toy"


def test_a_block_registers_only_with_its_own_facts(toy):
    class Bare(SlidingWindowAttention):  # inherits sliding_window's facts: not its own
        pass

    with pytest.raises(TypeError, match=r"block class Bare \(registered as 'bare'\) must "
                                        r"declare `facts = Facts\(...\)`"):
        register("bare")(Bare)
    twin = type("Twin", (ToyWindow,), {"facts": ToyWindow.facts})
    with pytest.raises(ValueError, match=r"block class Twin \(registered as 'twin'\) mirrors "
                                         r"the HF layer kind 'sliding', which 'toy' already"):
        register("twin")(twin)
    assert "bare" not in zoo.names() and "twin" not in zoo.names()
