"""A KV head kept as a window: its W most recent keys and s sink tokens, nothing between.

    grid = window_grid(seq_len, length)               # the W tried: 16, 32, ... below both
    allowed = head_mask(T, H, G, {g: (W, s)}, None)   # [H, T, T] True where a key is read
    effects = window_effects(P, v, G, grid)           # per W: the output change, mass kept

A window head (StreamingLLM's attention sinks plus a recent band) caches min(W + s, T) of
a sequence's T tokens, each at full width: at --length T its bytes per token are that
share of a full head's, so a window saves nothing below W + s. Query t then reads keys
j <= t with j < s or j > t - W, renormalized over them (a model's own sink logit, as
gpt-oss has, stays in the denominator). A window applies to a KV head, so to every query
head of its GQA group. Layers that already have a window of their own (zoo's
sliding_window, Gemma 3's local layers, gpt-oss's banded ones) keep it: no other window
is offered there.

The candidates come from where each head's attention lies, measured on the calibration
batch (budgets/probe/heads.py head_stats: the mass on the first token, on the recent band;
here also the mass a window of W plus the sinks keeps, over the queries it binds, t >= W +
s): a window is offered for a KV head when its query heads keep at least MIN_KEPT of
their attention in it on average. Its loss is then predicted like every other choice
(allocation/sensitivity.py), from the change it makes to the attention output, P' v - P v.
"""

from __future__ import annotations

import torch

from budgets.advice.head_classes import HeadRules, classify_head
from budgets.probe.heads import head_stats

SINKS = 4  # s: StreamingLLM keeps the first four tokens
SMALLEST = 16  # the narrowest window tried; each next one doubles
MIN_KEPT = 0.75  # a window is a candidate where its heads keep this much attention


def window_grid(seq_len: int, length: int, sinks: int = SINKS) -> tuple[int, ...]:
    """W = 16, 32, ... with W + s below both the evaluated sequences' length (so the
    window really binds where the loss is measured) and --length T (so it saves bytes)."""
    out, w = [], SMALLEST
    while w + sinks < min(seq_len, length):
        out.append(w)
        w *= 2
    return tuple(out)


def window_allowed(T: int, W: int, sinks: int, device=None, Tk: int | None = None
                   ) -> torch.Tensor:
    """[T, Tk] True where query t (the last T of Tk positions) reads key j: j <= t and
    (j < sinks or j > t - W)."""
    Tk = T if Tk is None else Tk
    t = torch.arange(Tk - T, Tk, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    return (j <= t) & ((j < sinks) | (j > t - W))


def head_mask(T: int, H: int, G: int, windows: dict[int, tuple[int, int]],
              device=None, Tk: int | None = None) -> torch.Tensor:
    """[H, T, Tk] per query head: its KV head's window where `windows` ({g: (W, s)}) has
    one, else every key (the causal mask and any window of the layer's own apply beside)."""
    Tk = T if Tk is None else Tk
    out = torch.ones(H, T, Tk, dtype=torch.bool, device=device)
    n = H // G
    for g, (W, s) in windows.items():
        out[g * n:(g + 1) * n] = window_allowed(T, W, s, device, Tk)
    return out


def classes(stats: dict[str, list[float]]) -> list[str]:
    """Per query head its class by budgets/advice/head_classes.py's rules (no erank here,
    so never rank-1)."""
    rules = HeadRules()
    return [classify_head(f, d, e, None, rules) for f, d, e in
            zip(stats["first_token_mass"], stats["diagonal_mass"], stats["centered_energy"],
                strict=True)]


@torch.no_grad()
def window_effects(P: torch.Tensor, v: torch.Tensor, grid: tuple[int, ...],
                   sinks: int = SINKS) -> dict:
    """For attention P [B, H, T, T] (rows may sum below 1: a sink logit's share) over
    values v [B, H, T, V] per query head: {"delta": {W: P' v - P v [B, H, T, V]}, "kept":
    {W: [H] mean share of each query's attention the window keeps, over t >= W + s},
    "stats": head_stats(P)} (per query head)."""
    P, v = P.float(), v.float()
    T = P.shape[-1]
    full = P @ v  # [B, H, T, V]
    total = P.sum(-1)  # [B, H, T]
    out: dict = {"delta": {}, "kept": {}, "stats": head_stats(P)}
    for W in grid:
        M = window_allowed(T, W, sinks, P.device).to(P.dtype)  # [T, T]
        kept = P * M
        mass = kept.sum(-1)  # [B, H, T]
        # the sink logit's share stays in the denominator; computed apart so that a query
        # whose window holds almost none of its attention is renormalized, not divided
        # by the rounding of 1 - (total - mass)
        den = (mass + (1 - total).clamp(min=0)).clamp(min=1e-30)
        out["delta"][W] = (kept @ v) / den[..., None] - full
        binds = slice(W + sinks, T)
        share = mass[..., binds] / total[..., binds].clamp(min=1e-30)
        out["kept"][W] = share.double().mean((0, 2)).cpu()  # [H]
    return out
