"""Optional CUDA kernels from other packages (`pip install rankzoo[cuda]`).

Imports stay inside the functions: these packages load only on CUDA machines.
"""

from __future__ import annotations

import torch

from .reference import expand_kv
from .spec import AttnSpec


def no_options(spec: AttnSpec) -> str | None:
    """These kernels mask causally and by a window only: chunks and sinks are refused."""
    if spec.chunk is not None:
        return f"no chunk mask (chunk={spec.chunk}); sdpa, flex or the reference serve it"
    if spec.sinks:
        return "no sink logits; sdpa or the reference serve them"
    return None


def xformers_unsupported(spec: AttnSpec) -> str | None:
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    return no_options(spec)


def flash_attn_unsupported(spec: AttnSpec) -> str | None:
    if reason := no_options(spec):
        return reason
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16, got {spec.dtype}"
    if spec.head_dim > 256 or spec.head_dim != spec.value_dim:
        return f"needs equal head dims <= 256, got K={spec.head_dim}, V={spec.value_dim}"
    return None


def flash_attn_attention(q, k, v, *, window: int | None, scale: float, chunk: int | None = None,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    from flash_attn import flash_attn_func

    if chunk is not None or sinks is not None:
        raise ValueError("flash_attn serves neither chunks nor sinks (see no_options)")
    # flash-attn takes [B, T, H, K], aligns causality bottom-right and counts the window
    # as keys to the left of the query: W keys including self is (W - 1, 0).
    window_size = (-1, -1) if window is None else (window - 1, 0)
    o = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        softmax_scale=scale, causal=True, window_size=window_size)
    return o.transpose(1, 2)  # [B, H, Tq, V]


def xformers_attention(q, k, v, *, window: int | None, scale: float, chunk: int | None = None,
                       sinks: torch.Tensor | None = None) -> torch.Tensor:
    import xformers.ops as xops
    from xformers.ops import fmha

    if chunk is not None or sinks is not None:
        raise ValueError("xformers serves neither chunks nor sinks (see no_options)")
    if window is None:
        bias = fmha.attn_bias.LowerTriangularFromBottomRightMask()
    else:
        bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(window)
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])  # [B, H, Tk, *]
    o = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        attn_bias=bias, scale=scale)
    return o.transpose(1, 2)  # [B, H, Tq, V]
