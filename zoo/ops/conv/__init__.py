"""Causal depthwise convolution (Mamba's short conv): one signature, several kernels.

    fn(x, weight, bias, *, initial_state=None, activation=None) -> (y, state)
        x [B, C, T], weight [C, W], bias [C] or None, initial_state [B, C, W-1] or None
        (the W-1 inputs before x; zeros when None), activation None or "silu"
        ->  y [B, C, T], state [B, C, W-1] (the last W-1 inputs, for the next call)

    y[:, c, t] = act(bias_c + sum_{i < W} weight[c, i] * x_padded[:, c, t + i])

Backends: `reference` (an explicit sum over the W taps), `conv1d` (torch's F.conv1d), and
`causal_conv1d` (Dao-AILab's causal-conv1d kernel, optional, CUDA only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import Backend, OpRegistry, always_available, import_probe
from .kernels import causal_conv1d_conv, causal_conv1d_unsupported, conv1d_conv, reference_conv


@dataclass(frozen=True)
class ConvSpec:
    """What a backend needs to know to say whether it can serve a call."""

    device_type: str
    dtype: torch.dtype
    width: int  # W
    needs_grad: bool

    @classmethod
    def of(cls, x: torch.Tensor, weight: torch.Tensor) -> ConvSpec:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        return cls(x.device.type, x.dtype, weight.shape[-1], needs_grad)


# causal_conv1d is opt-in (conv_backend="causal_conv1d") until its gpu-marked comparison
# with the reference has run and passed on a GPU: it has not yet.
CONV = OpRegistry("causal_conv", preference={
    "cuda": ["conv1d", "reference"],
    "cpu": ["conv1d", "reference"],
})

CONV.register(Backend("reference", reference_conv, always_available, lambda s: None))
CONV.register(Backend("conv1d", conv1d_conv, always_available, lambda s: None))
CONV.register(Backend("causal_conv1d", causal_conv1d_conv,
                      import_probe("causal_conv1d", "causal_conv1d_cuda"),
                      causal_conv1d_unsupported))

__all__ = ["CONV", "ConvSpec", "causal_conv1d_conv", "conv1d_conv", "reference_conv"]
