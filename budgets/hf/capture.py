"""What each attention layer of a Hugging Face causal LM computes, captured in one forward.

    with capture(model, on_call) as calls:        # on_call(call) sees each AttentionCall
        model(input_ids=ids)
    with transformed(model, fn, "keys=post-rope"):  # fn(module, key, value) -> (key, value)
        model(input_ids=ids)                      # the model's own attention, on fn's

transformers >= 5 routes every attention of most model types through one function looked
up by name (its AttentionInterface). Inside `capture` the model attends through a function
registered there, which receives each layer's queries [B, H, T, K] and keys [B, G, T, K]
after their norms and RoPE, values [B, G, T, V], the additive or boolean mask (causal,
sliding window, chunks), the layer's `scaling`, `sliding_window`, logit `softcap` and
attention-sink logits `s_aux` where it has them. It computes

    P = softmax(softcap(q k^T * scaling) + mask  [, sink column dropped after])   # [B, H, T, T]

and returns P V itself, so the model's output is what eager attention gives (sinks and
soft-capping included), a block of query rows at a time: no [T, T] tensor unless the
caller keeps P.

Keys and queries before RoPE come from wrapping the modeling module's own rotary function
(apply_rotary_pos_emb and its variants) for the duration: its inputs are the keys before,
its outputs the keys after, matched to the interface's keys by their columns (partial
rotary rotates a slice, MLA a shared slice). The output projection W_O is the linear whose
input is the attention output [B, T, H*V], found by a forward pre-hook.

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
from dataclasses import dataclass, field

import torch
from torch import nn

# the names the capture and `transformed` register their attention functions under
CAPTURE_ATTENTION = "rankzoo_capture"
TRANSFORMED_ATTENTION = "rankzoo_transformed"
# query rows per block: a block of logits [B, H, rows, T] holds at most this many elements
CHUNK_ELEMENTS = 1 << 25
ROTARY_PREFIXES = ("apply_rotary_pos_emb", "apply_rotary_emb", "_apply_rotary_emb")


@dataclass
class AttentionCall:
    """One layer's attention call, as the interface received it."""

    module: nn.Module
    query: torch.Tensor  # [B, H, T, K] after norms and RoPE
    key: torch.Tensor  # [B, G, T, K]
    value: torch.Tensor  # [B, G, T, V]
    scaling: float
    window: int | None = None  # keys s > t - W seen by query t (the query included)
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H] sink logits, a column no value reads
    mask: torch.Tensor | None = None  # [B, 1, T, T] additive or boolean; None: causal
    query_pre: torch.Tensor | None = None  # [B, H, T, K] before RoPE (None: no RoPE seen)
    key_pre: torch.Tensor | None = None  # [B, G, T, K]
    probs: torch.Tensor | None = None  # [B, H, T, T], when the caller keeps it
    output: torch.Tensor | None = None  # [B, T, H, V] what the layer's W_O reads
    out_proj: nn.Module | None = field(default=None, repr=False)  # the module holding W_O

    @property
    def rope(self) -> bool:
        return self.key_pre is not None


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
    functions[name] = attention
    before = model.config._attn_implementation
    try:
        model.set_attn_implementation(name)
        yield before
    finally:
        model.set_attn_implementation(before)
        del functions[name]


# ---------------------------------------------------------------- attention, a block of rows

def _mask_rows(call: AttentionCall, rows: slice, Tk: int) -> torch.Tensor | None:
    """The additive mask of query rows `rows` [B or 1, 1, r, Tk], built causal (and
    windowed) when the model passed none."""
    if call.mask is not None:
        m = call.mask[:, :, rows, :Tk]
        if m.dtype == torch.bool:  # SDPA's convention: True where a key is seen
            return torch.zeros(m.shape, dtype=call.query.dtype, device=m.device).masked_fill(
                ~m, torch.finfo(call.query.dtype).min)
        return m
    T = call.query.shape[-2]
    t = torch.arange(rows.start, rows.stop, device=call.query.device)[:, None] + (Tk - T)
    s = torch.arange(Tk, device=call.query.device)[None, :]
    hidden = s > t
    if call.window is not None:
        hidden |= s <= t - call.window
    return torch.zeros(hidden.shape, dtype=call.query.dtype, device=hidden.device).masked_fill(
        hidden, torch.finfo(call.query.dtype).min)[None, None]  # [1, 1, r, Tk]


