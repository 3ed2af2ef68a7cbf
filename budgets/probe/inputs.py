"""The inputs modules are called with, collected by forward pre-hooks during a forward.

    with module_inputs({"layer0": model.layers[0]}) as seen:
        model(batch)
    seen["layer0"]                                  # [B, T, D], detached

The one collector the probes (budgets/probe/blocks.py, budgets/hf/probe.py,
budgets/probe/cache_rows.py) and compress (train/commands/compress/target/zoo_surgery.py) watch a
model's blocks, layers and heads with. A module's input is the first tensor it is called
with (first_tensor): the first positional argument, else the keyword `x` (zoo) or
`hidden_states` (Hugging Face).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping

import torch
from torch import nn


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A module's input from a forward pre-hook: the first positional argument, else the
    keyword `x` (zoo) or `hidden_states` (Hugging Face)."""
    x = args[0] if args else kwargs.get("x", kwargs.get("hidden_states"))
    return x if isinstance(x, torch.Tensor) else None


@contextlib.contextmanager
def module_inputs(modules: Mapping[Hashable, nn.Module], first: bool = False,
                  clone: bool = False) -> Iterator[dict]:
    """Inside, seen[key] is the input of modules[key] (first_tensor), detached, at its
    latest call, or with `first` at its first (a key the caller pops is taken again at
    the module's next call); `clone`: a copy, where the model may update it in place.
    A call without a tensor input leaves it unseen. The hooks are removed on exit."""
    seen: dict = {}

    def hook_for(key):
        def hook(module, args, kwargs):
            x = first_tensor(args, kwargs)
            if x is not None and not (first and key in seen):
                seen[key] = x.detach().clone() if clone else x.detach()
        return hook

    handles = [m.register_forward_pre_hook(hook_for(key), with_kwargs=True)
               for key, m in modules.items()]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
