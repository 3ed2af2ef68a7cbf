"""transformers' attention interface as a capture source: what each attention layer of a
Hugging Face causal LM computes, captured in one forward.

    with capture(model, on_call) as calls:        # on_call(call) sees each AttentionCall
        model(input_ids=ids)
    with transformed(model, fn, "keys=post-rope"):  # fn(module, key, value) -> (key, value)
        model(input_ids=ids)                      # the model's own attention, on fn's

transformers >= 5 routes every attention of most model types through one function looked
up by name (its AttentionInterface). Inside `capture` the model attends through a function
registered there, which receives each layer's queries, keys and values after their norms
and RoPE, the additive or boolean mask, and the layer's `scaling`, `sliding_window`, logit
`softcap` and attention-sink logits `s_aux` under transformers' keyword names: it reads
them into an AttentionCall and answers with the P V engine of budgets/capture/attention.py,
keys before RoPE recorded by budgets/capture/rope.py. A differential module's two calls
(diffllama) are read as one (budgets/hf/differential.py); a call whose keys run past its
T tokens (DeepSeek-V4's compressed slots) is refused in one line (budgets/hf/appended.py).
A keyword the module does not read is refused (budgets/hf/keywords.py); DSA's top-k
`indices` are folded into the mask as the model folds them, its indexer watched
(budgets/hf/indexer.py). A window or attention chunks are read from the mask the layer
attends under (budgets/capture/masks.py: llama4's chunked layers pass no keyword), chunks
the probe is too short to reach from the layer's config (`attention_chunk_size` and its
`layer_types` entry). This module holds only what is transformers' own: the registration,
the keyword and config names.

`transformed` has the model attend through its own implementation (SDPA or eager), each
layer's keys and values first passed through a function (compress projects the rotated
keys so). Both register with transformers' attention and mask interfaces here, the one
module that does (attending_through), and restore the model's implementation on exit.

Nothing here imports transformers at module level (it is the optional `hf` extra).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch
from torch import nn

from ..capture.attention import AttentionCall, attend
from ..capture.masks import mask_band
from ..capture.rope import before_rope, rotary_recorded
from .appended import refuse_appended_keys
from .differential import DifferentialPairs
from .indexer import indexers_watched, selection_of
from .keywords import check_keywords

# the names the capture and `transformed` register their attention functions under
CAPTURE_ATTENTION = "rankzoo_capture"
TRANSFORMED_ATTENTION = "rankzoo_transformed"


def transformers_attention(what: str = "probing a Hugging Face model"):
    """(ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask, sdpa_mask), or a clear
    error saying that `what` needs transformers' attention interface (transformers >= 5)."""
    try:
        from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        raise ValueError(f"{what} needs transformers' AttentionInterface (transformers >= "
                         f"5), not available here ({e})") from None
    return ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask, sdpa_mask


@contextlib.contextmanager
def attending_through(model: nn.Module, name: str, attention: Callable, sdpa: bool,
                      what: str = "probing a Hugging Face model"):
    """Inside, `model` attends through `attention` (transformers' attention signature),
    registered as `name` with the masks SDPA takes (boolean, or None when purely causal)
    when `sdpa`, else eager's additive [B, 1, T, T]; yields the implementation it had,
    which is restored afterwards (on an exception too)."""
    functions, masks, eager_mask, sdpa_mask = transformers_attention(what)
    if not callable(getattr(model, "set_attn_implementation", None)):
        raise ValueError(f"{type(model).__name__} cannot switch its attention implementation "
                         f"(transformers >= 5 needed)")
    masks.register(name, sdpa_mask if sdpa else eager_mask)
    # registered for every AttentionInterface, not this one alone: some models (doge) look
    # their function up in an interface of their own
    functions.register(name, attention)
    before = model.config._attn_implementation
    try:
        model.set_attn_implementation(name)
        yield before
    finally:
        model.set_attn_implementation(before)
        type(functions)._global_mapping.pop(name, None)


# ---------------------------------------------------------------- the capture

