"""What an attention mask lets each query see, read from the mask itself: causal, a causal
window of W keys, or causal chunks of C tokens.

    band = mask_band(mask, T)    # Band(window=None, chunk=16); None: some other mask

A layer attends under the mask its model builds, whatever its config calls it: llama4's
chunked layers pass transformers' chunked causal mask and no keyword saying so. Reading
the mask tells the kind of any model that builds one. Query t sits at position
t + Tk - T (its keys' last), and sees keys from f(t) to its own position:

    causal      f(t) = 0
    window W    f(t) = max(0, p - W + 1)      (W keys, the query's own included)
    chunks C    f(t) = p // C * C             (chunks of C tokens from position 0)

A mask is read where it is one of these for every sequence of the batch alike (a padded
batch is not): a boolean mask (True where a key is seen) or an additive one (0 where seen,
below HIDDEN where not; any other value, a bias, makes it none of them). Chunks the
sequence does not reach (T <= C) read as causal: at this length they are. Nothing here
imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# an additive mask entry at or below this hides its key: exp(-1e4) is no weight in any
# dtype (code writes -inf, the dtype's min, -1e30 or -1e4 for "masked")
HIDDEN = -1e4
ROWS_ELEMENTS = 1 << 24  # mask entries compared at once


@dataclass(frozen=True)
class Band:
    """The keys each query sees: causal, within a window of W keys, or in its chunk of C."""

    window: int | None = None
    chunk: int | None = None


def _seen(mask: torch.Tensor) -> torch.Tensor | None:
    """[b, h, T, Tk] bool, True where a key is seen; None for an additive mask with biases."""
    if mask.dtype == torch.bool:
        return mask
    seen = mask > HIDDEN
    return seen if not bool(mask[seen].any()) else None


def _first_keys(p: torch.Tensor, band: Band) -> torch.Tensor:
    """The first key each query at positions p sees under `band`."""
    first = torch.zeros_like(p)
    if band.window is not None:
        first = (p - band.window + 1).clamp_min(0)
    if band.chunk is not None:
        first = torch.maximum(first, p // band.chunk * band.chunk)
    return first


def _agrees(seen: torch.Tensor, band: Band) -> bool:
    """seen [b, h, T, Tk] is `band`'s causal mask, a block of query rows at a time."""
    T, Tk = seen.shape[-2:]
    s = torch.arange(Tk, device=seen.device)
    rows = max(1, ROWS_ELEMENTS // max(1, seen[..., :1, :].numel()))
    for t0 in range(0, T, rows):
        p = torch.arange(t0, min(t0 + rows, T), device=seen.device)[:, None] + (Tk - T)
        want = (s <= p) & (s >= _first_keys(p, band))  # [r, Tk]
        if not torch.equal(seen[..., t0:t0 + rows, :], want.expand_as(seen[..., t0:t0 + rows, :])):
            return False
    return True


def mask_band(mask: torch.Tensor | None, T: int) -> Band | None:
    """The Band a mask [..., T, Tk] for T queries is (module docstring); None for any other
    mask, or no mask."""
    if mask is None or mask.dim() < 2 or mask.shape[-2] != T:
        return None
    seen = _seen(mask)
    if seen is None:
        return None
    seen = seen.reshape((1,) * (4 - seen.dim()) + tuple(seen.shape)) if seen.dim() < 4 else seen
    Tk = seen.shape[-1]
    # the first query whose first key is past 0: a window's W-th, a chunk's C-th position
    hides = ~seen[0, 0, :, 0]  # [T]: query t does not see key 0
    if not bool(hides.any()):
        return Band() if _agrees(seen, Band()) else None
    p0 = (Tk - T) + int(hides.nonzero()[0])
    if p0 == 0:
        return None  # the query at position 0 does not see itself: not causal
    return next((b for b in (Band(window=p0), Band(chunk=p0)) if _agrees(seen, b)), None)
