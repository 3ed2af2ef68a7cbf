"""The causal depthwise conv kernels; causal-conv1d's import stays inside its function."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu")


def _padded(x: torch.Tensor, width: int, initial_state) -> torch.Tensor:
    if initial_state is None:
        return F.pad(x, (width - 1, 0))  # [B, C, W-1+T]
    return torch.cat([initial_state.to(x.dtype), x], dim=-1)  # [B, C, W-1+T]


def _finish(y: torch.Tensor, xp: torch.Tensor, width: int, activation):
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"activation {activation!r} unknown; known: {list(ACTIVATIONS)}")
    return y, xp[..., xp.shape[-1] - (width - 1):]  # [B, C, T], [B, C, W-1]


def reference_conv(x, weight, bias, *, initial_state=None, activation=None):
    width, T = weight.shape[-1], x.shape[-1]
    xp = _padded(x, width, initial_state)
    y = sum(weight[:, i, None] * xp[..., i:i + T] for i in range(width))  # [B, C, T]
    if bias is not None:
        y = y + bias[:, None]
    return _finish(y, xp, width, activation)


def conv1d_conv(x, weight, bias, *, initial_state=None, activation=None):
    width = weight.shape[-1]
    xp = _padded(x, width, initial_state)
    y = F.conv1d(xp, weight[:, None, :], bias, groups=weight.shape[0])  # [B, C, T]
    return _finish(y, xp, width, activation)


def causal_conv1d_unsupported(spec) -> str | None:
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16, bf16 or fp32, got {spec.dtype}"
    if not 2 <= spec.width <= 4:
        return f"takes kernel widths 2 to 4, got {spec.width}"
    return None


def causal_conv1d_conv(x, weight, bias, *, initial_state=None, activation=None):
    from causal_conv1d import causal_conv1d_fn

    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} unknown; known: {list(ACTIVATIONS)}")
    width = weight.shape[-1]
    if initial_state is not None:
        # causal-conv1d takes initial states only with channel-last memory: x.stride(1) == 1
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
        initial_state = initial_state.to(x.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    y, state = causal_conv1d_fn(x, weight, bias, initial_states=initial_state,
                                return_final_states=True, activation=activation)
    return y, state[..., state.shape[-1] - (width - 1):]  # [B, C, T], [B, C, W-1]
