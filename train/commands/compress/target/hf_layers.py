"""Which layers of a Hugging Face model compress compresses, which it keeps, by the model's numbers.

    numbers = attention_numbers(model, maps)     # each attention layer's own layer number
    kept = kept_mixers(model, ids, maps)         # every other mixer: layer, class, state

A hybrid (Qwen3-Next's Gated DeltaNet, Jamba's and Falcon-H1's Mamba, LFM2's short
convolutions beside attention) holds two caches: the attention layers' keys and values,
which grow with T and which compress projects, and every other mixer's state, of a size
fixed per sequence, kept in full. A layer is named by its index in the model's layer list
(budgets/probe/places.py), the number `layer_types` counts and the module path shows,
never by its place among the attention layers.

A kept state's size is read from the model's own cache (transformers' per-layer cache,
which holds the conv and recurrent states of such layers) after prefills of two lengths:
exact, one figure per sequence, and a layer outside the attention whose cache grows with
the prefill is refused, since compress would leave a growing cache uncounted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from budgets.hf.delta import capture_delta
from budgets.hf.hooked import capture_hooked
from budgets.hf.scans import capture_scans
from budgets.hf.unmeasured import unmeasured_mixers
from budgets.probe.places import layer_at_call, mixer_places

STATE_LENGTHS = (4, 12)  # prefills the kept states are read after: equal sizes, fixed


@dataclass(frozen=True)
class Kept:
    """A mixer whose state compress keeps in full: its layer (the model's number), its
    module class, and the elements its cache holds per sequence (None: not known)."""

    layer: int
    kind: str
    elements: int | None


def attention_numbers(model: nn.Module, maps: list) -> list[int]:
    """Each attention call's layer number, by its module path; attention shared between
    layers (zamba's one block: the same W_K in layers 1 and 3) is refused, since compress
    fits a basis per layer and a weight shared by several cannot hold each."""
    numbers = [p.layer for p in mixer_places(model, maps)]
    shared = _sharing(maps)
    if shared:
        raise ValueError(f"the {model.config.model_type} model's attention layers "
                         f"{', '.join(shared)} share their weights: compress fits a basis "
                         f"per layer, and one W_K cannot be projected by several")
    return numbers


def _sharing(maps: list) -> list[str]:
    """The module paths of attention calls whose module or K/V weights another call has."""
    owners: dict[int, list[str]] = {}
    for m in maps:
        held = {id(m.module)} | {id(p) for rows in (m.k, m.v) if rows is not None
                                 for p in rows.linear.parameters()}
        for key in held:
            owners.setdefault(key, []).append(m.name)
    return sorted({name for names in owners.values() if len(names) > 1 for name in names})


def kept_mixers(model: nn.Module, ids: torch.Tensor, maps: list) -> list[Kept]:
    """Every mixer but the attention calls `maps`, in layer order, with its state's
    elements per sequence (None where the cache does not show them); a layer whose cache
    grows with the tokens but holds no attention compress found is refused in one line."""
    found = _captured(model, ids)
    attention = {m.name for m in maps}
    others = unmeasured_mixers(model, sorted(attention | {name for _, _, name in found}))
    mixers = sorted({(n, kind) for n, kind, _ in found}
                    | {(m["layer"], m["class"]) for m in others})
    states = _state_elements(model, ids, set(attention_numbers(model, maps)))
    # a mixer whose cache layer shows no state keeps it elsewhere (MiniMax's own cache)
    return [Kept(n, kind, None if states is None else states.get(n) or None)
            for n, kind in mixers]


def _captured(model: nn.Module, ids: torch.Tensor) -> list[tuple[int, str, str]]:
    """(layer number, module class, module path) of each mixer the probe's captures read
    (Mamba scans, the delta rule, short convolutions, RG-LRU, lightning attention)."""
    calls, running = [], []
    with torch.no_grad(), layer_at_call(model) as now:
        def seen(call) -> None:
            calls.append(call)
            running.append(now())
        with capture_scans(model, seen), capture_delta(model, seen), \
                capture_hooked(model, seen):
            model(input_ids=ids, use_cache=False)
    names = {m: n for n, m in model.named_modules()}
    maps = [_Named(c.module, names[c.module]) for c in calls if c.module in names]
    at = [r for c, r in zip(calls, running, strict=True) if c.module in names]
    places = mixer_places(model, maps, at)
    return [(p.layer, type(m.module).__name__, m.name) for p, m in zip(places, maps,
                                                                       strict=True)]


@dataclass(frozen=True)
class _Named:
    module: nn.Module
    name: str


def _state_elements(model: nn.Module, ids: torch.Tensor,
                    attention: set[int]) -> dict[int, int] | None:
    """{layer: elements its conv and recurrent states hold per sequence}, the same after
    prefills of each STATE_LENGTHS; None where the model's cache is not transformers'
    per-layer one. A layer outside `attention` whose cache grows is refused."""
    sizes = [_cache_sizes(model, ids[:1, :n]) for n in STATE_LENGTHS]
    if any(s is None for s in sizes):
        return None
    (short_states, short_kv), (long_states, long_kv) = sizes
    growing = sorted(n for n in long_kv if n not in attention
                     and (long_kv[n] != short_kv.get(n) or long_states[n] != short_states[n]))
    if growing:
        raise ValueError(f"the {model.config.model_type} model's layers {growing} hold a cache "
                         f"that grows with the tokens but call no attention compress found: "
                         f"compress cannot count or project it")
    changed = sorted(n for n in long_states if long_states[n] != short_states.get(n))
    if changed:
        return None  # a state of attention layers that grows: not a fixed figure
    return {n: e for n, e in long_states.items() if e}


def _cache_sizes(model: nn.Module, ids: torch.Tensor
                 ) -> tuple[dict[int, int], dict[int, int]] | None:
    """Per layer of the cache a prefill of ids [1, n] leaves, (the elements of its conv and
    recurrent states, of its keys and values); None without a per-layer cache."""
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = next((out[k] for k in ("cache", "past_key_values") if k in out), None)
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    states, kv = {}, {}
    for n, layer in enumerate(layers):
        held = [*(getattr(layer, "conv_states", None) or {}).values(),
                *(getattr(layer, "recurrent_states", None) or {}).values()]
        states[n] = sum(t.numel() for t in held if isinstance(t, torch.Tensor))
        kv[n] = sum(t.numel() for t in (getattr(layer, "keys", None),
                                        getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor))
    return states, kv


def spans(numbers: list[int]) -> str:
    """'0-2, 4': runs of consecutive layer numbers as first-last."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] + 1 == n:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def kept_text(kept: list[Kept]) -> str:
    """'layers 0-2 (Qwen3NextGatedDeltaNet)', grouped by class in layer order."""
    by_kind: dict[str, list[int]] = {}
    for k in kept:
        by_kind.setdefault(k.kind, []).append(k.layer)
    return "; ".join(f"layer{'s' if len(ns) > 1 else ''} {spans(ns)} ({kind})"
                     for kind, ns in by_kind.items())


def kept_verb(kept: list[Kept]) -> str:
    """'keeps its' for one layer, 'keep their' for several."""
    return "keeps its" if len(kept) == 1 else "keep their"
