"""One SSD scan as a capture saw it (a Mamba-2 chunk scan, or a Mamba-1 selective scan held
in the same form), with its exact mixing, factors and caps through budgets/mixing/ssd.py.

    call = ScanCall(module, x, dt, A, B, C, D, dt_bias, dt_softplus, dt_limit)
    M = ssd_mixing(call)            # [B, Hs, T, T] fp64: y = M x + D x per head
    y = rebuild(call)               # [B, T, Hs, P] what the scan returned, rebuilt

With dt = clamp(softplus(dt + dt_bias), dt_limit), the scan computes y = M x + D x per
head, M[t, s] = C_t . B_s * exp(sum_{s < u <= t} A dt_u) * dt_s (s <= t). A Mamba-1 call
has A [Dc, N] per channel and state entry, each channel a head of width 1, and its output
gated by silu(z). The call is a Mixer (budgets/capture/mixer.py). Nothing here imports
transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..budget import RankBudget
from ..mixing import ssd
from ..rank.matfree import FactoredMixing


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
