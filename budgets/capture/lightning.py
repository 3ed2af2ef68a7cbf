"""A captured call of linear attention under a per-head decay (MiniMax's lightning
attention): q, k, v per head and the decay rate, as the module's forward computed them.

    call = LightningCall(owner, q, k, v, slope, hidden=h, output=y, layer=module)
    M = call.exact()                               # [B, H, T, T] fp64
    y = call.readout(M @ call.values())            # what the module returned

Its mixing M[t, s] = q_t . k_s exp(-slope (t - s)) is an SSD scan's with every step dt = 1,
A = -slope, B = k and C = q (one group per head), so M, its past->future factors (rank
<= K) and its caps (state K x V per head, as zoo's linear block declares them with F = K)
are budgets/mixing/ssd.py's, not derived again here. `readout` applies what the module
applies after mixing (its norm, its sigmoid output gate on the layer's input, out_proj),
each through the module's own submodules, so that M is checked against the module's
output itself. Nothing here imports transformers; budgets/hf/hooked.py fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..budget import RankBudget
from ..mixing.ssd import ssd_caps, ssd_factors, ssd_mixing
from ..rank.factored import FactoredMixing
from .channels import linear_kind


@dataclass
class LightningCall:
    """One lightning-attention call: o = M v per head, then norm, gate and out_proj."""

    module: nn.Module | None
    q: torch.Tensor  # [B, H, T, K]
    k: torch.Tensor  # [B, H, T, K]
    v: torch.Tensor  # [B, H, T, V]
    slope: torch.Tensor  # [H] the per-token decay is exp(-slope)
    hidden: torch.Tensor | None = None  # [B, T, D] the layer's input (the output gate's)
    output: torch.Tensor | None = None  # [B, T, D] what the module returned
    layer: nn.Module | None = field(default=None, repr=False)  # norm, output_gate, out_proj

    kind_name = "lightning"
    unread = ("the decayed K^T V state and the layer's projections (linear attention: its "
              "mixing alone is measured)")

    def kind(self, moe: bool) -> dict:
        K = self.q.shape[-1]
        return linear_kind("lightning", f"lightning K={K}", moe, state=K)

    def _scan(self) -> tuple[torch.Tensor, ...]:
        """(dt, A, B, C) of the SSD scan computing the same mixing, fp64: dt [B, T, H] = 1,
        A [H] = -slope, B = k and C = q [B, T, H, K]."""
        q, k = (t.double().transpose(1, 2) for t in (self.q, self.k))  # [B, T, H, K]
        return torch.ones(q.shape[:3], dtype=q.dtype, device=q.device), \
            -self.slope.double(), k, q

    def exact(self) -> torch.Tensor:
        return ssd_mixing(*self._scan())  # [B, H, T, T] fp64

    def operator(self) -> FactoredMixing:
        return ssd_factors(*self._scan())

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        _, H, _, K = self.q.shape
        return ssd_caps(block, seq_len, d_model, H, self.v.shape[-1], K, params)

    def values(self) -> torch.Tensor:
        return self.v.double()  # [B, H, T, V]

    @torch.no_grad()
    def readout(self, mixed: torch.Tensor) -> torch.Tensor:
        """The module's output [B, T, D] from M v [B, H, T, V]."""
        B, H, T, V = mixed.shape
        o = mixed.transpose(1, 2).reshape(B, T, H * V).to(self.v.dtype)
        if self.layer is None:
            return o
        o = self.layer.norm(o)
        o = torch.sigmoid(self.layer.output_gate(self.hidden)) * o
        return self.layer.out_proj(o)

    def release(self) -> None:
        self.q = self.k = self.v = self.hidden = self.output = None