def _config_chunk(module) -> int | None:
    """C where the layer's config makes it a chunked layer (llama4's layer_types)."""
    config, i = getattr(module, "config", None), getattr(module, "layer_idx", None)
    C, types = getattr(config, "attention_chunk_size", None), getattr(config, "layer_types", None)
    if not isinstance(C, int) or not isinstance(i, int) or not isinstance(types, list | tuple):
        return None
    return C if i < len(types) and types[i] == "chunked_attention" else None


def _call_from(module, query, key, value, mask, kwargs: dict) -> AttentionCall:
    scaling = kwargs.get("scaling")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    band = mask_band(mask, query.shape[-2])  # None: no mask, or none of causal's kinds
    window = kwargs.get("sliding_window") or (band.window if band else None)
    chunk = (band.chunk if band else None) or _config_chunk(module)
    return AttentionCall(
        module, query, key, value,
        query.shape[-1] ** -0.5 if scaling is None else float(scaling),  # eager's default
        window=window, chunk=chunk, softcap=kwargs.get("softcap") or None,
        sinks=sinks.detach() if isinstance(sinks, torch.Tensor) else None, mask=mask)


@contextlib.contextmanager
def capture(model: nn.Module, on_call: Callable[[AttentionCall], None],
            keep_probs: bool = False, matfree: bool = False):
    """Inside, `model` attends through the capture function: each layer's AttentionCall
    (with P when keep_probs) is passed to on_call before its output goes on; yields the
    calls by attention module. The model's implementation is restored afterwards (on an
    exception too). `matfree`: masks as SDPA takes them (boolean, or None when purely
    causal), else eager's additive [B, 1, T, T]."""
    transformers_attention()  # its error first, whatever the model
    calls: dict[nn.Module, AttentionCall] = {}
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    can_switch = getattr(model, "_can_set_attn_implementation", None)
    if callable(can_switch) and not can_switch():
        yield calls  # its attention never calls the interface: nothing to capture
        return

    pairs = DifferentialPairs()
    names = {m: n for n, m in model.named_modules()}
    latest: list = []  # the last indexer run (budgets/hf/indexer.py)

    def attention(module, query, key, value, attention_mask, **kwargs):
        refuse_appended_keys(module, query, key)
        check_keywords(kwargs, attention_mask, module, names.get(module, "?"))
        selection = None
        if kwargs.get("indices") is not None:  # DSA's top-k, folded in as the model folds it
            selection = selection_of(module, kwargs["indices"], attention_mask, latest, names)
            attention_mask = selection.fold(attention_mask, query.shape[-2], key.shape[-2],
                                            query.dtype)
        call = _call_from(module, query, key, value, attention_mask, kwargs)
        call.selection = selection
        if seen:  # a rotary function ran since the last call: this layer rotates
            call.query_pre, call.key_pre = before_rope(query, seen), before_rope(key, seen)
            call.rotated = True
            seen.clear()
        out = call.output = attend(call, keep_probs, fused=matfree)
        probs, call = call.probs, pairs.join(call)  # differential attention: one of two
        if call is not None:
            calls[module] = call
            on_call(call)
        return out, probs

    modules = [type(m).__module__ for m in model.modules()]
    with (attending_through(model, CAPTURE_ATTENTION, attention, matfree),
          rotary_recorded(modules, seen), indexers_watched(model, latest)):
        yield calls


@contextlib.contextmanager
def transformed(model: nn.Module, fn: Callable, what: str, masks: Callable | None = None):
    """Inside, every attention call of `model` passes its keys [B, G, T, K] (after their
    norms and RoPE) and values [B, G, T, V] through fn(module, key, value) -> (key, value)
    before the model's own attention implementation computes on them, with the masks that
    implementation takes (or, given `masks`, masks(module, query, mask) -> the mask it
    attends under instead, e.g. one per query head [B, H, T, Tk]); `what` names the caller
    in transformers' missing-interface error."""
    functions = transformers_attention(what)[0]
    before = model.config._attn_implementation

    def inner(module) -> Callable:
        if before in functions:
            return functions[before]
        return sys.modules[type(module).__module__].eager_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        key, value = fn(module, key, value)
        if masks is not None:
            attention_mask = masks(module, query, attention_mask)
        return inner(module)(module, query, key, value, attention_mask, **kwargs)

    with attending_through(model, TRANSFORMED_ATTENTION, attention, before == "sdpa", what):
        yield
