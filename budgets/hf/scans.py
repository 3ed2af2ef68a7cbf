"""The exact SSD mixing of Mamba-2-family mixers in Hugging Face models (mamba2, bamba,
falcon_h1, granite hybrids, nemotron_h, zamba2), and of Mamba-1 selective scans (mamba,
falcon_mamba, jamba, zamba), captured in one forward.

    with capture_scans(model, on_scan):        # on_scan(call) sees each ScanCall
        model(input_ids=ids)
    M = ssd_mixing(call)                         # [B, Hs, T, T] (budgets/capture/scan.py)

Each of those modeling modules calls its own `mamba2_chunk_scan(x, dt, A, B, C, chunk_size,
D, dt_bias, dt_softplus, dt_limit, ...)`; inside `capture_scans` it is wrapped for the
duration, and its arguments and output are kept. With dt = clamp(softplus(dt + dt_bias),
dt_limit), the scan computes y = M x + D x per head, where

    M[t, s] = C_t . B_s * exp(sum_{s < u <= t} A dt_u) * dt_s     (s <= t; 0 above)

which budgets/capture/scan.py's ssd_mixing rebuilds exactly (in eval mode: no initial
state) through budgets/mixing/ssd.py, where this matrix, its past->future factors and its
caps are written once. Mamba-1 mixers call
`mamba_selective_scan(x, dt, A, B, C, D, z, delta_bias, delta_softplus, ...)` with x
[B, Dc, T] and A [Dc, N] per channel and state entry: the call is held in the same form,
each channel a head of width 1 whose decay is exp(A[c, n] sum dt) per state entry n, and
the scan's output gated by silu(z). Nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ..capture.running import running, wrapped_functions
from ..capture.scan import ScanCall

SCAN_NAMES = ("mamba2_chunk_scan", "mamba_selective_scan")


def _scan_call(module, args, kwargs) -> ScanCall:
    names = ("x", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias", "initial_states",
             "dt_softplus", "dt_limit")
    got = dict(zip(names, args, strict=False)) | kwargs
    return ScanCall(module, got["x"].detach(), got["dt"].detach(), got["A"].detach(),
                    got["B"].detach(), got["C"].detach(), _detached(got.get("D")),
                    _detached(got.get("dt_bias")), bool(got.get("dt_softplus", False)),
                    tuple(got.get("dt_limit", (0.0, float("inf")))))


def _selective_call(module, args, kwargs) -> ScanCall:
    """A Mamba-1 selective scan's arguments (x, dt, z [B, Dc, T]; B, C [B, N, T]) held as
    a ScanCall of Dc heads of width 1 sharing one B and C."""
    names = ("x", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus")
    got = dict(zip(names, args, strict=False)) | kwargs
    z = _detached(got.get("z"))
    return ScanCall(module, got["x"].detach().transpose(1, 2)[..., None],
                    got["dt"].detach().transpose(1, 2), got["A"].detach(),
                    got["B"].detach().transpose(1, 2)[:, :, None],
                    got["C"].detach().transpose(1, 2)[:, :, None], _detached(got.get("D")),
                    _detached(got.get("delta_bias")), bool(got.get("delta_softplus", False)),
                    (0.0, float("inf")),
                    gate=None if z is None else z.transpose(1, 2)[..., None])


# per scan function: its arguments as a ScanCall, its output [B, T, Hs, P] from what it returns
SCANS = {"mamba2_chunk_scan": (_scan_call, lambda y: y),
         "mamba_selective_scan": (_selective_call, lambda y: y.transpose(1, 2)[..., None])}


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else None


@contextlib.contextmanager
def capture_scans(model: nn.Module, on_scan: Callable[[ScanCall], None]):
    """Inside, every SSD scan of `model` runs as before, its ScanCall (output included)
    passed to on_scan; yields the list of calls made. The originals are restored after."""
    calls: list[ScanCall] = []
    stack: list[nn.Module] = []

    def wrap(fn, attr: str):
        held, output = SCANS[attr]

        def scan(*args, **kwargs):
            out = fn(*args, **kwargs)
            call = held(stack[-1] if stack else None, args, kwargs)
            if call.x.requires_grad or kwargs.get("initial_states") is not None:
                return out  # training or a cached state: not a prefill from zero
            call.y = output((out[0] if isinstance(out, tuple) else out).detach())
            calls.append(call)
            on_scan(call)
            return out
        return scan

    with running(model, stack), wrapped_functions(model, SCAN_NAMES, wrap):
        yield calls
