"""Where each captured mixer call sits in its model: the decoder layer's own number and,
where one layer holds several mixers, which of them.

    with layer_at_call(model) as now:       # now(): the layer list item running, or None
        model(ids)
    places = mixer_places(model, maps, at_call)   # one Place per call, in call order

A report names a layer by the model's own number: its index in the model's layer list,
the number `layer_types` counts and the module path shows (`model.layers.3.self_attn` is
layer 3), never its place among the calls a capture read. A model whose capture skips
some layers (a mixer no source reads) or makes several calls per layer (falcon_h1's
attention beside its SSM, zamba's Mamba scans beside its shared attention) would
otherwise report layer numbers that name other layers.

A decoder layer is an item of an nn.ModuleList (residual_owner's rule). A module shared
by several layers (zamba's one attention block) has one path but runs in each: the layer
running at its call, watched by forward hooks on the lists' items, is its layer, and its
path under that layer is its name there. A mixer that is itself an item of a list inside a
decoder layer (longcat_flash's two MLA sublayers, `model.layers.0.self_attn.1`) is numbered
as its model numbers it, by its `layer_idx`: the count the config's num_hidden_layers and
the cache keep (2 per decoder layer there), so each sublayer has a number of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch import nn

from .blocks import residual_owner


@dataclass(frozen=True)
class Place:
    """One mixer call's decoder layer (the model's index) and its module path there;
    `mixer` tells the mixers of one layer apart (None where the layer holds one)."""

    layer: int
    name: str
    mixer: str | None = None


# the layer-list items running at a call, outermost first: (the list, the item's index)
Running = tuple[tuple[nn.ModuleList, int], ...]


@contextlib.contextmanager
def layer_at_call(model: nn.Module) -> Iterator[Callable[[], Running]]:
    """Inside, now() is the layer-list items whose forwards are running, outermost first:
    the decoder layer a call is made in is among them (a list inside a layer, of experts
    or heads, is too: mixer_places picks the list the mixer's own path runs through)."""
    stack: list[tuple[nn.ModuleList, int]] = []

    def enter(owner: nn.ModuleList, i: int):
        return lambda module, args: stack.append((owner, i))

    def leave(module, args, out):
        if stack:
            stack.pop()

    handles = [h for m in model.modules() if isinstance(m, nn.ModuleList)
               for i, item in enumerate(m)
               for h in (item.register_forward_pre_hook(enter(m, i)),
                         item.register_forward_hook(leave))]
    try:
        yield lambda: tuple(stack)
    finally:
        for h in handles:
            h.remove()


def layer_number(model: nn.Module, name: str) -> int | None:
    """The layer number in a module path (`model.layers.3.self_attn` -> 3): its residual
    owner's index in its layer list; None outside any list."""
    owner = residual_owner(model, name)
    last = owner.rpartition(".")[2] if owner else ""
    return int(last) if last.isdigit() else None


def _layer_list(model: nn.Module, name: str) -> nn.ModuleList | None:
    """The layer list a module path runs through: its residual owner's list."""
    owner = residual_owner(model, name)
    return None if owner is None else model.get_submodule(owner.rpartition(".")[0])


def _sublayer_number(model: nn.Module, name: str, module: nn.Module) -> int | None:
    """The `layer_idx` of a mixer that is an item of a list inside another list's item
    (sublayers of a decoder layer), else None."""
    number = getattr(module, "layer_idx", None)
    if residual_owner(model, name) != name or not isinstance(number, int):
        return None
    inside = name.rpartition(".")[0]  # the sublayers' list
    return number if residual_owner(model, inside) is not None else None


def _running_in(running: Running, layers: nn.ModuleList | None) -> int | None:
    """The item of `layers` running at a call (else the innermost item running)."""
    for owner, i in reversed(running):
        if layers is None or owner is layers:
            return i
    return None


def _path_in(model: nn.Module, module: nn.Module, layer: int, first: str) -> str:
    """`module`'s path under decoder layer `layer` (a shared module has one per layer it
    is registered in), else `first`, its first path."""
    for path, m in model.named_modules(remove_duplicate=False):
        if m is module and layer_number(model, path) == layer:
            return path
    return first


def _relative(model: nn.Module, name: str) -> str:
    """A mixer's path inside its decoder layer (`model.layers.3.self_attn` -> self_attn)."""
    owner = residual_owner(model, name)
    return name[len(owner) + 1:] if owner and name.startswith(f"{owner}.") else name


def mixer_places(model: nn.Module, maps: list, at_call: list[Running] | None = None
                 ) -> list[Place]:
    """One Place per mixer call (`maps`: .module, .name, in call order). Its layer: the
    item of its layer list running at the call (`at_call`, layer_at_call's), else the
    number in its module path, else its call index (a model with no layer list). In a
    layer with several calls, each is told apart by its path inside the layer, and a
    module called more than once there (zamba's Mamba scans) by its call's order:
    `mamba[1]`."""
    found = []
    for j, m in enumerate(maps):
        own = _sublayer_number(model, m.name, m.module)
        if own is not None:
            found.append(Place(own, m.name))
            continue
        seen = None if at_call is None else _running_in(at_call[j],
                                                        _layer_list(model, m.name))
        number = seen if seen is not None else layer_number(model, m.name)
        if number is None:
            found.append(Place(j, m.name))
            continue
        name = m.name if seen is None else _path_in(model, m.module, number, m.name)
        found.append(Place(number, name))
    return _told_apart(model, maps, found)


def _told_apart(model: nn.Module, maps: list, found: list[Place]) -> list[Place]:
    per_layer: dict[int, list[int]] = {}
    for j, p in enumerate(found):
        per_layer.setdefault(p.layer, []).append(j)
    out = list(found)
    for calls in per_layer.values():
        if len(calls) == 1:
            continue
        repeats: dict[nn.Module, list[int]] = {}
        for j in calls:
            repeats.setdefault(maps[j].module, []).append(j)
        for js in repeats.values():
            for k, j in enumerate(js):
                label = _relative(model, found[j].name)
                out[j] = Place(found[j].layer, found[j].name,
                               f"{label}[{k}]" if len(js) > 1 else label)
    return out


def layer_count(model: nn.Module, places: list[Place]) -> int:
    """The model's decoder layers: its config's count where it states one, else one past
    the largest number placed."""
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return int(n) if isinstance(n, int) else max(p.layer for p in places) + 1
