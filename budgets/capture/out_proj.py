"""The output projection W_O of an attention module: the linear whose input is the call's
attention output [B, T, H*V], found by forward pre-hooks.

    with out_projections(calls, attention_modules):   # calls: module -> AttentionCall
        model(ids)                                     # each call.out_proj set

Nothing here imports transformers (GPT-2's Conv1D is recognized by its class name).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .attention import AttentionCall


def projection_weight(module: nn.Module) -> torch.Tensor | None:
    """A linear layer's weight as [out, in] (Conv1D stores [in, out]), else None."""
    if isinstance(module, nn.Linear):
        return module.weight
    w = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2:
        return w.T
    return None


@contextlib.contextmanager
def out_projections(calls: dict[nn.Module, AttentionCall], attention: list[nn.Module]):
    """Inside a capture (whose calls by module are `calls`): a pre-hook on every linear
    below each attention module; the one whose input is that module's attention output
    becomes its call's out_proj."""
    def hook(owner):
        def pre(module, args):
            call = calls.get(owner)
            if call is None or call.output is None or call.out_proj is not None or not args:
                return
            x = args[0]
            if isinstance(x, torch.Tensor) and x.numel() == call.output.numel() and \
                    torch.equal(x.reshape(call.output.shape), call.output):
                call.out_proj = module
        return pre

    handles = [m.register_forward_pre_hook(hook(a)) for a in attention
               for m in a.modules() if projection_weight(m) is not None]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
