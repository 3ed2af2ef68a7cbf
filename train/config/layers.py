"""A variant as a layer pattern (a hybrid): its two spellings, checked and expanded.

    local_global:                       # Gemma 3's 5:1, as named sub-blocks
      pattern: [local, local, local, local, local, global]
      blocks: {local: {block: sliding_window, window: 8}, global: {block: softmax}}
    mamba_attn:                         # or the unit written out, one block spec per layer
      layers: [{block: ssm, d_state: 16}, {block: ssm, d_state: 16}, {block: softmax}]

Either spelling is a repeating unit whose length must divide `model.n_layers`: the unit is
repeated to fill the model (a unit of 2 in a 6-layer model gives 3 x [a, b]). Each layer's
label is its sub-block's name under `pattern`, or its block's name under `layers`; the
report groups layers by that label. `block_defaults` are merged under every sub-block, and
each sub-block's knobs are checked against its own block, like a uniform variant's.

    unit = parse_unit(raw, "variants.lg", n_layers, parse_block)   # -> tuple of LayerSpec
    expand(unit, n_layers)                                         # one LayerSpec per layer
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.config import require, unknown_key_error

# the keys that make a variant a layer pattern (either `layers`, or `pattern` + `blocks`)
HYBRID_KEYS = ("layers", "pattern", "blocks")
HYBRID = "hybrid"  # the block name a layer-pattern variant is listed under


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a pattern: its label (the sub-block's name), block and kwargs."""

    label: str
    block: str
    kwargs: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, **self.kwargs}


# (where, raw block spec) -> (block name, kwargs with block_defaults merged), validated
ParseBlock = Callable[[str, dict], tuple[str, dict]]


def is_hybrid(raw: dict[str, Any]) -> bool:
    return any(key in raw for key in HYBRID_KEYS)


def parse_unit(raw: dict[str, Any], where: str, n_layers: int,
               parse_block: ParseBlock) -> tuple[LayerSpec, ...]:
    """The repeating unit of a layer-pattern variant (its keys other than the pattern's
    and `train`/`check` already removed from `raw`)."""
    if "block" in raw:
        raise ValueError(f"{where}: a layer pattern gives each layer's block under layers or "
                         f"blocks; remove {where}.block ({raw['block']!r})")
    extra = [k for k in raw if k not in HYBRID_KEYS]
    if extra:
        raise unknown_key_error("layer-pattern variant", f"{where}.{extra[0]}",
                                [f"{where}.{k}" for k in HYBRID_KEYS])
    if "layers" in raw:
        require("pattern" not in raw and "blocks" not in raw,
                f"{where}: give either layers or pattern + blocks, not both")
        unit = _layers(raw["layers"], f"{where}.layers", parse_block)
    else:
        unit = _pattern(raw, where, parse_block)
    require(n_layers % len(unit) == 0,
            f"{where}: a unit of {len(unit)} layers does not divide model.n_layers "
            f"({n_layers}); give a unit whose length divides it, or one spec per layer")
    return unit


def _layers(raw: Any, where: str, parse_block: ParseBlock) -> tuple[LayerSpec, ...]:
    require(isinstance(raw, list) and bool(raw),
            f"{where} must be a non-empty list of block specs ({{block: <name>, ...}}), "
            f"got {raw!r}")
    specs = []
    for i, spec in enumerate(raw):
        block, kwargs = parse_block(f"{where}[{i}]", spec)
        specs.append(LayerSpec(block, block, kwargs))
    return tuple(specs)


def _pattern(raw: dict[str, Any], where: str, parse_block: ParseBlock) -> tuple[LayerSpec, ...]:
    pattern, blocks = raw.get("pattern"), raw.get("blocks")
    require(isinstance(pattern, list) and bool(pattern),
            f"{where}.pattern must be a non-empty list of sub-block names, got {pattern!r}")
    require(isinstance(blocks, dict) and bool(blocks),
            f"{where}.blocks must map each name in pattern to a block spec "
            f"({{block: <name>, ...}}), got {blocks!r}")
    parsed = {name: parse_block(f"{where}.blocks.{name}", spec) for name, spec in blocks.items()}
    for i, label in enumerate(pattern):
        if label not in parsed:
            raise unknown_key_error("sub-block", f"{where}.pattern[{i}] = {label!r}",
                                    [str(n) for n in parsed])
    unused = [n for n in parsed if n not in pattern]
    require(not unused, f"{where}.blocks: {unused} not used by {where}.pattern {pattern}")
    return tuple(LayerSpec(str(label), *parsed[label]) for label in pattern)


def expand(unit: tuple[LayerSpec, ...], n_layers: int) -> list[LayerSpec]:
    """One spec per layer: the unit repeated n_layers / len(unit) times."""
    return list(unit) * (n_layers // len(unit))


def unit_to_dict(unit: tuple[LayerSpec, ...]) -> dict[str, Any]:
    """The unit as YAML writes it back (loads to an equal unit): `layers` when each label
    is its block's name, else `pattern` + `blocks`."""
    if all(s.label == s.block for s in unit):
        return {"layers": [s.to_dict() for s in unit]}
    blocks = {s.label: s.to_dict() for s in unit}
    return {"pattern": [s.label for s in unit], "blocks": blocks}


def describe(specs: list[LayerSpec]) -> str:
    """The pattern in runs: `local x5, global` for 5 windowed layers then a global one."""
    runs: list[list] = []
    for s in specs:
        if runs and runs[-1][0] == s.label:
            runs[-1][1] += 1
        else:
            runs.append([s.label, 1])
    return ", ".join(label if n == 1 else f"{label} x{n}" for label, n in runs)
