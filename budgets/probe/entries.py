"""The entry of an attention layer read from its captured call: what a probe of captured
calls (budgets/probe/calls.py) reports for it beside its mixing figures.

    BUILDERS = {"attention": attention_entry, ...}    # probe_calls' builder per call kind

  keys, values    [B, G, T, K]   -> inference.k, inference.v (joint over KV heads) or an MLA
                                    layer's latent (cache_rows.py); kv_heads per KV head
  weights         W_Q^h W_K^h^T [D, D] per head -> qk; W_V^T [D, G*V] -> value; W_O -> out
                  (each where budgets/capture/projections.py found its linear)

against the caps the call declares (AttentionCall.caps: the formula zoo's softmax and
sliding_window blocks declare through). Nothing here knows which library made the call.
"""

from __future__ import annotations

import torch

from ..capture.attention import AttentionCall
from ..capture.out_proj import projection_weight
from ..capture.projections import LayerMap
from ..rank.adapters import lowrank_singular_values
from .blocks import matrix_figures, summarize_spectrum
from .cache_rows import as_cached, cache_rows, latent_budget
from .calls import CallProbe
from .selector import selector_figures
from .streams import kv_head_figures


def weight_quantities(layer: LayerMap, eps: float) -> dict:
    """qk, value and out of one layer, each where its projections were found."""
    H, G, K, _ = layer.shape
    out = {}
    if layer.q is not None and layer.k is not None:
        wq = layer.q.weight().float()  # [H*K, D]
        D = wq.shape[-1]
        wq = wq.view(H, K, D)
        # query head h reads KV head h // (H / G), as HF's repeat_kv arranges them
        wk = layer.k.weight().float().view(G, K, D).repeat_interleave(H // G, dim=0)
        # W_Q^h W_K^h^T is D x D of rank <= K: its singular values are those of a K x K core
        s = lowrank_singular_values(wq.transpose(1, 2), wk)  # [H, K]
        out["qk"] = summarize_spectrum(s, (D, D), eps)
    if layer.v is not None:
        out["value"] = matrix_figures(layer.v.weight().float().T, eps)  # [D, G*V]
    if layer.out is not None:
        out["out"] = matrix_figures(projection_weight(layer.out).detach().float(), eps)  # [D, H*V]
    return out



def attention_entry(p: CallProbe, i: int, layer: LayerMap, mixing: dict, x: torch.Tensor,
                 call: AttentionCall, streams: dict, extras: dict, moe: bool) -> dict:
    """An attention layer's entry: its keys and values per KV head as cached, its
    projections' and cache's rows (the latent's, for an MLA layer), its caps."""
    k, v = as_cached(call.key, call.value, call.window, call.chunk)
    heads = {"k": k, "v": v}
    if call.key_pre is not None:  # the tokens the cache keeps (a window's last W - 1, a chunk)
        heads["k_pre_rope"] = call.key_pre[..., call.key_pre.shape[-2] - k.shape[-2]:, :]
    extras["kv_heads"] = kv_head_figures(heads, p.eps)
    extras["kind"] = call.kind(moe)
    if call.selection is not None:  # DSA: its indexer, read as a selector
        extras["indexer"] = selector_figures(call, p.eps)
    latent = streams["latent"].pop(i, None)  # the latent an MLA layer caches, else None
    measured = dict(mixing)  # mixing, mixing_centered, past_future, hidden_centered
    measured.update(weight_quantities(layer, p.eps))
    measured.update(cache_rows(call, latent, p.eps))  # inference.k/v, or the latent's rows
    params = sum(q.numel() for q in layer.module.parameters())
    budget = call.caps(x.shape[1], x.shape[-1], params, p.block)
    missing = layer.missing()
    if missing:
        extras["not_measured"] = [f"{', '.join(missing)}: no linear of the layer's input "
                                  f"gives them (their rows are not measured)"]
    return {
        "layer": i, "name": layer.name, "block": p.block,
        "budget": (latent_budget(budget, latent, call) if latent is not None
                   else budget).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        **extras,  # past_future_lengths, heads, residual, kv_heads, kind
        # matrix-free quantities have no spectrum (an empty one): nothing to keep or plot
        "spectra": {q: s for q, (_, s) in measured.items() if s.numel()},
    }
