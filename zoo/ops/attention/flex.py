"""FlexAttention (`torch.nn.attention.flex_attention`) with a block mask for the causal band.

The block mask lets the kernel skip whole tiles outside the band, so a window of W keys
costs O(T W) on CUDA. There it is compiled (`torch.compile(flex_attention)`, the documented
way to get the fused Triton kernel, with backward). On CPU FlexAttention has no backward at
all, so this backend serves CPU inference only (eager: it materializes the scores; a
comparison path, not a fast one) and refuses calls that need gradients.

The mask reads the query's absolute position (bottom-right alignment, offset Tk - Tq), the
window and the chunk from captured 0-d tensors, not Python ints, so that a compiled kernel
is reused across decode steps instead of being recompiled for every new key length.
Sink logits rescale the output by the rows' log-sum-exp the kernel returns (sinks.py);
that path is not differentiated here, so sinks are served for inference only.
"""

from __future__ import annotations

import functools
import warnings

import torch

from .sinks import rescale_by_lse
from .spec import AttnSpec

MIN_CUDA_HEAD_DIM = 16  # Triton's tl.dot needs tiles of at least 16


def flex_unsupported(spec: AttnSpec) -> str | None:
    if spec.sinks and spec.needs_grad:
        return "sink logits through the returned log-sum-exp: inference only (train with sdpa)"
    if spec.device_type == "cpu":
        if spec.needs_grad:
            return "FlexAttention has no backward on CPU: inference only (train with sdpa)"
        return None
    if spec.device_type != "cuda":
        return f"needs a CUDA device (or CPU for inference), got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16, bf16 or fp32 on CUDA, got {spec.dtype}"
    if min(spec.head_dim, spec.value_dim) < MIN_CUDA_HEAD_DIM:
        return (f"needs head dims >= {MIN_CUDA_HEAD_DIM} on CUDA, got K={spec.head_dim}, "
                f"V={spec.value_dim}")
    return None


@functools.lru_cache(maxsize=64)
def _block_mask(q_len: int, kv_len: int, window: int | None, device: torch.device,
                chunk: int | None = None):
    """Cached per (Tq, Tk, W, device, C); building one costs milliseconds (seconds the
    first time)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = torch.tensor(kv_len - q_len, device=device)  # query i sits at offset + i
    span = torch.tensor(window if window is not None else kv_len + 1, device=device)
    size = torch.tensor(chunk if chunk is not None else kv_len + 1, device=device)

    def band(b, h, q_idx, kv_idx):  # key 0 starts a chunk
        pos = q_idx + offset
        return (kv_idx <= pos) & (pos - kv_idx < span) & (kv_idx // size == pos // size)

    return create_block_mask(band, None, None, q_len, kv_len, device=device)


@functools.cache
def _kernel(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cuda":
        return torch.compile(flex_attention)
    return flex_attention


def flex_attention_fn(q, k, v, *, window: int | None, scale: float, chunk: int | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import AuxRequest

    q_len, kv_len = q.shape[-2], k.shape[-2]
    if window is not None and window >= kv_len:
        window = None  # every key is inside the window
    if chunk is not None and chunk >= kv_len:
        chunk = None  # one chunk holds every key
    block_mask = _block_mask(q_len, kv_len, window, q.device, chunk)
    aux = {} if sinks is None else {"return_aux": AuxRequest(lse=True)}
    with warnings.catch_warnings():
        # Eager (CPU) flex warns that it materializes the scores: known, it is inference-only.
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        out = _kernel(q.device.type)(q, k, v, block_mask=block_mask, scale=scale,
                                     enable_gqa=k.shape[1] != q.shape[1], **aux)
    if sinks is None:
        return out  # [B, H, Tq, V]
    o, aux_out = out
    return rescale_by_lse(o, aux_out.lse, sinks)  # [B, H, Tq, V]
