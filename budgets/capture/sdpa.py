"""Any model's attention, captured where it calls torch: `F.scaled_dot_product_attention`
under a torch function mode, each call attributed to the module that made it.

    with capture_sdpa(model, on_call) as cap:     # on_call(call) sees each AttentionCall
        model(tokens)
    cap.unread                                    # the calls it could not read, named

Most model code people write (nanoGPT's model.py, litgpt, torchtitan's model folders,
x-transformers with flash attention) attends through SDPA: inside the mode, each call's
queries [B, H, T, K], keys and values [B, G, Tk, K] (GQA by `enable_gqa`, or H = G), mask
or causal flag and scale are read into an AttentionCall, P computed from them when the
caller keeps it (budgets/capture/attention.py's engine), and SDPA's own output returned, so
the model computes exactly what it would. The module of a call is the innermost module
holding weights whose forward is running (budgets/capture/running.py), so a layer gets
the model's own module name and order, and its projections are found below it. Nothing
here imports transformers.

What it cannot read is named in `cap.unread`, never silently dropped: attention dropout
in training mode (P is random there), FlexAttention calls (their score_mod and block
mask are not evaluated), a mask SDPA would broadcast in a way the probe does
not (not [T, Tk] per batch or head), a call from no module of the model. A layer that
bypasses SDPA (a custom kernel) makes no call: the caller names layers without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .attention import AttentionCall, probabilities, row_blocks
from .masks import HIDDEN, mask_band
from .rope import before_rope, rotary_recorded
from .running import running

SDPA = F.scaled_dot_product_attention
# the operator FlexAttention calls: seen by the mode, named as unread
FLEX = getattr(getattr(torch.ops, "higher_order", None), "flex_attention", None)
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")


@dataclass
class SdpaCapture:
    """What one capture saw: the calls it read, and one line for each it could not."""

    calls: list[AttentionCall] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    by_module: dict = field(default_factory=dict)  # module -> its latest call


def _arguments(args: tuple, kwargs: dict) -> dict:
    got = dict(zip(SDPA_ARGS, args, strict=False)) | kwargs
    got.setdefault("attn_mask", None)
    return got


def _as_mask(mask: torch.Tensor | None, T: int, Tk: int, is_causal: bool):
    """SDPA's mask as AttentionCall keeps it, [B or 1, H or 1, T, Tk], or 0 (causal), or
    W (a causal window of W keys), or a string saying why it cannot be read. is_causal
    with T != Tk aligns SDPA's causal mask to the top left, unlike a decoder's cache: not
    read."""
    if mask is None and not is_causal:
        return "no causal mask and no mask: bidirectional attention"
    if mask is None and Tk != T:
        return f"is_causal with {T} queries over {Tk} keys (top-left aligned)"
    if mask is None:
        return 0  # causal
    if is_causal:
        return "both a mask and is_causal"
    if mask.dim() > 4 or tuple(mask.shape[-2:]) != (T, Tk):
        return f"a mask of shape {tuple(mask.shape)} for {T} queries over {Tk} keys"
    seen = mask if mask.dtype == torch.bool else mask > HIDDEN
    W = _band(seen, T, Tk) if mask.dtype == torch.bool or not mask[seen].any() else None
    if W is not None:
        return W  # causal (W = 0) or a causal window written out: read as such
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # [b, h, T, Tk]


def _band(seen: torch.Tensor, T: int, Tk: int) -> int | None:
    """0 when `seen` [..., T, Tk] is the causal mask, W when it is the causal window of W
    keys (the query included), else None."""
    causal = torch.ones(T, Tk, dtype=torch.bool, device=seen.device).tril(Tk - T)
    if torch.equal(seen, causal.expand_as(seen)):
        return 0
    W = int(seen.reshape(-1, T, Tk)[0, -1].sum())  # keys the last query row sees
    band = causal & ~torch.ones_like(causal).tril(Tk - T - W)
    return W if W and torch.equal(seen, band.expand_as(seen)) else None


def _kv_groups(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [B, G, T, K] from [B, H, T, K] that repeat each of G heads H / G
    times in a row, as code that expands GQA before SDPA passes them (repeat_kv): the
    model's own G heads are what it caches."""
    H = k.shape[1]
    for G in range(1, H):
        r = H // G
        if H % G or not torch.equal(k, k[:, ::r].repeat_interleave(r, dim=1)):
            continue
        if torch.equal(v, v[:, ::r].repeat_interleave(r, dim=1)):
            return k[:, ::r], v[:, ::r]
    return k, v


