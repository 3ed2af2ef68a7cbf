"""Which report row a layer entry or an advice item is: the model's own layer number and,
where the layer holds several mixers, which of them.

    row_key(layer)                  # (3, "self_attn") or (3, "")
    row_text(layer)                 # "3 self_attn" or "3"
    rows_text("layer", layers)      # "layers 0 mamba, 1 self_attn"

A layer's number is the model's (budgets/probe/places.py): a layer mixing by two modules
(falcon_h1's SSM beside its attention, zamba's Mamba scans beside its shared attention)
has two rows under one number, told apart by `mixer`, the module's path inside the layer.
Everything that keys, looks up or names a row does it through these, so two mixers of one
layer are never taken for one.
"""

from __future__ import annotations

from collections.abc import Iterable


def row_key(row: dict) -> tuple[int, str]:
    """(layer number, mixer or "") of a layer entry or an advice item."""
    return int(row["layer"]), row.get("mixer") or ""


def row_text(row: dict) -> str:
    """'3' or, for one of several mixers in layer 3, '3 self_attn'."""
    number, mixer = row_key(row)
    return f"{number} {mixer}" if mixer else str(number)


def key_text(key: tuple[int, str]) -> str:
    """row_text of a row_key."""
    return f"{key[0]} {key[1]}" if key[1] else str(key[0])


def rows_text(word: str, rows: Iterable[dict | tuple[int, str]]) -> str:
    """'layer 1', 'layers 0, 2' or 'layers 0 mamba, 1 self_attn' (rows or their keys)."""
    texts = [key_text(r) if isinstance(r, tuple) else row_text(r) for r in rows]
    return f"{word}{'s' * (len(texts) > 1)} {', '.join(texts)}"


def mixer_of(row: dict) -> dict:
    """{"mixer": ...} for a row that is one of several mixers in its layer, else {}: what
    an advice item about the row carries beside its "layer"."""
    return {"mixer": row["mixer"]} if row.get("mixer") else {}
