"""A Hugging Face model's layer pattern, read from its probe: one kind per decoder layer in
layer order, and the shortest unit that repeats through them.

    layers = decoder_kinds(entry)                  # probe_hf's entry: one per decoder layer
    p = unit_length([k.label for k in layers])     # Gemma 3: 6 (sliding x5, global)

The probe lists mixers, each under its decoder layer's own number (the index in the model's
layer list: `model.layers.3.self_attn` is layer 3), so a layer's mixers are those under its
number. What one zoo layer cannot be is refused in
one line naming the layers, before anything is written: a mixer the probe did not read (its
block is unknown), a layer the probe skipped (`--layers`), and a decoder layer with two
mixers (falcon_h1's attention beside its SSM, zamba's shared attention before its Mamba),
since a zoo layer holds one block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from budgets.hf.unmeasured import unmeasured_text

from ...config.layers import LayerSpec, describe


@dataclass(frozen=True)
class LayerKind:
    """One decoder layer's mixer as the probe saw it: its kind (budgets/capture/attention.py
    AttentionCall.kind, budgets/capture/scan.py ssd_kind) and its heads."""

    layer: int
    name: str
    kind: dict[str, Any]
    heads: int  # H: query heads (an SSM: its SSD heads)
    kv_heads: int  # G; H where the probe gives none (an SSM, the eager path)
    latent: bool  # the layer caches a latent (MLA)

    @property
    def label(self) -> str:
        return self.kind["label"]

    @classmethod
    def of(cls, layer: int, probed: dict[str, Any]) -> LayerKind:
        heads = int(probed["budget"]["n_heads"])
        kv = (probed.get("kv_heads") or {}).get("n_kv_heads") or heads
        return cls(layer, probed["name"], probed["kind"], heads, int(kv),
                   "inference.latent" in probed.get("quantities", {}))


def decoder_kinds(entry: dict[str, Any]) -> list[LayerKind]:
    """The kind of each decoder layer of the probed model, in layer order (probe_hf's
    entry); a ValueError naming the layers when one has no single measured mixer."""
    probe, source = entry["probe"], entry["source"]
    model = source["model_type"]
    if probe.get("unmeasured_mixers"):
        raise ValueError(f"--emit: the probe did not measure {model}'s "
                         f"{unmeasured_text(probe['unmeasured_mixers'])}, so their zoo blocks "
                         f"are unknown and the pattern cannot be mirrored; nothing was written")
    n = int(source["n_layers"])
    grouped = _by_decoder_layer(probe["layers"], n, model)
    missing = [i for i in range(n) if i not in grouped]
    if missing:
        raise ValueError(f"--emit: the pattern needs every layer's kind, and {model}'s "
                         f"layer{'s' if len(missing) > 1 else ''} {ranges(missing)} "
                         f"{'were' if len(missing) > 1 else 'was'} not measured; probe every "
                         f"layer (no --layers); nothing was written")
    for i in range(n):
        if len(grouped[i]) > 1:
            mixers = "; ".join(f"{name}: {ly['kind']['label']}" for name, ly in grouped[i].items())
            raise ValueError(f"--emit: {model}'s decoder layer {i} mixes by "
                             f"{len(grouped[i])} mixers ({mixers}), and a zoo layer by one "
                             f"block, so its pattern has no zoo spelling; nothing was written")
    return [LayerKind.of(i, next(iter(grouped[i].values()))) for i in range(n)]


def _by_decoder_layer(layers: list[dict], n: int, model: str) -> dict[int, dict[str, dict]]:
    """Decoder layer -> {mixer name: its probed entry}, by the probe's layer numbers (the
    model's own: budgets/probe/places.py). A module called twice in one layer (zamba's
    Mamba runs two scans) is one mixer."""
    outside = [f"{ly['layer']} ({ly.get('name', '?')})" for ly in layers
               if not 0 <= ly["layer"] < n]
    if outside:
        raise ValueError(f"--emit: the probe names layers of {model} outside its {n} layers: "
                         f"{', '.join(outside)}; nothing was written")
    grouped: dict[int, dict[str, dict]] = {}
    for layer in layers:
        grouped.setdefault(layer["layer"], {}).setdefault(layer.get("name", ""), layer)
    return grouped


def unit_length(labels: list[str]) -> int:
    """The length p of the shortest unit whose repeats give `labels` (the last repeat may
    stop short: Gemma 3 1B's 26 layers are 4 units of 6 and 2 more)."""
    n = len(labels)
    return next(p for p in range(1, n + 1)
                if all(labels[i] == labels[i - p] for i in range(p, n)))


def ranges(indices: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)



def runs_text(labels: list[str]) -> str:
    """The labels in runs, as the dry-run shows a pattern: `sliding W=8 x5, global`."""
    return describe([LayerSpec(label, "", {}) for label in labels])