class _SdpaMode(TorchFunctionMode):
    def __init__(self, owned: set[nn.Module], stack: list, on_call: Callable,
                 cap: SdpaCapture, keep_probs: bool, matfree: bool, rotations: list):
        super().__init__()
        self.owned, self.stack, self.on_call = owned, stack, on_call
        self.cap, self.keep_probs, self.matfree = cap, keep_probs, matfree
        self.rotations = rotations  # (input, output) of each RoPE call since the last SDPA
        self.flex = 0  # FlexAttention calls seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is SDPA:
            self._read(_arguments(args, kwargs), out)
        elif func is FLEX:
            self.flex += 1  # named once the forward is over (this code may run traced)
        return out

    def _read(self, got: dict, out: torch.Tensor) -> None:
        # the innermost running module holding weights: a helper that only attends (an
        # Attend of x-transformers) has its projections in the module that called it
        module = next((m for m in reversed(self.stack) if next(m.parameters(), None)
                       is not None), self.stack[-1] if self.stack else None)
        where = type(module).__name__ if module is not None else "outside the model"
        q, k, v = got["query"], got["key"], got["value"]
        why = self._unreadable(got, module)
        mask = None if why else _as_mask(got["attn_mask"], q.shape[-2], k.shape[-2],
                                          bool(got.get("is_causal", False)))
        why = why or (mask if isinstance(mask, str) else None)
        # chunks of C written out as a mask (llama4's local layers): read as such
        band = mask_band(mask, q.shape[-2]) if isinstance(mask, torch.Tensor) else None
        chunk = band.chunk if band is not None else None
        if not why and self.matfree and isinstance(mask, torch.Tensor) and chunk is None:
            why = ("a mask other than causal, a window or chunks: measured exactly only, "
                   "below the matrix-free length")
        if why:
            self.cap.unread.append(f"{where}: {why}")
            return
        scale = got.get("scale")
        k, v = _kv_groups(k.detach(), v.detach())
        call = AttentionCall(module, q.detach(), k, v,
                             q.shape[-1] ** -0.5 if scale is None else float(scale),
                             window=mask or None if isinstance(mask, int) else None,
                             chunk=chunk,
                             mask=mask.detach() if isinstance(mask, torch.Tensor) else None)
        if self.rotations:  # keys and queries before RoPE, where a rotary function ran
            call.query_pre = before_rope(call.query, self.rotations)
            call.key_pre = before_rope(call.key, self.rotations)
            call.rotated = True
            self.rotations.clear()
        call.output = out.detach().transpose(1, 2)  # [B, T, H, V], as W_O reads it
        if self.keep_probs:
            call.probs = torch.cat([probabilities(call, rows) for rows in row_blocks(call)],
                                   dim=-2)  # [B, H, T, Tk]
        self.cap.calls.append(call)
        self.cap.by_module[module] = call
        self.on_call(call)

    def _unreadable(self, got: dict, module) -> str | None:
        q, k = got["query"], got["key"]
        if module is None or module not in self.owned:
            return "called from no module of the model"
        if got.get("dropout_p", 0.0) > 0:
            return f"dropout_p={got['dropout_p']} (attention dropout: P is random)"
        if q.dim() != 4 or k.dim() != 4:
            return f"query of shape {tuple(q.shape)}, key {tuple(k.shape)}: not [B, H, T, K]"
        if q.shape[1] % k.shape[1]:
            return f"{q.shape[1]} query heads over {k.shape[1]} key heads"
        return None


@contextlib.contextmanager
def capture_sdpa(model: nn.Module, on_call: Callable[[AttentionCall], None],
                 keep_probs: bool = False, matfree: bool = False):
    """Inside, every F.scaled_dot_product_attention call made while `model` runs is read
    into an AttentionCall (P kept when keep_probs) and passed to on_call; yields the
    SdpaCapture. `matfree`: the probe measures from queries and keys alone (causal, no
    other mask), so a call under any other mask is named rather than misread."""
    cap, stack, rotations = SdpaCapture(), [], []
    modules = [type(m).__module__ for m in model.modules()]
    with (running(model, stack), rotary_recorded(modules, rotations),
          _SdpaMode(set(model.modules()), stack, on_call, cap, keep_probs, matfree,
                    rotations) as mode):
        yield cap
    if mode.flex:
        cap.unread.append(f"{mode.flex} flex_attention call{'s' * (mode.flex > 1)}: "
                          f"FlexAttention's score_mod and block mask are not read")
