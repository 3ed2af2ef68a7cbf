"""Keys and queries before RoPE, recorded by wrapping a modeling module's rotary functions.

    with rotary_recorded(["transformers.models.llama.modeling_llama"], seen):
        model(ids)                            # seen: (input, output) of each rotation
    key_pre = before_rope(call.key, seen)     # [B, G, T, K]; None: not recovered

For the duration, each named module's rotary functions (ROTARY_PREFIXES: apply_rotary_pos_emb,
apply_rotary_emb and their variants) are wrapped, whatever their signature: (q, k, cos, sin)
and (xq, xk, freqs_cis) record two pairs, (x, cos, sin) one. A call's keys [B, N, T, K] are
then matched to a recorded output, read as the model may have laid it out:

- layout: [B, n, T, r] (heads second), [B, T, n, r] (tokens second: the rotation ran before
  the heads were moved, gemma4, llama4), [B, T, r] (one shared head); n = N, or 1 (MLA's
  rotary key, shared by every head);
- columns: the r rotated columns sit first or last of K (partial rotary, MLA's rope slice);
- a factor per token and head applied after the rotation (a weightless norm of each head's
  vector, llama4's qk_norm): the keys are the rotation's output scaled row by row. The keys
  before RoPE are still what went into the rotation (the projection's output there, as
  budgets/cache.py's Keys.PRE_ROPE means them);
- the rotation's column order: a rotation of interleaved pairs (x0, x1), (x2, x3), ... may
  write its output de-interleaved (longcat's, DeepSeek's apply_rotary_pos_emb_interleave).
  At position 0 every RoPE turns by no angle (at most a scale, YaRN's), so the first
  token's row says which input column each output column is; a rotation is also checked to
  scale every row's norm alike. Complex multiplication (llama4's freqs_cis) turns the same
  interleaved pairs in place.

What matches none of these is not recovered (None), never an error: the capture then says
the layer rotates (a rotary function ran for it) without its keys before the rotation.
Nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch

# the rotary functions of transformers, torchtitan and Meta's llama (apply_rotary_emb),
# litgpt (apply_rope)
ROTARY_PREFIXES = ("apply_rotary_pos_emb", "apply_rotary_emb", "_apply_rotary_emb", "apply_rope")
# relative agreement a match needs, in units of the dtype's resolution (fp32's at least: a
# rotation may compute in fp32 what an fp64 model holds, as llama4's does)
TOLERANCE_EPS = 16


def _heads_second(x: torch.Tensor, T: int) -> list[torch.Tensor]:
    """x as [B, n, T, r], each way its layout may be read: [B, n, T, r] as it is,
    [B, T, n, r] transposed, [B, T, r] as one head (both tried where n == T)."""
    if x.dim() == 3:
        return [x.unsqueeze(1)] if x.shape[1] == T else []
    if x.dim() != 4:
        return []
    return ([x] if x.shape[2] == T else []) + ([x.transpose(1, 2)] if x.shape[1] == T else [])


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """a == b up to the resolution of `dtype` (the model's), relative to b's largest entry."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    rtol = TOLERANCE_EPS * max(eps, torch.finfo(torch.float32).eps)
    a, b = a.detach().double(), b.detach().double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    return torch.allclose(a, b, rtol=rtol, atol=rtol * scale)


def _scaled(part: torch.Tensor, rotated: torch.Tensor) -> bool:
    """part = c * rotated, one factor c >= 0 per row (1 where they are equal)."""
    if torch.equal(part, rotated):
        return True
    part, rotated = part.detach(), rotated.detach()
    norm = torch.linalg.vector_norm(rotated.double(), dim=-1, keepdim=True)
    c = torch.linalg.vector_norm(part.double(), dim=-1, keepdim=True) / norm.clamp_min(1e-300)
    return _close(part, rotated.double() * c, part.dtype)


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)


def _column_order(before: torch.Tensor, rotated: torch.Tensor) -> torch.Tensor | None:
    """idx [r]: output column j of the rotation is input column idx[j], read from the
    first token (position 0, no angle); None where that row does not say, or where the
    rotation does not scale every row's norm alike (then it is no rotation)."""
    b, a = before.detach().double(), rotated.detach().double()
    nb = torch.linalg.vector_norm(b, dim=-1).flatten()
    na = torch.linalg.vector_norm(a, dim=-1).flatten()
    live = nb > 0
    if bool(live.any()):
        ratio = na[live] / nb[live]
        if not _close(ratio, ratio.mean().expand_as(ratio), before.dtype):
            return None
    first_in = _unit_rows(b[..., 0, :].reshape(-1, b.shape[-1]))  # [rows, r]
    first_out = _unit_rows(a[..., 0, :].reshape(-1, a.shape[-1]))
    r = first_in.shape[-1]
    if _close(first_out, first_in, before.dtype):
        return torch.arange(r, device=before.device)
    w = torch.randn(first_in.shape[0], generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64).to(first_in.device)
    idx = ((w @ first_in)[None, :] - (w @ first_out)[:, None]).abs().argmin(dim=1)  # [r]
    if len(set(idx.tolist())) != r or not _close(first_in[:, idx], first_out, before.dtype):
        return None
    return idx


def _placed(after: torch.Tensor, before: torch.Tensor, rotated: torch.Tensor
            ) -> torch.Tensor | None:
    """`after` [B, N, T, K] with its rotated columns replaced by the keys before the
    rotation (before, rotated: [B, n, T, r]), or None where `rotated` is not in it."""
    B, N, T, K = after.shape
    r = rotated.shape[-1]
    if rotated.shape[0] != B or rotated.shape[1] not in (1, N) or r > K \
            or before.shape != rotated.shape:
        return None
    rotated, before = rotated.expand(-1, N, -1, -1), before.expand(-1, N, -1, -1)
    for start in dict.fromkeys((0, K - r)):
        if not _scaled(after[..., start:start + r], rotated):
            continue
        order = _column_order(before, rotated)
        if order is None:
            return None
        pre = after.clone()
        pre[..., start:start + r] = before[..., order].to(after.dtype)
        return pre
    return None


def before_rope(after: torch.Tensor, seen: list[tuple[torch.Tensor, torch.Tensor]]
                ) -> torch.Tensor | None:
    """`after` [B, N, T, K] with its rotated columns replaced by what went into RoPE, from
    the (input, output) pairs the rotary functions saw (the latest first); None when none
    of them is recovered in it (module docstring)."""
    T = after.shape[-2]
    for before, rotated in reversed(seen):
        if before.shape != rotated.shape:
            continue
        for b, a in zip(_heads_second(before, T), _heads_second(rotated, T), strict=True):
            pre = _placed(after, b, a)
            if pre is not None:
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
        if isinstance(out, tuple) and len(out) == 2 and all(
                isinstance(t, torch.Tensor) for t in (q, k, *out)):
            seen.extend([(q.detach(), out[0].detach()), (k.detach(), out[1].detach())])
        elif isinstance(out, torch.Tensor) and isinstance(q, torch.Tensor) and \
                out.shape == q.shape:  # one tensor at a time: (x, cos, sin)
            seen.append((q.detach(), out.detach()))
        return out
    return rotary
