"""Captured calls of token mixers that mix each channel on its own: a gated short
convolution (lfm2) and a diagonal linear recurrence (recurrent_gemma's RG-LRU).

    call = ConvCall(module, b, c, x, weight, bias, output=y, out_proj=layer.out_proj)
    M = call.exact()                                   # [B, Ch, T, T] fp64, per channel
    y = call.readout(M @ call.values())                # what the module returned

Each is a Mixer (budgets/capture/mixer.py) whose heads are channels: M per channel from
budgets/mixing/ (conv.py, recurrence.py), its past->future factors, its caps, and
`readout`, which turns M times the mixed values into what the capture saw the module
return, so that a test rebuilds the module's output from M alone. Nothing here imports
transformers; the sources that fill these calls are budgets/hf/hooked.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..budget import RankBudget
from ..mixing.conv import conv_caps, conv_factors, conv_mixing
from ..mixing.recurrence import recurrence_caps, recurrence_factors, recurrence_mixing
from ..rank.factored import FactoredMixing


def linear_kind(attention: str, label: str, moe: bool, **more) -> dict:
    """A kind for the report's per-kind table, with the keys an attention kind has."""
    return {"attention": attention, "window": None, "rope": False, "softcap": None,
            "sinks": False, "moe": moe, **more, "label": label}


@dataclass
class ConvCall:
    """One gated short convolution: y = out_proj(C * conv(B * x)) (bias inside conv)."""

    module: nn.Module | None
    b: torch.Tensor  # [B, Ch, T] the gate before the convolution
    c: torch.Tensor  # [B, Ch, T] the gate after it
    x: torch.Tensor  # [B, Ch, T] the mixed input
    weight: torch.Tensor  # [Ch, 1, L] the depthwise conv1d weight, as torch holds it
    bias: torch.Tensor | None = None  # [Ch]
    output: torch.Tensor | None = None  # [B, T, D] what the module returned
    out_proj: nn.Module | None = field(default=None, repr=False)

    kind_name = "conv"
    unread = ("the convolution's cached inputs and the layer's projections (a short "
              "convolution: its mixing alone is measured)")

    @property
    def width(self) -> int:
        return self.weight.shape[-1]  # L

    def kind(self, moe: bool) -> dict:
        return linear_kind("conv", f"short conv L={self.width}", moe, width=self.width)

    def exact(self) -> torch.Tensor:
        return conv_mixing(self.b, self.c, self.weight)  # [B, Ch, T, T] fp64

    def operator(self) -> FactoredMixing:
        return conv_factors(self.b, self.c, self.weight)

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        return conv_caps(block, seq_len, d_model, self.x.shape[1], self.width, params)

    def values(self) -> torch.Tensor:
        return self.x.double()[..., None]  # [B, Ch, T, 1]

    @torch.no_grad()
    def readout(self, mixed: torch.Tensor) -> torch.Tensor:
        """The module's output [B, T, D] from M x [B, Ch, T, 1]: the bias the convolution
        adds is gated by C too, then out_proj."""
        y = mixed[..., 0]  # [B, Ch, T]
        if self.bias is not None:
            y = y + self.c.double() * self.bias.double()[:, None]
        y = y.transpose(1, 2)  # [B, T, Ch]
        return y if self.out_proj is None else self.out_proj(y.to(self.x.dtype))

    def release(self) -> None:
        self.b = self.c = self.x = self.output = None


@dataclass
class RecurrenceCall:
    """One diagonal linear recurrence h_t = a_t h_{t-1} + b_t x_t per channel, from 0."""

    module: nn.Module | None
    log_a: torch.Tensor  # [B, Ch, T] log decay, -inf at a reset
    b: torch.Tensor  # [B, Ch, T] the input's scale (RG-LRU: i_t sqrt(1 - a_t^2))
    x: torch.Tensor  # [B, Ch, T] the mixed input
    name: str = "diagonal recurrence"  # the label the report groups by (RG-LRU)
    output: torch.Tensor | None = None  # [B, T, Ch] the recurrence's states h_t

    kind_name = "recurrence"
    unread = ("the recurrent state, the short convolution before the recurrence and the "
              "layer's projections (a diagonal recurrence: its mixing alone is measured)")

    def kind(self, moe: bool) -> dict:
        return linear_kind("recurrence", self.name, moe, state=1)

    def exact(self) -> torch.Tensor:
        return recurrence_mixing(self.log_a, self.b)  # [B, Ch, T, T] fp64

    def operator(self) -> FactoredMixing:
        return recurrence_factors(self.log_a, self.b)

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        return recurrence_caps(block, seq_len, d_model, self.x.shape[1], params)

    def values(self) -> torch.Tensor:
        return self.x.double()[..., None]  # [B, Ch, T, 1]

    def readout(self, mixed: torch.Tensor) -> torch.Tensor:
        return mixed[..., 0].transpose(1, 2)  # [B, T, Ch]: the states themselves

    def release(self) -> None:
        self.log_a = self.b = self.x = self.output = None
