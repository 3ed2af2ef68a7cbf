"""The decoder layers of a Hugging Face model whose token mixer the probe does not read.

    missing = unmeasured_mixers(model, measured)   # measured: attention / SSD module names

A model may mix tokens by something no capture reads: not transformers' attention interface,
a Mamba scan (budgets/hf/scans.py), a delta rule's chunk function (budgets/hf/delta.py) or a
mixer read from its forward (budgets/hf/hooked.py: short convolutions, RG-LRU, lightning
attention); xLSTM's mLSTM layers, say. Such a layer shows no call to the captures, so it
is found as a decoder layer (an item of the model's layer list) holding none of the
measured modules, and named, with its mixer's module class, rather than silently left out
of the report.
"""

from __future__ import annotations

import re

from torch import nn

# children of a decoder layer that do not mix tokens: norms, the MLP, experts, dropout
NOT_A_MIXER = re.compile(r"norm|mlp|moe|expert|dropout|feed_?forward|ffn|identity|act",
                         re.IGNORECASE)


def _layer_lists(model: nn.Module, measured: set[str]) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of decoder layers: the ModuleLists holding a measured module
    (by name), or, when none was measured, those as long as the config's layer count."""
    n_layers = getattr(model.config, "num_hidden_layers", None)
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        holds = any(m.startswith(f"{name}.") for m in measured)
        if holds or (not measured and len(module) == n_layers):
            found.append((name, module))
    return found


def mixer_of(layer: nn.Module) -> tuple[str, nn.Module]:
    """(name, module) of a decoder layer's token mixer: its first child that is not a norm,
    an MLP, experts or dropout; the layer itself when every child is one of those."""
    for name, child in layer.named_children():
        if not NOT_A_MIXER.search(name) and not NOT_A_MIXER.search(type(child).__name__):
            return name, child
    return "", layer


def unmeasured_mixers(model: nn.Module, measured: list[str]) -> list[dict]:
    """Per decoder layer holding none of the `measured` modules (by name): {model_type,
    layer (its index in the layer list), name (the mixer's module path), class}."""
    model_type = getattr(model.config, "model_type", type(model).__name__)
    names = set(measured)
    out = []
    for list_name, layers in _layer_lists(model, names):
        for i, layer in enumerate(layers):
            prefix = f"{list_name}.{i}" if list_name else str(i)
            if any(m == prefix or m.startswith(f"{prefix}.") for m in names):
                continue
            name, mixer = mixer_of(layer)
            out.append({"model_type": model_type, "layer": i,
                        "name": f"{prefix}.{name}" if name else prefix,
                        "class": type(mixer).__name__})
    return out


def unmeasured_text(mixers: list[dict]) -> str:
    """'layers 0, 2 (Lfm2ShortConv)' grouped by class, for the report and errors."""
    by_class: dict[str, list[int]] = {}
    for m in mixers:
        by_class.setdefault(m["class"], []).append(m["layer"])
    return "; ".join(f"layer{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))} ({c})"
                     for c, ls in by_class.items())
