"""The keywords transformers' models pass their attention function, each read by the capture
or known not to change what attention computes; a call carrying any other is refused.

    check_keywords(kwargs, mask, module, "model.layers.3.self_attn")   # ValueError, or None

A model calls `attention_interface(module, q, k, v, mask, scaling=..., **kwargs)`; whatever
it puts in kwargs, the model's own implementation may act on (flash-attention's packed
sequences, a sparse kernel's top-k indices, a relative position bias). A capture that
dropped such a keyword would measure, and hand the model back, an attention other than the
one the model computes. So every keyword is in one of two tables: READ (the capture
applies it: budgets/hf/capture.py, budgets/capture/selection.py) or HARMLESS (it does not
change P V, with why); a call passing any other with a value other than None is refused,
naming the keyword and the layer. The tables list what transformers 5's causal LMs pass
(their `attention_interface(` calls and TransformersKwargs).
"""

from __future__ import annotations

import torch
from torch import nn

# keyword -> how the capture applies it
READ = {
    "scaling": "the logits' scale",
    "dropout": "attention dropout: 0 read, above 0 refused (P would be random)",
    "sliding_window": "the window W (the mask holds it too)",
    "softcap": "the logits' soft-cap",
    "s_aux": "attention-sink logits", "sinks": "attention-sink logits",
    "indices": "DSA's top-k key indices, folded into the mask",
    "is_causal": "with no mask, False (bidirectional) refused",
}
# keyword -> why P V does not depend on it
HARMLESS = {
    "position_ids": "positions: already in the rotated queries and keys and in the mask",
    "cache_position": "positions: already in the rotated queries and keys and in the mask",
    "use_cache": "whether the model caches: the probe runs without a cache",
    "output_attentions": "what the forward returns",
    "output_hidden_states": "what the forward returns",
    "output_router_logits": "what the forward returns",
    "return_dict": "what the forward returns",
    "num_items_in_batch": "the training loss's normalizer",
    "deterministic": "a fused kernel's determinism",
}


def check_keywords(kwargs: dict, mask: torch.Tensor | None, module: nn.Module,
                   name: str) -> None:
    """Refuse (ValueError naming the keyword and the layer `name`) a call whose keywords the
    capture cannot honour: an unknown one with a value, dropout above 0, or is_causal
    False with no mask."""
    where = f"{name} ({type(module).__name__})"
    for key, value in kwargs.items():
        if value is not None and key not in READ and key not in HARMLESS:
            raise ValueError(f"{where}: its attention call passes {key}={_shown(value)}, "
                             f"which the capture does not read (it reads "
                             f"{', '.join(READ)}); measuring without it would measure an "
                             f"attention the model does not compute")
    dropout = kwargs.get("dropout") or 0.0
    if dropout > 0:
        raise ValueError(f"{where}: dropout={dropout} (attention dropout in training mode: "
                         f"P is random); probe the model in eval mode")
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    if mask is None and causal is False:
        raise ValueError(f"{where}: is_causal=False with no mask (bidirectional attention): "
                         f"the capture reads causal attention")


def _shown(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
