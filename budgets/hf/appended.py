"""Attention calls whose keys run past their queries' tokens, refused in one line.

    refuse_appended_keys(module, query, key)   # ValueError when key has more than T rows

The probe's forwards are prefills without a cache: each layer's queries and keys are the
same T tokens, and P [B, H, T, T] is the token-to-token mixing. DeepSeek-V4 appends
compressed slots to its keys (K = V): CSA pools overlapping windows of m tokens (m = 4)
and lets each query see the top-k slots its indexer scores, HCA pools windows of m' tokens
(m' = 128). Its output is P[:, :T] V + P[:, T:] C, and a token-to-token mixing M =
P[:, :T] + P[:, T:] W_pool exists only where C = W_pool V, each slot a pooling of the
layer's own values. V4's are not: a slot is its compressor's own projection of the layer's
input (kv_proj, not the attention's), pooled by a softmax per channel (each channel its own
weights over the window), then RMS-normed and rotated at the slot's position. So there is
no M to measure, and P[:, :T] alone would misstate the layer: the call is refused, naming
the layer, its branch and why, rather than measured in part. Nothing here imports
transformers.
"""

from __future__ import annotations

import torch
from torch import nn

# compressor class-name suffix -> the windows its slots pool (DeepSeek-V4's two branches)
COMPRESSORS = {
    "CSACompressor": "overlapping windows of 2 x {rate} tokens, stride {rate}, the slots "
                     "each query sees picked by its indexer's top-k,",
    "HCACompressor": "windows of {rate} tokens",
}


def _branch(module: nn.Module) -> str | None:
    """How the module's compressor makes its slots, from COMPRESSORS, or None."""
    compressor = getattr(module, "compressor", None)
    name = type(compressor).__name__
    suffix = next((s for s in COMPRESSORS if name.endswith(s)), None)
    if suffix is None:
        return None
    rate = getattr(compressor, "compress_rate", "?")
    return (f"each slot pools {COMPRESSORS[suffix].format(rate=rate)} of {name}'s own "
            f"projection of the layer's input (a softmax per channel, then an RMS norm and "
            f"RoPE), not of the layer's values")


def refuse_appended_keys(module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> None:
    """A ValueError naming the layer, its branch and why, when the call's keys [B, G, Tk, K]
    run past its queries' T tokens [B, H, T, K] (module docstring); else nothing."""
    T, Tk = query.shape[-2], key.shape[-2]
    if Tk <= T:
        return
    config = getattr(module, "config", None)
    model = getattr(config, "model_type", None) or type(module).__name__
    layer = getattr(module, "layer_idx", None)
    where = f"{model}{'' if layer is None else f' layer {layer}'}"
    branch = getattr(module, "layer_type", None)
    where += f" ({branch})" if branch else ""
    how = _branch(module)
    what = (f"appends compressed key/value slots to its tokens' keys ({Tk - T} after {T} "
            f"tokens); {how}: no token-to-token M = P[:, :T] + P[:, T:] W_pool gives its "
            f"output" if how else f"reads key columns beyond its tokens ({Tk - T} after {T} "
            f"tokens), which the probe cannot place among them")
    raise ValueError(f"{where}: its attention {what}, and P[:, :T] alone would misstate the "
                     f"layer, so rankzoo does not measure this model")
