"""The hybrid advice: swap for a fixed-state block exactly the layers a fixed state serves,
keep the others, and say what cache that saves (budgets/advice/annotate.py emits it).

    hybrid_advice(variant, cheaper_block_items, th)   # [] or [one "hybrid" item]

A layer is served by a fixed state of N when it has a cheaper_block item: its past->future
rank stays <= N and flat at every probe length where N does not bind (annotate.py). When
some layers of a variant are served and others are not, one block in every layer is the
wrong change: the others need what they have. The hybrid swaps the served layers, each for
a block with a fixed state of N (N the largest state advised over them, so one block kind
serves them all) and keeps the others as they were. When every layer is served, the
whole-model cheaper_block advice stands and no hybrid is advised.

Its cache, per sequence at the report's T and the report's cache dtype, from the figures
the report holds (budgets imports no zoo): each layer's declared cache is its budget's
`cache_elements`; a fixed state of N is counted as linear attention with F = N over the
layer's output width (the cap of its W_O, min(D, H x V); the value path's where the probe
has no W_O row): H heads each holding an F x V state, N x H x V elements whatever T. An
SSM with N = N holds more (its expanded inner width and convolution state); the check run
states the exact cache of each block it trains (train/commands/check/outcome.py).
"""

from __future__ import annotations

from .kv import conditions
from .rows import row_key, rows_text
from .verdicts import VerdictThresholds

Key = tuple[int, str]  # a row: (layer number, mixer or ""), budgets/advice/rows.py

KIND = "hybrid"
# The blocks that hold a fixed state of n, as the advice names them: one per family whose
# facts declare a cheaper_block Check (zoo/facts.py; a test keeps the two in step, since
# budgets does not import the zoo's registry). Each caps a layer's past->future rank at n.
STATE_BLOCKS = ("linear attention with F = {n}", "an SSM with N = {n}",
                "a delta rule (Gated DeltaNet, KDA) with K = {n}")


def state_blocks(n: int) -> str:
    """`linear attention with F = 5, an SSM with N = 5, or a delta rule ... with K = 5`."""
    named = [b.format(n=n) for b in STATE_BLOCKS]
    return ", ".join(named[:-1]) + ", or " + named[-1]


def numbered(word: str, numbers: list[int]) -> str:
    """'layer 1' or 'layers 0, 2'."""
    return f"{word}{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers))}"


def hybrid_rows(item: dict, field: str) -> list[Key]:
    """The rows a hybrid item swaps (`field` "layers") or keeps ("kept"): its layer
    numbers, with their mixers where the variant's layers hold several ("mixers",
    "kept_mixers", one per number)."""
    numbers = item[field]
    mixers = item.get("mixers" if field == "layers" else f"{field}_mixers") or []
    return [(i, mixers[j] if j < len(mixers) else "") for j, i in enumerate(numbers)]


def _rows_fields(field: str, keys: list[Key]) -> dict:
    """A hybrid item's numbers under `field`, and their mixers where any row has one."""
    mixers = "mixers" if field == "layers" else f"{field}_mixers"
    return {field: [k[0] for k in keys],
            **({mixers: [k[1] for k in keys]} if any(k[1] for k in keys) else {})}


def kept_text(blocks: dict[Key, str], kept: list[Key]) -> str:
    """'sliding_window in layers 0, 1, 2, 4, 5' (one phrase per block kept)."""
    by_block: dict[str, list[Key]] = {}
    for k in kept:
        by_block.setdefault(blocks[k], []).append(k)
    return ", ".join(f"{b} in {rows_text('layer', ks)}" for b, ks in by_block.items())


def state_width(layer: dict) -> int | None:
    """The channels a fixed state is kept for in this layer: its output width (the W_O
    row's cap), else its value path's; None when the probe has neither row."""
    caps = {row["axis"]: row["declared"] for row in layer["axes"]}
    return caps.get("out") or caps.get("value_path") or None


