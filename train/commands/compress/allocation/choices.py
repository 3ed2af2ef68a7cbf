"""What each head keeps, chosen by predicted loss per byte: ranks alone, or one of three.

    setting = sensitivity_setting(slots, sens, ratio, nbytes, T)       # --alloc sensitivity
    setting = mixed_setting(target, sens, ratio, nbytes, T, grid)      # --alloc mixed
    setting_bytes(slots, setting, nbytes, T)    # cache_bytes with the windows' share
    layer_choices(slots, setting)               # per layer: heads full, low rank, window

A Setting is the ranks of every slot's heads ({slot key: [r per head]}) and the KV heads
read through a window ({(layer, g): (W, s)}, kept at full width for the W + s tokens).

sensitivity: per slot and head a rank r (keys and values apart), the sum of the heads'
predicted loss changes (sensitivity.py) least within full / ratio bytes, from the uniform
ranks up (allocate.py: never a larger predicted loss than uniform's).
mixed: per KV head one of three, within the same bytes: full (its keys and values kept
whole), low rank (r_k, r_v on the output-aware bases) or, where the head's attention lies
in its window (bases/windows.py MIN_KEPT), a window of W recent keys and s sinks, whose bytes at
--length T are min(W + s, T) / T of the full head's; from the uniform ranks up too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..bases.lowrank import Slot, cache_bytes, direction_bytes, uniform_ranks
from ..bases.windows import MIN_KEPT, SINKS
from ..target.protocol import Target
from .allocate import Option, allocate, front

CHOICES = ("full", "low_rank", "window")


@dataclass(frozen=True)
class Setting:
    """The ranks of every slot's heads, and the KV heads read through a window."""

    ranks: dict
    windows: dict = field(default_factory=dict)  # (layer, g) -> (W, s)

    def signature(self) -> tuple:
        return (tuple((k, tuple(v)) for k, v in sorted(self.ranks.items())),
                tuple(sorted(self.windows.items())))


def setting_bytes(slots: list[Slot], setting: Setting, nbytes: int, T: int,
                  shared: bool = False) -> dict:
    """cache_bytes of the setting's ranks, a windowed head holding its full-width keys and
    values for min(W + s, T) of T tokens, and no basis."""
    size = cache_bytes(slots, setting.ranks, nbytes, T, shared)
    if not setting.windows:
        return size
    by_key = {s.key: s for s in slots}
    codes, basis = 0.0, 0.0
    for (layer, g), (W, s) in setting.windows.items():
        kept = min(W + s, T) / T
        for kind in ("k", "v"):
            slot = by_key[(layer, kind)]
            codes += direction_bytes(slot, nbytes, T, True) * slot.width * (1 - kept)
            basis += slot.width * setting.ranks[slot.key][g] * nbytes
    codes_left = size["code_bytes_per_token"] - codes
    low = size["bytes_per_token"] - codes - (0.0 if shared else basis / T)
    return {**size, "bytes_per_token": low, "code_bytes_per_token": codes_left,
            "basis_bytes": size["basis_bytes"] - basis,
            "ratio": size["full_bytes_per_token"] / low if low else float("inf")}


def _budget(slots: list[Slot], ratio: float, nbytes: int, T: int, shared: bool) -> float:
    """The bytes per token the units may spend: full / ratio less what no rank changes."""
    zero = cache_bytes(slots, {s.key: [0] * s.heads for s in slots}, nbytes, T, shared)
    return zero["full_bytes_per_token"] / ratio - zero["bytes_per_token"]


def sensitivity_setting(slots: list[Slot], sens, ratio: float, nbytes: int, T: int,
                        shared: bool = True) -> Setting | None:
    """Per slot and head r >= 1 of least summed predicted loss within full / ratio bytes,
    starting from the uniform ranks; None when the uniform ranks do not reach the ratio."""
    start = uniform_ranks(slots, ratio, nbytes, T, shared)
    if start is None:
        return None
    units, where = [], []
    for s in slots:
        losses, step = sens.rank_losses(s.key), direction_bytes(s, nbytes, T, shared)
        for g in range(s.heads):
            units.append([Option(step * r, float(losses[g, r]), r)
                          for r in range(1, s.width + 1)])
            where.append((s.key, g))
    picks = allocate(units, _budget(slots, ratio, nbytes, T, shared),
                     [start[key][g] - 1 for key, g in where])
    ranks = {s.key: [0] * s.heads for s in slots}
    for (key, g), i, options in zip(where, picks, units, strict=True):
        ranks[key][g] = options[i].payload
    return Setting(ranks)


def window_candidates(sens, layer: int, g: int, heads_per_group: int,
                      grid: tuple[int, ...]) -> list[int]:
    """The W of the grid whose window keeps at least MIN_KEPT of the attention of KV head
    g's query heads (mean over them), and whose change was predicted."""
    kept = sens.kept.get(layer, {})
    out = []
    for W in grid:
        if W not in kept or (layer, W) not in sens.windows:
            continue
        share = kept[W][g * heads_per_group:(g + 1) * heads_per_group]
        if float(share.mean()) >= MIN_KEPT:
            out.append(W)
    return out


