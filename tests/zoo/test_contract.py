"""The block contract, checked on every registered block (a new block is covered on arrival)."""

import pytest
import torch

import budgets
import zoo

NAMES = zoo.names()


def make_block(name, seed=0):
    torch.manual_seed(seed)
    return zoo.build(name, d_model=32, n_heads=4).to(torch.float64)


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
    x = make_x().float()
    declared = block.budget(seq_len=13)
    assert declared.block == name and declared.params == block.param_count()
    assert block.mixing_matrices(x).shape[-2:] == (13, 13)
    layer = budgets.probe_model(torch.nn.Sequential(block), x)["layers"][0]
    q = layer["quantities"]
    assert max(q["past_future"]["numerical_rank"]) <= declared.mixing
    for name_q in [n for n in q if n.startswith("inference.")]:
        assert max(q[name_q]["numerical_rank"]) <= declared.inference, name_q
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