def cache_saved(variant: dict, swapped: list[Key], state: int,
                th: VerdictThresholds) -> dict | None:
    """Bytes per sequence at T: the full model's, the swapped layers' share of it, the
    fixed states that replace them, the hybrid's, what it saves and the ratio; None
    when the report declares no cache sizes (a probe without them)."""
    per_layer = {row_key(p): p["cache_elements"]
                 for p in (variant.get("budget") or {}).get("per_layer", [])}
    b = th.cache_bytes
    full = sum(per_layer.values()) * b
    if not full or any(i not in per_layer for i in swapped):
        return None
    widths = {row_key(ly): state_width(ly) for ly in variant["layers"]
              if row_key(ly) in swapped}
    out = {"dtype": th.cache_dtype, "bytes_per_element": b, "seq_len": variant["seq_len"],
           "full_bytes": full, "swapped_bytes": sum(per_layer[i] for i in swapped) * b,
           "state_elements": None, "state_bytes": None, "hybrid_bytes": None,
           "saved_bytes": None, "ratio": None}
    if any(widths.get(i) is None for i in swapped):
        return out  # the state's size is unknown: the full and swapped bytes still stand
    elements = [state * widths[i] for i in swapped]
    hybrid = full - out["swapped_bytes"] + sum(elements) * b
    return {**out, "state_elements": elements, "state_bytes": sum(elements) * b,
            "hybrid_bytes": hybrid, "saved_bytes": full - hybrid,
            "ratio": full / hybrid if hybrid else None}


def _cache_text(c: dict | None, swapped: list[Key], state: int) -> str:
    if c is None:
        return "the report declares no cache sizes, so the saving is not stated"
    head = (f"cache per sequence at T = {c['seq_len']} in {c['dtype']}: full "
            f"{c['full_bytes']} B, of which {rows_text('layer', swapped)} "
            f"hold{'s' * (len(swapped) == 1)} {c['swapped_bytes']} B")
    if c["state_bytes"] is None:
        return head + "; the size of a fixed state there is unknown (no W_O or value row)"
    return (head + f"; a fixed state of {state} holds {state} x the layer's output width = "
            f"{' + '.join(map(str, c['state_elements']))} elements ({c['state_bytes']} B, "
            f"as linear attention with F = {state} or a delta rule with K = {state} and value "
            f"heads of the layer's width, whose short convolution adds a few tokens' worth; an "
            f"SSM's is larger: its inner width and convolution state), whatever T: hybrid "
            f"{c['hybrid_bytes']} B, "
            f"{c['saved_bytes']} B saved ({c['ratio']:.2f}x)")


def hybrid_advice(variant: dict, items: list[dict], th: VerdictThresholds) -> list[dict]:
    """One hybrid item when some but not all of the variant's layers have cheaper_block
    items among `items` (checked ones); [] otherwise. A hybrid that would hold at least
    the full cache becomes a no_saving finding instead."""
    served = {row_key(it): it for it in items
              if it["kind"] == "cheaper_block" and it["variant"] == variant["variant"]}
    every = [row_key(ly) for ly in variant["layers"]]
    if not served or len(served) == len(every):
        return []
    swapped, kept = sorted(served), [i for i in every if i not in served]
    state = max(it["state"] for it in served.values())
    cache = cache_saved(variant, swapped, state, th)
    blocks = {row_key(ly): ly.get("block", "?") for ly in variant["layers"]}
    name = variant["variant"]
    text = (f"{name}: {rows_text('layer', swapped)} realize{'s' * (len(swapped) == 1)} "
            f"past->future rank <= {state} at every probed length where a state of {state} "
            f"does not bind, and {rows_text('layer', kept)} "
            f"do{'es' * (len(kept) == 1)} not: a hybrid with a block of fixed state {state} "
            f"({state_blocks(state)}) in "
            f"{rows_text('layer', swapped)}, keeping {kept_text(blocks, kept)}, caps the same "
            f"ranks; " + _cache_text(cache, swapped, state))
    item = {"kind": KIND, "variant": name, **_rows_fields("layers", swapped),
            **_rows_fields("kept", kept), "state": state,
            "cache_saved": cache,
            "conditions": conditions(variant, max(it["conditions"]["max_observed"]
                                                  for it in served.values())),
            "text": text}
    if cache is not None and cache["saved_bytes"] is not None and cache["saved_bytes"] <= 0:
        return [{**item, "kind": "finding", "topic": "hybrid_no_saving",
                 "text": f"{name}: no cache saved by a hybrid at T = {variant['seq_len']}: "
                         f"{_cache_text(cache, swapped, state)}"}]
    return [item]
