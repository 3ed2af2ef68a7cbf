"""Fixtures shared by the zoo tests."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns: what a path allocates."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


@pytest.fixture
def quadratic_allocations():
    """f(block, x) -> shapes with two dims >= T allocated by forward + backward on x [B, T, D].

    Choose T above every width of the block, so two dims >= T can only be a T x T tensor.
    """

    def run(block, x):
        T = x.shape[1]
        with Shapes() as seen:
            block(x).sum().backward()
        assert any(T in s for s in seen.shapes)  # the recorder saw the sequence
        return [s for s in seen.shapes if sum(d >= T for d in s) >= 2]

    return run


def _rel_err(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.fixture
def rel_err():
    """rel_err(got, want) -> ||got - want|| / ||want||, computed in fp64."""
    return _rel_err
