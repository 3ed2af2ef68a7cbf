"""A cache made for one batch size, used with an input of another, is a named error for
every registered block (zoo/block.py check_cache), not a broadcasting failure inside the
block's math; a cache of the input's batch size still decodes."""

import pytest
import torch

import zoo
from tests.zoo.test_contract import make_block, make_x

NAMES = zoo.names()


@pytest.mark.parametrize("held, given", [(2, 3), (3, 1)])
@pytest.mark.parametrize("name", NAMES)
def test_a_cache_of_another_batch_size_is_named(name, held, given):
    block = make_block(name)
    cache = block.init_cache(held, 16)
    with pytest.raises(ValueError) as err:
        block(make_x(B=given, T=1), cache=cache)
    message = str(err.value)
    assert message.startswith(f"{block.kind}: the cache holds {held} sequences")
    assert f"x has {given}" in message and f"batch={given}" in message


@pytest.mark.parametrize("name", NAMES)
def test_a_cache_of_the_same_batch_size_decodes(name):
    block = make_block(name).eval()
    cache = block.init_cache(3, 16)
    with torch.no_grad():
        y = block(make_x(B=3, T=1), cache=cache)  # [B, 1, D]
    assert y.shape == (3, 1, make_x(B=3, T=1).shape[-1])
