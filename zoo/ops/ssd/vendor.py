"""mamba-ssm's fused SSD kernel (`pip install rankzoo[cuda]`), CUDA only.

The import stays inside the function: mamba-ssm loads only on CUDA machines (its package
imports its CUDA extension on import, so an install without it is not available).
"""

from __future__ import annotations

import torch

from .spec import SSDSpec


def mamba_unsupported(spec: SSDSpec) -> str | None:
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16, bf16 or fp32, got {spec.dtype}"
    return None


def mamba_ssd(x, dt, A, B, C, *, initial_state=None, chunk_size: int = 64):
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    y, state = mamba_chunk_scan_combined(
        x.contiguous(), dt.contiguous(), A.float(), B.contiguous(), C.contiguous(),
        chunk_size, initial_states=initial_state, return_final_states=True)
    return y, state  # [B, T, H, P], [B, H, P, N]
