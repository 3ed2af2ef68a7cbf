"""A captured call of the delta rule (Gated DeltaNet, KDA): q, k, v, the gate and beta as
the recurrence reads them.

    call = DeltaCall(module, q, k, v, beta, log_gate, output=y)
    M = call.exact()                               # [B, H, T, T] fp64, shared by V channels
    y = call.readout(M @ call.values())            # the chunk function's output

The recurrence S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t mixes
every value channel of a head by one T x T matrix; its math (M, the past->future factors,
the caps) is budgets/mixing/delta.py's, read here, never re-derived. The source hands q and
k after whatever the kernel does to them first (L2 norms, the K^-1/2 scale of q, one copy
per value head), so M applies to v as it stands. A scalar log gate per head and token is
Gated DeltaNet's ("GDN"), one per key channel KDA's; none is DeltaNet's. Nothing here
imports transformers; budgets/hf/delta.py fills it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..budget import RankBudget
from ..mixing.delta import delta_caps, delta_factors, delta_mixing
from ..rank.factored import FactoredMixing
from .channels import linear_kind


@dataclass
class DeltaCall:
    """One delta-rule call from a zero state."""

    module: nn.Module | None
    q: torch.Tensor  # [B, H, T, K] as the recurrence reads it (normed, scaled)
    k: torch.Tensor  # [B, H, T, K]
    v: torch.Tensor  # [B, H, T, V]
    beta: torch.Tensor  # [B, H, T]
    log_gate: torch.Tensor | None = None  # [B, H, T] (GDN), [B, H, T, K] (KDA), None
    output: torch.Tensor | None = None  # [B, T, H, V] what the chunk function returned
    conv_state: int = 0  # elements the layer's short convolution caches beside the state
    sharing: int = 1  # value heads reading each query/key head (Gated DeltaNet's Hv / Hk)

    kind_name = "delta"
    unread = ("the delta-rule state, the short convolution before q, k, v and the layer's "
              "projections (a delta rule: its mixing alone is measured)")

    @property
    def variant(self) -> str:
        if self.log_gate is None:
            return "DeltaNet"
        return "GDN" if self.log_gate.dim() == 3 else "KDA"

    def kind(self, moe: bool) -> dict:
        K = self.k.shape[-1]
        return linear_kind("delta", f"{self.variant} K={K}", moe, state=K,
                           variant=self.variant, heads_sharing=self.sharing)

    def _args(self) -> tuple:
        return self.q, self.k, self.beta, self.log_gate

    def exact(self) -> torch.Tensor:
        return delta_mixing(*self._args())  # [B, H, T, T]

    def operator(self) -> FactoredMixing:
        f = delta_factors(*self._args())  # in q's dtype: fp64
        return FactoredMixing(f.L.float(), f.R.float())  # the spectra engine's dtype

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        _, H, _, K = self.k.shape
        return delta_caps(block, seq_len, d_model, H, K, self.v.shape[-1], params,
                          conv_state=self.conv_state)

    def values(self) -> torch.Tensor:
        return self.v.double()  # [B, H, T, V]

    def readout(self, mixed: torch.Tensor) -> torch.Tensor:
        return mixed.transpose(1, 2)  # [B, T, H, V], as the chunk function returns it

    def release(self) -> None:
        self.q = self.k = self.v = self.beta = self.log_gate = self.output = None
