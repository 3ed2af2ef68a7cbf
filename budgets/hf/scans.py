"""The exact SSD mixing of Mamba-2-family mixers in Hugging Face models (mamba2, bamba,
falcon_h1, granite hybrids, nemotron_h, zamba2), and of Mamba-1 selective scans (mamba,
falcon_mamba, jamba, zamba), captured in one forward.

    with capture_scans(model, on_scan):        # on_scan(call) sees each ScanCall
        model(input_ids=ids)
    M = ssd_mixing(call)                         # [B, Hs, T, T]

Each of those modeling modules calls its own `mamba2_chunk_scan(x, dt, A, B, C, chunk_size,
D, dt_bias, dt_softplus, dt_limit, ...)`; inside `capture_scans` it is wrapped for the
duration, and its arguments and output are kept. With dt = clamp(softplus(dt + dt_bias),
dt_limit), the scan computes y = M x + D x per head, where

    M[t, s] = C_t . B_s * exp(sum_{s < u <= t} A dt_u) * dt_s     (s <= t; 0 above)

which ssd_mixing rebuilds exactly (in eval mode: no initial state) through
budgets/mixing/ssd.py, where this matrix, its past->future factors and its caps are written
once. Mamba-1 mixers call
`mamba_selective_scan(x, dt, A, B, C, D, z, delta_bias, delta_softplus, ...)` with x
[B, Dc, T] and A [Dc, N] per channel and state entry: the call is held in the same form,
each channel a head of width 1 whose decay is exp(A[c, n] sum dt) per state entry n, and
the scan's output gated by silu(z). Nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..budget import RankBudget
from ..capture.running import running, wrapped_functions
from ..mixing import ssd
from ..rank.matfree import FactoredMixing

SCAN_NAMES = ("mamba2_chunk_scan", "mamba_selective_scan")


@dataclass
class ScanCall:
    """One SSD scan as the mixer called it."""

    module: nn.Module | None  # the mixer that called it (innermost module running)
    x: torch.Tensor  # [B, T, Hs, P] (Mamba-1: Hs = Dc channels, P = 1)
    dt: torch.Tensor  # [B, T, Hs] before bias, softplus and clamp
    A: torch.Tensor  # [Hs], or [Hs, N] per state entry (Mamba-1)
    B: torch.Tensor  # [B, T, Ng, N]
    C: torch.Tensor  # [B, T, Ng, N]
    D: torch.Tensor | None  # [Hs]
    dt_bias: torch.Tensor | None  # [Hs]
    dt_softplus: bool
    dt_limit: tuple[float, float]
    y: torch.Tensor | None = None  # [B, T, Hs, P] the scan's output
    gate: torch.Tensor | None = None  # [B, T, Hs, P] z: the output times silu(z) (Mamba-1)

    @property
    def state(self) -> int:
        return self.B.shape[-1]  # N

    @property
    def heads(self) -> int:
        return self.x.shape[2]  # Hs

    @property
    def groups(self) -> int:
        return self.B.shape[2]  # Ng: heads sharing one B, C read Hs / Ng each

    # ---- the Mixer protocol (budgets/capture/mixer.py)
    kind_name = "scan"

    def kind(self, moe: bool) -> dict:
        return ssd_kind(self, moe)

    def exact(self) -> torch.Tensor:
        return ssd_mixing(self)  # [B, Hs, T, T] fp64

    def operator(self) -> FactoredMixing:
        return factored_mixing(self)

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        return ssd_budget(self, seq_len, d_model, params, block)

    def release(self) -> None:
        """Kept whole: rebuild() and the tests read a scan's tensors after the forward."""


def step_sizes(call: ScanCall) -> torch.Tensor:
    """dt as the scan uses it, [B, T, Hs]: bias, softplus, clamp."""
    dt = call.dt.double()
    if call.dt_bias is not None:
        dt = dt + call.dt_bias.double()
    if call.dt_softplus:
        dt = F.softplus(dt)
    return dt.clamp(min=call.dt_limit[0], max=call.dt_limit[1])


def scan_inputs(call: ScanCall) -> tuple[torch.Tensor, ...]:
    """dt [B, T, Hs], A [Hs] or [Hs, N], B, C [B, T, Ng, N], all fp64: the scan's inputs as
    budgets/mixing/ssd.py takes them (fp64, so that M rebuilds the fp32 scan's output)."""
    return step_sizes(call), call.A.double(), call.B.double(), call.C.double()


def ssd_mixing(call: ScanCall) -> torch.Tensor:
    """M [B, Hs, T, T] in fp64: y = M x + D x per head (module docstring)."""
    return ssd.ssd_mixing(*scan_inputs(call))


def rebuild(call: ScanCall) -> torch.Tensor:
    """y [B, T, Hs, P] from M and D, fp64: what the scan returned, rebuilt."""
    x = call.x.double().transpose(1, 2)  # [B, Hs, T, P]
    y = ssd_mixing(call) @ x
    if call.D is not None:
        y = y + call.D.double()[None, :, None, None] * x
    y = y.transpose(1, 2)
    return y if call.gate is None else y * F.silu(call.gate.double())


def ssd_budget(call: ScanCall, seq_len: int, d_model: int, params: int,
               block: str) -> RankBudget:
    """One SSD mixer's caps as zoo's ssm block declares them (budgets/mixing/ssd.py)."""
    return ssd.ssd_caps(block, seq_len, d_model, call.heads, call.x.shape[-1], call.state,
                        params)


def factored_mixing(call: ScanCall) -> FactoredMixing:
    """M's past->future block as L R^T [B, Hs, T - T/2, N] x [B, Hs, T/2, N] (fp32)."""
    return ssd.ssd_factors(*scan_inputs(call))


def ssd_kind(call: ScanCall, moe: bool) -> dict:
    """An SSD mixer's kind: its state N and how many heads share one B, C."""
    sharing = call.heads // call.groups
    per_channel = " per channel" if call.A.dim() == 2 else ""  # Mamba-1: A [Dc, N]
    return {"attention": "ssm", "window": None, "rope": False, "softcap": None,
            "sinks": False, "moe": moe, "state": call.state, "heads_sharing": sharing,
            "label": f"SSM N={call.state}{per_channel}"}


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
