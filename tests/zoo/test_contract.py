"""The block contract, checked on every registered block (a new block is covered on arrival)."""

import pytest
import torch

import budgets
import zoo

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
}
# A full softmax over the past has an unbounded kernel: its mixing cap is T/2, a side of
# the past->future block itself, so no length makes it bind; for these the probe test
# asks instead that a random block realizes more than rank one there.
UNBOUNDED_MIXING = {"softmax", "mla", "moe"}
T_PROBE = 24  # the past->future block M[12:, :12] is 12 x 12


def make_block(name, seed=0):
    torch.manual_seed(seed)
    return zoo.build(name, d_model=32, n_heads=4, **SMALL_CAPS.get(name, {})).to(torch.float64)


def make_x(B=2, T=13, seed=1):
    return torch.randn(B, T, 32, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_is_causal(name):
    block = make_block(name)
    x = make_x()
    x2 = x.clone()
    x2[:, 8:] = torch.randn_like(x2[:, 8:])
    torch.testing.assert_close(block(x)[:, :8], block(x2)[:, :8], atol=1e-10, rtol=0)


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


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_decodes_like_its_parallel_forward(name):
    block = make_block(name)
    x = make_x()
    cache = block.init_cache(batch=2, max_len=13)
    pieces = [block(x[:, :6], cache=cache)]
    pieces += [block(x[:, t:t + 1], cache=cache) for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), block(x), atol=1e-9, rtol=1e-7)


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


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("x, message", [
    (torch.randn(2, 5, 31, dtype=torch.float64), r"\[B, T, 32\], got \(2, 5, 31\)"),
    (torch.ones(2, 5, 32, dtype=torch.long), "floating-point x, got torch.int64"),
    (torch.randn(2, 5, 32, dtype=torch.float32), "x is torch.float32 but the weights are"),
], ids=["width", "integer", "dtype-mismatch"])
def test_registered_block_names_bad_input(name, x, message):
    with pytest.raises(ValueError, match=message):
        make_block(name)(x)


@pytest.mark.parametrize("name", NAMES)
def test_registered_block_rejects_unknown_config_keys(name):
    with pytest.raises(ValueError, match="'n_hedas'; did you mean 'n_heads'"):
        zoo.build(name, d_model=32, n_heads=4, n_hedas=2)
