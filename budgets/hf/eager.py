"""The P-based figures of Hugging Face models that do not call transformers' attention
interface (bloom, falcon, gpt_neo, mpt): their eager path's `output_attentions`.

    layers, final, loss = probe_eager(model, ids, eps)    # when budgets.hf.probe finds no mixer

Each layer's P [B, H, T, T] is decomposed as on the exact path (mixing, centered,
past->future, per-head figures), the layer's input from `output_hidden_states` gives the
residual stream's figures, and the caps come from the config's attention shape. What
these models do not show (their queries, keys, values and projections: the qk, value,
out and cache rows) is named in each layer's `not_measured`.
"""

from __future__ import annotations

import torch

from ..budget import attention_budget
from ..probe.blocks import mixing_figures, stream_figures

NOT_MEASURED = ("queries, keys, values, W_Q W_K^T, W_V, W_O and the KV cache: the model "
                "does not call transformers' attention interface, so only its attention "
                "probabilities (output_attentions) are read")


def _shape(config) -> tuple[int, int, int, int]:
    """(H, G, K, D) from a config's standard names (their aliases included)."""
    H, D = int(config.num_attention_heads), int(config.hidden_size)
    G = int(getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads",
                                                                      None) or H)
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture",
                                                              False):
        G = 1  # falcon's multi-query attention
    return H, G, D // H, D


def _is_probabilities(a, ids_shape: torch.Size) -> bool:
    """Whether `a` can be one layer's attention probabilities [B, H, T, T] for ids [B, T]."""
    B, T = ids_shape
    return (isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[0] == B
            and tuple(a.shape[2:]) == (T, T))


def probe_eager(model, ids: torch.Tensor, eps: float, wanted: list[int] | None,
                massive_ratio: float) -> tuple[list[dict], torch.Tensor, float] | None:
    """(layer entries, final hidden states [B, T, D], loss), or None when the model
    returns no attention probabilities either."""
    out = model(input_ids=ids, output_attentions=True, output_hidden_states=True,
                use_cache=False)
    attentions = out.get("attentions")
    if not attentions or not all(_is_probabilities(a, ids.shape) for a in attentions):
        return None  # none, or not P: rwkv returns its time-mixing state under that name
    H, G, K, D = _shape(model.config)
    T, block = ids.shape[1], model.config.model_type
    layers = []
    for i in wanted if wanted is not None else range(len(attentions)):
        quantities, extras = mixing_figures(attentions[i].float(), eps)
        x = out["hidden_states"][i]  # the layer's input: the residual stream
        quantities["hidden_centered"], residual = stream_figures(x, x, eps, massive_ratio)
        if residual is not None:
            extras["residual"] = residual
        layers.append({
            "layer": i, "name": f"layer {i}", "block": block,
            "budget": attention_budget(block, T, n_heads=H, n_kv_heads=G, head_dim=K,
                                       d_model=D).to_dict(),
            "quantities": {q: m for q, (m, _) in quantities.items()}, **extras,
            "kind": {"attention": "global", "window": None, "rope": None, "softcap": None,
                     "sinks": False, "moe": False, "label": "global (P only)"},
            "not_measured": [NOT_MEASURED],
            "spectra": {q: s for q, (_, s) in quantities.items() if s.numel()}})
    logits = out["logits"].float()
    loss = float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten()))
    return layers, out["hidden_states"][-1], loss
