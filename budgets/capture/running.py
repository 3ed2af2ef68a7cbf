"""Which modules' forwards are running, and the modeling functions a capture wraps.

    with running(model, stack):     # stack[-1]: the innermost module running
        model(ids)
    with wrapped_functions(model, ("mamba2_chunk_scan",), wrap):   # wrap(fn, name) -> fn
        model(ids)

A function call (a scan, an SDPA call) knows nothing of the module that made it; the
innermost module whose forward is running when it happens is that module. A capture that
reads a modeling module's own function (a Mamba scan, a delta-rule chunk function) swaps
it, in every module the model's classes come from, for its wrapper for the duration.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable

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


@contextlib.contextmanager
def wrapped_functions(model: nn.Module, names: Iterable[str],
                      wrap: Callable[[Callable, str], Callable]):
    """Inside, each function named in `names` of each module `model`'s classes are
    defined in is `wrap(fn, name)`; the originals are restored on the way out (on an
    exception too)."""
    saved = []
    for module_name in dict.fromkeys(type(m).__module__ for m in model.modules()):
        module = sys.modules.get(module_name)
        for attr in names:
            fn = getattr(module, attr, None) if module is not None else None
            if callable(fn):
                saved.append((module, attr, fn))
                setattr(module, attr, wrap(fn, attr))
    try:
        yield
    finally:
        for module, attr, fn in reversed(saved):
            setattr(module, attr, fn)
