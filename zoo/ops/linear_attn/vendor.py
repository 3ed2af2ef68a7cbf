"""flash-linear-attention's chunked Triton kernel (`pip install rankzoo[cuda]`), CUDA only.

The import stays inside the function: fla's ops need Triton and a GPU.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

from .spec import LinearAttnSpec


def fla_unsupported(spec: LinearAttnSpec) -> str | None:
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16, bf16 or fp32, got {spec.dtype}"
    return None


@functools.cache
def _chunk_fn():
    from fla.ops.linear_attn import chunk_linear_attn

    takes_head_first = "head_first" in inspect.signature(chunk_linear_attn).parameters
    return chunk_linear_attn, takes_head_first


def fla_linear_attn(q, k, v, *, initial_state=None, chunk_size=None):
    chunk_linear_attn, takes_head_first = _chunk_fn()
    extra = {"head_first": False} if takes_head_first else {}
    Fd, V = q.shape[-1], v.shape[-1]
    # fla 0.6's 16-bit backward needs even K and V: pad with a zero feature / value column,
    # which changes no product, and slice it off again.
    pf, pv = Fd % 2, V % 2
    if pf:
        q, k = F.pad(q, (0, 1)), F.pad(k, (0, 1))
    if pv:
        v = F.pad(v, (0, 1))
    if initial_state is not None and (pf or pv):
        initial_state = F.pad(initial_state, (0, pv, 0, pf))
    # fla takes [B, T, H, *]; normalization is the block's (ones column), so normalize=False,
    # and the caller has already scaled q, so scale=1.
    o, state = chunk_linear_attn(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0,
        initial_state=initial_state, output_final_state=True, normalize=False, **extra)
    return o.transpose(1, 2)[..., :V], state[:, :, :Fd, :V]  # [B, H, T, V], [B, H, F, V]