def _head_options(k: Slot, v: Slot, g: int, sens, nbytes: int, T: int, windows: list[int],
                  start: tuple[int, int]) -> list[Option]:
    """One KV head's options: the front of its (r_k, r_v) pairs (r = K, V: full), the
    start's pair, and its window candidates."""
    bk, bv = direction_bytes(k, nbytes, T, True), direction_bytes(v, nbytes, T, True)
    Lk, Lv = sens.rank_losses(k.key)[g], sens.rank_losses(v.key)[g]  # [K + 1], [V + 1]
    rk = torch.arange(1, k.width + 1)[:, None].expand(k.width, v.width).flatten()
    rv = torch.arange(1, v.width + 1)[None, :].expand(k.width, v.width).flatten()
    loss, cost = (Lk[rk] + Lv[rv]).tolist(), (bk * rk + bv * rv).tolist()
    pairs = [Option(b, lo, ("low_rank", a, c)) for b, lo, a, c in
             zip(cost, loss, rk.tolist(), rv.tolist(), strict=True)]
    options = [pairs[i] for i in front(pairs)]
    options.append(Option(bk * start[0] + bv * start[1],
                          float(Lk[start[0]] + Lv[start[1]]), ("low_rank", *start)))
    whole = bk * k.width + bv * v.width
    for W in windows:
        loss = float(sens.window_losses(k.layer, W)[g])
        options.append(Option(whole * min(W + SINKS, T) / T, loss, ("window", W, SINKS)))
    return options


def mixed_setting(target: Target, sens, ratio: float, nbytes: int, T: int, grid: tuple[int, ...]
                  ) -> Setting | None:
    """Per KV head full, low rank or a window (module docstring) of least summed predicted
    loss within full / ratio bytes, from the uniform ranks; None when they do not reach
    the ratio. Slots other than keys and values (none in a KV cache) keep uniform ranks."""
    slots = target.slots
    start = uniform_ranks(slots, ratio, nbytes, T, True)
    if start is None:
        return None
    by_key = {s.key: s for s in slots}
    layers = sorted({s.layer for s in slots})
    units, where = [], []
    for layer in layers:
        k, v = by_key[(layer, "k")], by_key[(layer, "v")]
        n = target.query_heads(layer) // k.heads
        for g in range(k.heads):
            windows = (window_candidates(sens, layer, g, n, grid)
                       if layer in target.window_layers else [])
            start_g = (start[k.key][g], start[v.key][g])
            units.append(_head_options(k, v, g, sens, nbytes, T, windows, start_g))
            where.append((layer, g))
    picks = allocate(units, _budget(slots, ratio, nbytes, T, True),
                     [len(u) - 1 - sum(o.payload[0] == "window" for o in u) for u in units])
    ranks = {key: list(r) for key, r in start.items()}
    chosen: dict = {}
    for (layer, g), i, options in zip(where, picks, units, strict=True):
        payload = options[i].payload
        k, v = by_key[(layer, "k")], by_key[(layer, "v")]
        if payload[0] == "window":
            ranks[k.key][g], ranks[v.key][g] = k.width, v.width
            chosen[(layer, g)] = payload[1:]
        else:
            ranks[k.key][g], ranks[v.key][g] = payload[1], payload[2]
    return Setting(ranks, chosen)


def head_choice(slots_of_layer: list[Slot], setting: Setting, layer: int, g: int) -> dict:
    """One head's choice and what it keeps: {"choice", "ranks": {kind: r}, "window",
    "sinks"}."""
    ranks = {s.kind: setting.ranks[s.key][g] for s in slots_of_layer}
    if (layer, g) in setting.windows:
        W, s = setting.windows[(layer, g)]
        return {"choice": "window", "ranks": ranks, "window": W, "sinks": s}
    whole = all(ranks[s.kind] >= s.width for s in slots_of_layer)
    return {"choice": "full" if whole else "low_rank", "ranks": ranks, "window": None,
            "sinks": None}


def layer_choices(slots: list[Slot], setting: Setting) -> list[dict]:
    """Per layer {"layer", "full", "low_rank", "window"}: how many heads took each, and
    "heads": each head's head_choice (a KV head's: every query head of its group)."""
    out = []
    for layer in sorted({s.layer for s in slots}):
        mine = [s for s in slots if s.layer == layer]
        heads = [head_choice(mine, setting, layer, g) for g in range(mine[0].heads)]
        counts = {c: sum(h["choice"] == c for h in heads) for c in CHOICES}
        out.append({"layer": layer, **counts, "heads": heads})
    return out


def choices_summary(per_layer: list[dict]) -> str:
    """`0-5: 3r · 6: 1w 2r · 7: 1f 2r`: per layer, its heads kept full (f), low rank (r),
    read through a window (w); neighbouring rows that choose alike share one entry, their
    layers named by numbers_text (a hybrid's attention layers `3-15 every 4`)."""
    def one(layer: dict) -> str:
        return " ".join(f"{layer[c]}{'r' if c == 'low_rank' else c[0]}" for c in CHOICES
                        if layer[c])
    groups: list[tuple[list[int], str]] = []
    for layer in per_layer:
        text = one(layer)
        if groups and groups[-1][1] == text:
            groups[-1][0].append(layer["layer"])
        else:
            groups.append(([layer["layer"]], text))
    return " · ".join(f"{numbers_text(layers)}: {text}" for layers, text in groups)


def numbers_text(numbers: list[int]) -> str:
    """`4`, `0-5`, `3-15 every 4` (three or more at one step), else `1, 4, 6`: layer
    numbers as a range only where every number in it is one of them."""
    if len(numbers) == 1:
        return str(numbers[0])
    steps = {b - a for a, b in zip(numbers, numbers[1:], strict=False)}
    if steps == {1}:
        return f"{numbers[0]}-{numbers[-1]}"
    if len(steps) == 1 and len(numbers) >= 3:
        return f"{numbers[0]}-{numbers[-1]} every {steps.pop()}"
    return ", ".join(map(str, numbers))
