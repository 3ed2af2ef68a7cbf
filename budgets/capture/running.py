"""Which modules' forwards are running: the stack a capture reads a call's caller from.

    with running(model, stack):     # stack[-1]: the innermost module running
        model(ids)

A function call (a scan, an SDPA call) knows nothing of the module that made it; the
innermost module whose forward is running when it happens is that module.
"""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def running(model: nn.Module, stack: list):
    """`stack` holds the modules whose forward is running, innermost last."""
    def enter(module, args):
        stack.append(module)

    def leave(module, args, out):
        if stack and stack[-1] is module:
            stack.pop()

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(enter),
                                                     m.register_forward_hook(leave))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
