"""Model surgery that is undone: the changes that project a model's cache, then restore it.

    with projected(target, P):          # target.apply(surgery, P) in force
        loss = target.evaluate(...)     # every change undone on exit
    with projected(target, P, {(layer, g): (W, s)}):   # and those KV heads windowed

A target (protocol.py: zoo_surgery.py's ZooTarget, hf_surgery.py's HFTarget)
applies its projections through a Surgery, which records how to undo each one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ..bases.lowrank import project_rows


class Surgery:
    """Changes to a model that are undone in reverse order: parameters overwritten in
    place, methods patched on an instance, forward hooks, contexts entered."""

    def __init__(self):
        self.undo: list[Callable[[], None]] = []

    def overwrite(self, param: torch.Tensor, value: torch.Tensor) -> None:
        """param's storage (a parameter or a view of one, e.g. GPT-2's fused k/v slice)
        takes value; detached, so autograd's view rules do not apply."""
        target = param.detach()
        saved = target.clone()
        target.copy_(value)
        self.undo.append(lambda: target.copy_(saved))

    def patch(self, obj: nn.Module, name: str, fn: Callable) -> None:
        setattr(obj, name, fn)  # an instance attribute shadows the class's method
        self.undo.append(lambda: delattr(obj, name))

    def hook(self, module: nn.Module, fn: Callable) -> None:
        self.undo.append(module.register_forward_hook(fn).remove)

    def pre_hook(self, module: nn.Module, fn: Callable) -> None:
        self.undo.append(module.register_forward_pre_hook(fn).remove)

    def enter(self, context: contextlib.AbstractContextManager) -> None:
        """A context manager entered now and exited in its turn on restore (a model made
        to attend through another function, budgets/hf/capture.py transformed)."""
        context.__enter__()
        self.undo.append(lambda: context.__exit__(None, None, None))

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()


def project_linear(surgery: Surgery, weight: torch.Tensor, bias: torch.Tensor | None,
                   P: torch.Tensor) -> None:
    """W -> P W and b -> P b per head (rows of nn.Linear's [out, in] weight)."""
    surgery.overwrite(weight, project_rows(weight, P))
    if bias is not None:
        surgery.overwrite(bias, project_rows(bias[:, None], P)[:, 0])


@contextlib.contextmanager
def projected(target, P: dict, windows: dict | None = None):
    """target.model with target.apply(surgery, P) in force (and the KV heads of `windows`,
    {(layer, g): (W, s)}, read through their windows); every change undone on exit."""
    surgery = Surgery()
    try:
        if windows:
            target.apply(surgery, P, windows)
        else:
            target.apply(surgery, P)
        yield target.model
    finally:
        surgery.restore()


@contextlib.contextmanager
def watching(target, record, watch: Callable):
    """Inside, watch(surgery, record) has installed its hooks; all removed on exit."""
    surgery = Surgery()
    try:
        watch(surgery, record)
        yield record
    finally:
        surgery.restore()
