"""The entry of a layer whose mixing alone is measured: a delta rule, a short convolution,
a diagonal recurrence, decayed linear attention (budgets/capture/delta.py, channels.py,
lightning.py).

    BUILDERS = {..., "delta": mixing_entry, "conv": mixing_entry, ...}   # probe_calls' table

Beside its mixing figures such a layer reports its kind (the call's kind: the report's
per-kind table groups by its label) and the caps its call declares (budgets/mixing/); what
the probe does not read of it (its state, its projections) the call names in `unread`.
"""

from __future__ import annotations

import torch

from .calls import CallProbe


def mixing_entry(p: CallProbe, i: int, layer, mixing: dict, x: torch.Tensor, call,
                 streams: dict, extras: dict, moe: bool) -> dict:
    """A mixer's entry: its mixing M alone, against the caps its call declares."""
    extras["kind"] = call.kind(moe)
    params = sum(q.numel() for q in layer.module.parameters())
    extras["not_measured"] = [call.unread]
    return {
        "layer": i, "name": layer.name, "block": p.block,
        "budget": call.caps(x.shape[1], x.shape[-1], params, p.block).to_dict(),
        "quantities": {q: m for q, (m, _) in mixing.items()},
        **extras,  # past_future_lengths, heads, residual, shared, kind, not_measured
        "spectra": {q: s for q, (_, s) in mixing.items() if s.numel()},
    }
