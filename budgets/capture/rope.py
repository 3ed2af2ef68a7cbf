"""Keys and queries before RoPE, recorded by wrapping a modeling module's rotary function.

    with rotary_recorded(["transformers.models.llama.modeling_llama"], seen):
        model(ids)                            # seen: (input, output) of each rotation
    key_pre = before_rope(call.key, seen)     # [B, G, T, K], None: no RoPE seen

For the duration, each named module's rotary functions (apply_rotary_pos_emb and its
variants) are wrapped: their inputs are the keys before, their outputs the keys after,
matched to a call's keys by their columns (partial rotary rotates a slice, MLA a shared
slice). Nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch

# the rotary functions of transformers, torchtitan and Meta's llama (apply_rotary_emb),
# litgpt (apply_rope)
ROTARY_PREFIXES = ("apply_rotary_pos_emb", "apply_rotary_emb", "_apply_rotary_emb", "apply_rope")


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
def rotary_recorded(modules: list[str], seen: list):
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
        elif isinstance(out, torch.Tensor) and isinstance(q, torch.Tensor) and \
                out.shape == q.shape:  # one tensor at a time: litgpt's apply_rope(x, cos, sin)
            seen.append((q.detach(), out.detach()))
        return out
    return rotary