def probabilities(call: AttentionCall, rows: slice) -> torch.Tensor:
    """P of query rows `rows`, [B, H, r, Tk], as eager attention computes it."""
    H, G = call.query.shape[1], call.key.shape[1]
    k = call.key.repeat_interleave(H // G, dim=1)  # [B, H, Tk, K]
    logits = call.query[:, :, rows] @ k.transpose(-1, -2) * call.scaling  # [B, H, r, Tk]
    if call.softcap is not None:
        logits = torch.tanh(logits / call.softcap) * call.softcap
    mask = _mask_rows(call, rows, k.shape[-2])
    if mask is not None:
        logits = logits + mask
    if call.sinks is None:
        return torch.softmax(logits, dim=-1, dtype=torch.float32).to(call.query.dtype)
    sink = call.sinks.to(logits.dtype).reshape(1, H, 1, 1).expand(*logits.shape[:-1], 1)
    both = torch.cat([logits, sink], dim=-1)
    both = both - both.amax(dim=-1, keepdim=True)
    return torch.softmax(both, dim=-1, dtype=both.dtype)[..., :-1]  # the sink dropped


def row_blocks(call: AttentionCall) -> list[slice]:
    B, H, T, _ = call.query.shape
    r = max(1, CHUNK_ELEMENTS // max(1, B * H * call.key.shape[-2]))
    return [slice(i, min(i + r, T)) for i in range(0, T, r)]


def attend(call: AttentionCall, keep_probs: bool, fused: bool = False) -> torch.Tensor:
    """P V [B, T, H, V], a block of query rows at a time; P kept in call.probs if asked.
    `fused` (the matrix-free probe, masks as SDPA takes them): where P is not kept and
    torch's SDPA computes the same attention (no soft-capping, no sinks, a mask or pure
    causality), its fused kernel does, at a fraction of the time on long probes."""
    if fused and not keep_probs and _sdpa_serves(call):
        return _sdpa(call)
    H, G = call.query.shape[1], call.value.shape[1]
    v = call.value.repeat_interleave(H // G, dim=1)  # [B, H, Tk, V]
    outs, probs = [], []
    for rows in row_blocks(call):
        p = probabilities(call, rows)  # [B, H, r, Tk]
        outs.append(p.to(v.dtype) @ v)  # [B, H, r, V]
        if keep_probs:
            probs.append(p)
    if keep_probs:
        call.probs = torch.cat(probs, dim=-2)  # [B, H, T, Tk]
    return torch.cat(outs, dim=-2).transpose(1, 2).contiguous()  # [B, T, H, V]


def _sdpa_serves(call: AttentionCall) -> bool:
    square = call.query.shape[-2] == call.key.shape[-2]
    causal = call.mask is not None or (call.window is None and square)
    return call.softcap is None and call.sinks is None and causal


def _sdpa(call: AttentionCall) -> torch.Tensor:
    """SDPA's P V [B, T, H, V] under the call's mask (None: causal)."""
    H, G = call.query.shape[1], call.key.shape[1]
    k = call.key.repeat_interleave(H // G, dim=1)  # [B, H, Tk, K]
    v = call.value.repeat_interleave(H // G, dim=1)  # [B, H, Tk, V]
    out = torch.nn.functional.scaled_dot_product_attention(
        call.query, k, v, attn_mask=call.mask, is_causal=call.mask is None,
        scale=call.scaling)  # [B, H, T, V]
    return out.transpose(1, 2).contiguous()


# ---------------------------------------------------------------- RoPE, before and after

def _slice_at(after: torch.Tensor, rotated: torch.Tensor) -> int | None:
    """The first column of `after` [B, N, T, K] where `rotated` [B, n, T, r] (n = N or 1,
    broadcast over heads) sits, or None."""
    r, K = rotated.shape[-1], after.shape[-1]
    if after.shape[:1] != rotated.shape[:1] or after.shape[-2] != rotated.shape[-2]:
        return None
    if rotated.shape[1] not in (1, after.shape[1]):
        return None
    for start in dict.fromkeys((0, K - r)):
        if start >= 0 and torch.equal(after[..., start:start + r],
                                      rotated.expand(-1, after.shape[1], -1, -1)):
            return start
    return None


def before_rope(after: torch.Tensor, seen: list[tuple[torch.Tensor, torch.Tensor]]
                ) -> torch.Tensor | None:
    """`after` [B, N, T, K] with its rotated columns replaced by what went into RoPE, from
    the (input, output) pairs the rotary function saw; None when none of them is in it."""
    for before, rotated in reversed(seen):
        start = _slice_at(after, rotated)
        if start is not None:
            pre = after.clone()
            pre[..., start:start + rotated.shape[-1]] = before.expand(-1, after.shape[1], -1, -1)
            return pre
    return None


@contextlib.contextmanager
def _rotary_wrapped(modules: list[str], seen: list):
    """Each named modeling module's rotary functions wrapped to append (q in, q out) and
    (k in, k out) to `seen`; the originals restored on the way out."""
    saved = []
    for name in dict.fromkeys(modules):
        module = sys.modules.get(name)
        for attr in list(vars(module)) if module is not None else ():
            fn = getattr(module, attr)
            if attr.startswith(ROTARY_PREFIXES) and callable(fn) and "vision" not in attr:
                saved.append((module, attr, fn))
                setattr(module, attr, _recording(fn, seen))
    try:
        yield
    finally:
        for module, attr, fn in reversed(saved):
            setattr(module, attr, fn)


def _recording(fn: Callable, seen: list) -> Callable:
    def rotary(q, k, *args, **kwargs):
        out = fn(q, k, *args, **kwargs)
        if isinstance(out, tuple) and len(out) == 2:
            seen.extend([(q.detach(), out[0].detach()), (k.detach(), out[1].detach())])
        return out
    return rotary


# ---------------------------------------------------------------- W_O

def projection_weight(module: nn.Module) -> torch.Tensor | None:
    """A linear layer's weight as [out, in] (Conv1D stores [in, out]), else None."""
    if isinstance(module, nn.Linear):
        return module.weight
    w = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2:
        return w.T
    return None


@contextlib.contextmanager
def out_projections(calls: dict[nn.Module, AttentionCall], attention: list[nn.Module]):
    """Inside a capture (whose calls by module are `calls`): a pre-hook on every linear
    below each attention module; the one whose input is that module's attention output
    becomes its call's out_proj."""
    def hook(owner):
        def pre(module, args):
            call = calls.get(owner)
            if call is None or call.output is None or call.out_proj is not None or not args:
                return
            x = args[0]
            if isinstance(x, torch.Tensor) and x.numel() == call.output.numel() and \
                    torch.equal(x.reshape(call.output.shape), call.output):
                call.out_proj = module
        return pre

    handles = [m.register_forward_pre_hook(hook(a)) for a in attention
               for m in a.modules() if projection_weight(m) is not None]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------- the capture

def _call_from(module, query, key, value, mask, kwargs: dict) -> AttentionCall:
    scaling = kwargs.get("scaling")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    return AttentionCall(
        module, query, key, value,
        query.shape[-1] ** -0.5 if scaling is None else float(scaling),  # eager's default
        window=kwargs.get("sliding_window") or None, softcap=kwargs.get("softcap") or None,
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

    def attention(module, query, key, value, attention_mask, **kwargs):
        call = _call_from(module, query, key, value, attention_mask, kwargs)
        if seen:
            call.query_pre, call.key_pre = before_rope(query, seen), before_rope(key, seen)
            seen.clear()
        call.output = attend(call, keep_probs, fused=matfree)
        calls[module] = call
        on_call(call)
        return call.output, call.probs

    modules = [type(m).__module__ for m in model.modules()]
    with (attending_through(model, CAPTURE_ATTENTION, attention, matfree),
          _rotary_wrapped(modules, seen)):
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
